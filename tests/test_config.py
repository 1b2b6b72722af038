"""TrainConfig is composed of the parts components take; every setting is still read, written and given by
its own name."""

import argparse
import dataclasses

import pytest

from neutronorch.cli import main
from neutronorch.cli.options import build_parser
from neutronorch.config import TrainConfig, setting_fields
from neutronorch.config_parts import (OPTION_SPEC, PARTS, NetworkConfig, NeutronOrchConfig, SamplingConfig,
                                      settings_of)
from neutronorch.errors import ConfigError


def test_settings_by_name_live_in_their_parts():
    config = TrainConfig(fanouts=[5, 3], super_batch=4, hidden=32, gpu_cache_gb=1.5, log_every=7)
    assert config.sampling.fanouts == [5, 3] and config.neutronorch.super_batch == 4
    assert config.network.hidden == 32 and config.placement.gpu_cache_gb == 1.5 and config.logging.log_every == 7
    config.epochs = 3  # written by name: the part is replaced, never changed in place
    before = config.optimization
    config.lr = 0.5
    assert config.optimization is not before and before.lr is None and config.optimization.epochs == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.sampling.seed = 4


def test_every_setting_belongs_to_one_place():
    names = [f.name for kind in PARTS.values() for f in settings_of(kind)]
    own = [f.name for f in dataclasses.fields(TrainConfig) if f.name not in PARTS]
    assert len(names + own) == len(set(names + own)) == len(TrainConfig.keys())
    assert not set(PARTS) & set(TrainConfig.keys())  # a part's name is never a setting's


def test_a_part_given_whole_and_settings_over_it():
    sampling = SamplingConfig(fanouts=[4], batch_size=16, seed=9)
    config = TrainConfig(sampling=sampling, batch_size=8)
    assert config.fanouts == [4] and config.seed == 9 and config.batch_size == 8 and sampling.batch_size == 16
    with pytest.raises(TypeError, match="unexpected keyword argument 'fanout'"):
        TrainConfig(fanout=[4])
    with pytest.raises(ConfigError, match="`sampling` .*expected a SamplingConfig"):
        TrainConfig(sampling={"fanouts": [4]}).validate()


def test_copies_share_nothing_they_could_change():
    config = TrainConfig(fanouts=[5, 3])
    copy = dataclasses.replace(config, mode="device", epochs=2, super_batch=2)
    assert (copy.mode, copy.epochs, copy.super_batch, copy.fanouts) == ("device", 2, 2, [5, 3])
    assert (config.mode, config.epochs, config.super_batch) == ("exact", 50, 8)
    copy.hidden = 8
    assert config.hidden == 256


def test_to_dict_is_flat_and_round_trips():
    config = TrainConfig(model="gcn", fanouts=[5, 3], staleness_bound=9, dataset="cora").validate()
    flat = config.to_dict()
    assert sorted(flat) == sorted(TrainConfig.keys()) and flat["staleness_bound"] == 9
    assert TrainConfig(**flat).validate() == config
    flat["fanouts"].append(1)  # a copy: the config's list is its own
    assert config.fanouts == [5, 3]


def test_validate_resolves_what_one_part_takes_from_another():
    # GCN's symmetric norm reads graph degrees: the sampling part says so once the config is validated.
    assert TrainConfig(model="gcn").validate().sampling.degrees
    assert not TrainConfig(model="gcn", gcn_norm="mean").validate().sampling.degrees
    assert not TrainConfig(model="sage").validate().sampling.degrees
    assert "degrees" not in TrainConfig.keys()  # resolved, never a setting
    assert TrainConfig(super_batch=3).validate().neutronorch.resolved_staleness == 5
    assert NeutronOrchConfig(super_batch=3, staleness_bound=7).resolved_staleness == 7


def test_defaults_are_the_parts_defaults():
    config = TrainConfig()
    for part, kind in PARTS.items():
        assert getattr(config, part) == kind()
    assert config.network == NetworkConfig() and config.model == "sage"


def test_weight_decay_defaults_to_the_tasks_and_keeps_a_given_one():
    from neutronorch.config import TASK_WEIGHT_DECAY

    assert TrainConfig().weight_decay is None  # resolved by validate, per task
    assert TrainConfig(task="node").validate().weight_decay == TASK_WEIGHT_DECAY["node"] == 5e-3
    assert TrainConfig(task="link").validate().weight_decay == TASK_WEIGHT_DECAY["link"] == 0.0
    assert TrainConfig(task="link", weight_decay=1e-4).validate().weight_decay == 1e-4
    assert TrainConfig(task="node", weight_decay=0.0).validate().weight_decay == 0.0
    with pytest.raises(ConfigError, match="weight_decay"):
        TrainConfig(weight_decay=-1.0).validate()
    with pytest.raises(ConfigError, match="weight_decay"):
        TrainConfig(weight_decay="lots").validate()


def test_a_link_task_gets_its_own_defaults_and_a_given_value_wins():
    from neutronorch.config import TASK_DEFAULTS

    names = ("dropout", "lr", "batch_size", "weight_decay")
    assert all(getattr(TrainConfig(), name) is None for name in names)  # resolved by validate, per task
    node, link = TrainConfig(task="node").validate(), TrainConfig(task="link").validate()
    # the node task's defaults are those its sweep chose (docs/accuracy.md); a link task's its own
    assert {name: getattr(node, name) for name in names} == TASK_DEFAULTS["node"] == {
        "dropout": 0.7, "lr": 0.003, "batch_size": 0, "weight_decay": 5e-3}
    assert {name: getattr(link, name) for name in names} == TASK_DEFAULTS["link"] == {
        "dropout": 0.3, "lr": 0.001, "batch_size": 1024, "weight_decay": 0.0}
    assert node.hidden == link.hidden == 256  # the same width suits both
    given = {"dropout": 0.7, "lr": 0.003, "batch_size": 0, "weight_decay": 5e-3}  # the node task's
    for name, value in given.items():  # a value given wins, the other task's default included
        assert getattr(TrainConfig(task="link", **{name: value}).validate(), name) == value
    given = {"dropout": 0.3, "lr": 0.001, "batch_size": 1024, "weight_decay": 0.0}  # the link task's
    for name, value in given.items():
        assert getattr(TrainConfig(task="node", **{name: value}).validate(), name) == value
    assert TrainConfig(task="link", dropout=0.5).validate().to_dict()["lr"] == TASK_DEFAULTS["link"]["lr"]
    with pytest.raises(ConfigError, match="`task` 'edges': choose one of"):
        TrainConfig(task="edges").validate()  # an unknown task is refused, not left with unset defaults


@pytest.mark.parametrize("seed", [-1, 2**64, 10**30])
def test_a_seed_outside_64_bits_is_refused_wherever_it_is_given(seed, tmp_path):
    """The run's seed, a config file's, a split's, generate's and a synthetic spec's: each a ConfigError naming
    the range, never a traceback from the generator or a seed wrapped into another."""
    from neutronorch.config_keys import load_config_file
    from neutronorch.data import SyntheticSpec, generate, load_dataset, synthetic_typed

    with pytest.raises(ConfigError, match=r"`seed` .*from 0 to 18446744073709551615 \(2\*\*64 - 1\)"):
        TrainConfig(seed=seed).validate()
    (tmp_path / "run.yaml").write_text(f"sampling:\n  seed: {seed}\n")
    with pytest.raises(ConfigError, match="2\\*\\*64 - 1"):
        TrainConfig(**load_config_file(tmp_path / "run.yaml")).validate()
    with pytest.raises(ConfigError, match="2\\*\\*64 - 1"):
        load_dataset("synthetic:nodes=200", "ratio:0.5,0.2", seed=seed)
    with pytest.raises(ConfigError, match="2\\*\\*64 - 1"):
        load_dataset(f"synthetic:nodes=200,seed={seed}")
    with pytest.raises(ConfigError, match="2\\*\\*64 - 1"):
        generate(SyntheticSpec(nodes=200, seed=seed))
    with pytest.raises(ConfigError, match="2\\*\\*64 - 1"):
        synthetic_typed(nodes=200, seed=seed)


def test_the_largest_seed_and_a_synthetic_specs_whole_numbers_are_kept_exactly():
    from neutronorch.data import SyntheticSpec

    assert TrainConfig(seed=2**64 - 1).validate().seed == 2**64 - 1
    assert SyntheticSpec.parse("synthetic:nodes=200,seed=12345678901234567891").seed == 12345678901234567891
    assert SyntheticSpec.parse("synthetic:nodes=2e3").nodes == 2000
    for bad, why in (("nodes=200.5", "not a whole number"), ("seed=1e30", "not a whole number"),
                     ("degree=nan", "not a finite number"), ("nodes=x", "not a number")):
        with pytest.raises(ConfigError, match=why):
            SyntheticSpec.parse(f"synthetic:{bad}")


def test_a_generators_rates_and_sizes_it_cannot_draw_are_refused_however_given():
    from neutronorch.data import SyntheticSpec, generate, synthetic_typed

    # generate's flags build the spec without parse: NaN and infinities must not pass the range checks
    for bad, why in ((dict(power=float("nan")), "power=nan is not a finite number"),
                     (dict(noise=float("inf")), "noise=inf is not a finite number"),
                     (dict(degree=1e30), "at most nodes - 1"), (dict(degree=1e-9), "at least one edge"),
                     (dict(power=400.0), "leaving no edges")):
        with pytest.raises(ConfigError, match=why):
            generate(SyntheticSpec(nodes=300, **bad))
    for bad, why in ((dict(degree=float("nan")), "degree=nan is not a finite number"),
                     (dict(degree=1e30), "at most nodes - 1")):
        with pytest.raises(ConfigError, match=why):
            synthetic_typed(nodes=300, **bad)
    assert generate(SyntheticSpec(nodes=40, degree=39, features=2, classes=2)).num_edges > 0
    with pytest.raises(ConfigError, match="its arrays do not fit in memory"):  # numpy refuses at once
        generate(SyntheticSpec(nodes=300, features=10**12))
    with pytest.raises(ConfigError, match="its arrays do not fit in memory"):
        synthetic_typed(nodes=300, features=10**12)


def test_generates_flags_are_named_as_such_not_as_a_dataset_spec(tmp_path, capsys):
    assert main(["generate", "synthetic", "--out", str(tmp_path / "g"), "--nodes", "300", "--power", "nan"]) == 2
    err = capsys.readouterr().err
    assert "error: generate synthetic: power=nan is not a finite number" in err and "dataset spec" not in err
    assert not (tmp_path / "g").exists()


def test_a_config_file_that_does_not_parse_is_named_on_one_line(tmp_path):
    from neutronorch.config_keys import read_config_mapping

    for name, text, where in (("tag.yaml", "epochs: !!python/object:os.system x\n", "line 1, column 9"),
                              ("open.yaml", "a: [1, 2\nb: 3\n", "line 2, column 2"),
                              ("tab.yaml", "a:\n\tb: 1\n", "line 2, column 1"),
                              ("bad.toml", "a = \n", "line 1, column 5")):
        (tmp_path / name).write_text(text)
        with pytest.raises(ConfigError, match="cannot be parsed") as caught:
            read_config_mapping(tmp_path / name)
        assert "\n" not in str(caught.value) and where in str(caught.value)


def test_a_config_files_value_of_the_wrong_type_is_refused_even_where_a_flag_replaces_it(tmp_path):
    (tmp_path / "run.yaml").write_text("epochs: [1, 2]\n")
    code = main(["train", "--dataset", "synthetic:nodes=300", "--epochs", "1", "--no-save",
                 "--config", str(tmp_path / "run.yaml")])
    assert code == 2  # refused before anything is loaded, never trained with the file's mistake unseen


def test_a_config_files_numbers_written_as_text_and_its_nulls(tmp_path):
    """PyYAML reads 1e-3 (no dot) as text: a float setting takes it as the number it reads as, a whole-number
    setting says how to write it. An empty section sets nothing, a null key keeps its default; neither is
    an unknown key."""
    from neutronorch.config_keys import load_config_file

    def read(text, name="run.yaml"):
        (tmp_path / name).write_text(text)
        return load_config_file(tmp_path / name, extra={"run_name": "outputs", "save": "outputs"})

    assert read("lr: 1e-3\noptimization:\n  weight_decay: 5e-4\n") == {"lr": 0.001, "weight_decay": 0.0005}
    assert read('{"lr": "2e-3", "network": null}', "run.json") == {"lr": 0.002}
    assert TrainConfig(**read("lr: 1e-3\n")).validate().lr == 0.001
    with pytest.raises(ConfigError, match=r"`epochs` '1e3': expected a whole number.*digits only \(1000\)"):
        TrainConfig(**read("epochs: 1e3\n")).validate()
    with pytest.raises(ConfigError, match=r"`lr` 'nan': expected a finite number, not a str\.$"):
        TrainConfig(**read("lr: nan\n")).validate()  # text, as YAML reads nan; not a finite number
    with pytest.raises(ConfigError, match=r"`lr` '1e-3'.*give it as a number \(1e-3, not quoted\)"):
        TrainConfig(lr="1e-3").validate()  # in Python a number is a number
    assert read("network:\nsampling:\n  fanouts: [3, 2]\nlogging: ~\n") == {"fanouts": [3, 2]}
    assert read("lr: ~\nno_progress: null\nrun_name:\nno-save: ~\nhidden: 8\n") == {"hidden": 8}
    defaults = TrainConfig(**read("lr: ~\nweight_decay: null\n")).validate()
    assert defaults.lr == TrainConfig().validate().lr and defaults.weight_decay == TrainConfig().validate().weight_decay
    with pytest.raises(ConfigError, match="earlier key sets too"):
        read("batch-size: ~\nbatch_size: 8\n")  # a null still counts as setting it
    with pytest.raises(ConfigError, match=r"'no_progress' 'yes': expected true or false"):
        read("no_progress: 'yes'\n")
    with pytest.raises(ConfigError, match=r"'network' is a section, not a setting.*not 5"):
        read("network: 5\n")


@pytest.mark.parametrize("field", ["batch_size", "epochs", "threads", "eval_batch_size"])
def test_a_count_beyond_64_bits_is_refused_not_overflowed(field):
    with pytest.raises(ConfigError, match=f"`{field}` {2**64}: too large; counts are 64-bit whole numbers"):
        TrainConfig(**{field: 2**64}).validate()


@pytest.mark.parametrize("field, value, message", [("prefetch", 2**62, "must be 1 to 1024 mini-batches ahead"),
                                                   ("threads", 2**62, "to 4096"), ("host_threads", 5000, "to 4096")])
def test_a_count_a_run_cannot_hold_is_refused_before_it_hangs(field, value, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**{field: value}).validate()


@pytest.mark.parametrize("settings, message", [
    (dict(hidden=2**62), "`hidden` 4611686018427387904: wider than a layer can be built here \\(at most 65536"),
    (dict(fanouts=[2**32, 2]), "a fanout above 2147483647 is more neighbours than a vertex can have"),
    (dict(fanouts=[5], eval_fanouts=[2**40]), "`eval_fanouts` \\[1099511627776\\]: a fanout above 2147483647"),
])
def test_a_size_no_model_or_sampler_can_take_is_refused_before_any_work(settings, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**settings).validate()
    TrainConfig(hidden=65536, fanouts=[2**31 - 1, -1]).validate()  # the largest still taken


def test_settings_given_names_those_off_their_defaults():
    config = TrainConfig(read_order="file", hot_error_budget=0.02, embedding_dir="tables")
    assert config.settings_given(["read_order", "hot_error_budget", "embedding_dir", "cache_policy"]) == [
        "`read_order` file", "`embedding_dir` tables"]


@pytest.mark.parametrize("name", [f.name for f in setting_fields() if f.metadata.get("choices")])
def test_a_setting_with_choices_refuses_a_value_outside_them_as_its_flag_does(name):
    """A setting's choices (its option) are what validate checks and what the command line offers."""
    with pytest.raises(ConfigError, match=f"`{name}` 'nope': choose one of "):
        TrainConfig(**{name: "nope"}).validate()
    with pytest.raises((SystemExit, argparse.ArgumentError)):
        build_parser().parse_args(["train", "--" + name.replace("_", "-"), "nope"])


def test_every_setting_has_its_option():
    """Each setting's field carries its help (and only the keys of an option), so its flag is made from it."""
    for f in setting_fields():
        assert f.metadata["help"] and set(f.metadata) <= {"resume", *OPTION_SPEC}



def test_a_misspelt_or_foreign_setting_name_gets_the_one_it_may_mean(tmp_path, capsys):
    from neutronorch.cli import main
    from neutronorch.config_keys import load_config_file

    (tmp_path / "run.yaml").write_text("learning_rate: 0.01\n")
    with pytest.raises(ConfigError, match=r"unknown key 'learning_rate'; did you mean lr\? Known keys"):
        load_config_file(tmp_path / "run.yaml")
    (tmp_path / "run.yaml").write_text("hiden: 8\n")
    with pytest.raises(ConfigError, match=r"unknown key 'hiden'; did you mean hidden\?"):
        load_config_file(tmp_path / "run.yaml")
    (tmp_path / "run.yaml").write_text("zzz: 8\n")
    with pytest.raises(ConfigError, match=r"unknown key 'zzz'\. Known keys"):
        load_config_file(tmp_path / "run.yaml")
    with pytest.raises(SystemExit):
        main(["train", "--hiden", "8", "--learning-rate", "0.1", "--zzz"])
    err = capsys.readouterr().err
    assert err.startswith("usage: neutronorch train")  # the command's usage, not the top level's
    assert "(--hiden: did you mean --hidden?; --learning-rate: did you mean --lr?)" in err
