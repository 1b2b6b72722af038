"""What runs (capabilities.py): every cell of graph kind x mode x task passes the check a run makes when it
starts, and every setting a kind or a mode cannot honour is refused by it, without training."""

from itertools import product

import pytest

from neutronorch.capabilities import (KINDS, LOADER_MODES, LOADER_REFUSED, MODE_CHOICES, MODE_ONLY, OWN_MODULE_REFUSED,
                                      TASKS, UNHONOURED, check_run)
from neutronorch.config import TrainConfig
from neutronorch.config_parts import LinkConfig, settings_of
from neutronorch.errors import ConfigError
from neutronorch.loader.arguments import check_mode

CELLS = list(product(KINDS, MODE_CHOICES, TASKS))
# A value other than the default for every setting the table names.
GIVEN = {"link_head": "mlp", "negatives": 4, "eval_negatives": 5, "link_direction": "directed",
         "link_relation": "cites", "hot_error_budget": 0.1, "hot_set": "node", "device_sampling": "on",
         "gpu_cache_gb": 1.0,
         "cache_policy": "degree", "read_order": "file", "host_cache_gb": 1.0, "host_cache_dir": "cold",
         "architecture": "blocks", "residual": True, "norm": "layer", "split": "ratio:0.5,0.2",
         "embedding_storage": "mmap", "embedding_dir": "tables"}


@pytest.mark.parametrize("kind, mode, task", CELLS, ids=lambda v: str(v))
def test_every_cell_runs(kind, mode, task):
    """Both kinds of graph train every task in every mode, on one rank and on several (no check reads it)."""
    check_run(TrainConfig(mode=mode, task=task).validate(), kind)


@pytest.mark.parametrize("rule", UNHONOURED, ids=lambda rule: f"{rule[0]}-{rule[1][0]}")
def test_each_setting_a_kind_cannot_honour_is_refused_and_the_other_kind_takes_it(rule):
    """A "typed node" rule's settings are a typed link task's; a link setting goes to the other kind's link task."""
    (kind, _, task), names, values, why = rule[0].partition(" "), *rule[1:]
    other = next(k for k in KINDS if k != kind)
    for name in names:
        mode = {"mode": "neutronorch"} if name in MODE_ONLY[0][1] else {}  # used in that mode only
        given = {name: values[0] if values else GIVEN[name], **mode}
        with pytest.raises(ConfigError, match=f"`{name}`"):
            check_run(TrainConfig(**given).validate(), kind)
        link = task == "node" or name in {f.name for f in settings_of(LinkConfig)}
        check_run(TrainConfig(**given, **({"task": "link"} if link else {})).validate(),
                  kind if task == "node" else other)


def test_the_loaders_and_your_own_module_refuse_the_modes_the_table_names():
    for mode in LOADER_MODES:
        assert check_mode(mode) == mode
    for mode, reason in LOADER_REFUSED.items():
        with pytest.raises(ConfigError) as refused:
            check_mode(mode)
        assert str(refused.value) == reason
    from neutronorch.train.heterogeneous import check_own_model_config
    for (kind, mode), reason in OWN_MODULE_REFUSED.items():
        with pytest.raises(ConfigError) as refused:
            check_own_model_config(TrainConfig(mode=mode).validate())
        assert str(refused.value).startswith(reason)
    check_own_model_config(TrainConfig(mode="auto").validate())


def test_a_prediction_refuses_what_its_kind_of_graph_cannot_honour_and_takes_the_rest():
    from neutronorch.capabilities import check_prediction

    check_prediction("typed", scratch_dir="auto", fanouts=[-1, 5], node_type="author")
    check_prediction("typed", scratch_dir=None)
    check_prediction("homogeneous", scratch_dir="/scratch", fanouts=None, node_type=None)
    with pytest.raises(ConfigError, match="`scratch_dir` /scratch: a typed graph's predictions hold their rows in "
                                          "memory"):
        check_prediction("typed", scratch_dir="/scratch")
    with pytest.raises(ConfigError, match="`node_type` author: for a typed graph's checkpoint"):
        check_prediction("homogeneous", node_type="author")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODE_CHOICES)
def test_neutronorch_settings_are_refused_in_the_modes_that_ignore_them(kind, mode):
    """`--hot-ratio 0.3 --host-threads 1` with mode exact or device would be ignored: refused, naming them; with
    neutronorch they are used, with auto the run chooses (on a typed graph auto always runs exact: refused; on a
    homogeneous one they are refused once it picks another mode: test_mode_auto.py)."""
    config = TrainConfig(mode=mode, hot_ratio="0.3", host_threads=1).validate()
    named = {"exact": "exact", "device": "device", "auto": r"auto \(which runs exact on a typed graph\)"}
    if mode in ("exact", "device") or (mode == "auto" and kind == "typed"):
        with pytest.raises(ConfigError, match=rf"`hot_ratio` 0.3, `host_threads` 1: NeutronOrch mode's, and "
                                              rf"`mode` {named[mode]} would ignore them; give `mode` neutronorch"):
            check_run(config, kind)
    else:
        check_run(config, kind)
    check_run(TrainConfig(mode=mode).validate(), kind)  # the defaults are given to every mode
