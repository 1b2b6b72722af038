"""``--mode auto``: the rules on given facts and injected timings, how a run resolves it (log, summary,
checkpoint), that a resumed run keeps the mode it chose, and the measured probe on the CPU."""

import json
import logging

import pytest
import torch

from neutronorch import TrainConfig, train
from neutronorch.cli import main
from neutronorch.capabilities import MODES
from neutronorch.errors import ConfigError
from neutronorch.features.placement import GiB, plan_placement
from neutronorch.nn.models import GNN
from neutronorch.orchestration import choice as choice_module
from neutronorch.orchestration.choice import ModeFacts, choose_mode, mode_facts, probe_candidates
from neutronorch.orchestration.factory import Threads
from neutronorch.train import mode_choice
from neutronorch.train.checkpoint import load_checkpoint
from neutronorch.train.mode_choice import probe_modes, resolve_mode

SMALL = "synthetic:nodes=1500,degree=8,features=12,classes=4,noise=0.6"
SETTINGS = ["--dataset", SMALL, "--fanouts", "4,3", "--hidden", "16", "--batch-size", "64", "--no-progress",
            "--no-stage-table", "--eval-every", "-1"]
BEYOND = ModeFacts("cuda", "device", "cache", 0.1, 40.0, 16.0, 400, 5)  # a tenth of 40 GiB of features cached


def test_on_the_cpu_auto_is_exact_mode():
    picked = choose_mode(ModeFacts("cpu"))
    assert picked.chosen == "exact" and "training on the CPU" in picked.reason and "1.23x" in picked.reason
    assert picked.to_dict() == {"chosen": "exact", "reason": picked.reason, "measured": {"device": "cpu"}}
    assert probe_candidates(ModeFacts("cpu")) == ()  # the rules decide alone: nothing is measured


def test_on_a_gpu_the_rules_follow_the_placement_and_the_bottom_hop():
    fits = ModeFacts("cuda", "device", "device", 1.0, 2.0, 80.0, 400, 5)
    assert choose_mode(fits).chosen == "device" and "fit the GPU budget (80.0 GiB)" in choose_mode(fits).reason
    assert probe_candidates(fits) == ()
    assert probe_candidates(BEYOND) == ("device", "neutronorch")
    # Unmeasured (data parallel): NeutronOrch only with little cached and a heavy bottom hop.
    assert choose_mode(BEYOND).chosen == "device"  # 400-byte rows, fanout 5: as measured on the products graph
    wide = ModeFacts("cuda", "device", "cache", 0.1, 40.0, 16.0, 1024, 5)
    assert choose_mode(wide).chosen == "neutronorch" and "1024-byte rows" in choose_mode(wide).reason
    assert choose_mode(ModeFacts("cuda", "device", "cache", 0.1, 40.0, 16.0, 400, -1)).chosen == "neutronorch"
    assert choose_mode(ModeFacts("cuda", "device", "cache", 0.1, 40.0, 16.0, 400, 15)).chosen == "neutronorch"
    assert choose_mode(ModeFacts("cuda", "device", "cache", 0.3, 40.0, 16.0, 1024, 15)).chosen == "device"
    assert probe_candidates(ModeFacts("cuda", "device", "cache", 0.1, 40.0, 16.0, 1024, 5, distributed=True)) == ()
    # Measured: NeutronOrch only when at least 10% faster.
    faster = {"device": {"step_s": 0.010}, "neutronorch": {"step_s": 0.008}}
    picked = choose_mode(BEYOND, faster)
    assert picked.chosen == "neutronorch" and "8.0 ms per mini-batch against device mode's 10.0 ms" in picked.reason
    assert picked.measured["probe"] == faster and picked.measured["cached_share"] == 0.1
    close = {"device": {"step_s": 0.010}, "neutronorch": {"step_s": 0.0095}}
    assert choose_mode(BEYOND, close).chosen == "device" and "not 10% faster" in choose_mode(BEYOND, close).reason


def test_the_facts_on_a_gpu_are_device_mode_s_placement(monkeypatch):
    def placement_for(graph, config, device, samples_on_device, workspace, dtype):  # a 16 GiB GPU, no GPU needed
        return plan_placement(device="cuda", samples_on_device=samples_on_device, num_nodes=graph.num_nodes,
                              num_edges=graph.num_edges, indices_itemsize=8, feature_dim=graph.feature_dim,
                              workspace=workspace, device_memory=16 * GiB, gpu_memory_gb=config.gpu_memory_gb,
                              gpu_cache_gb=config.gpu_cache_gb, row_itemsize=dtype.itemsize)

    class Graph:
        num_nodes, num_edges, feature_dim, num_classes = 100_000_000, 10_000, 512, 4

    monkeypatch.setattr(choice_module, "placement_for", placement_for)
    cfg = TrainConfig(mode="auto", fanouts=[10, 5], batch_size=256).validate()
    facts = mode_facts(cfg, Graph(), torch.device("cuda"))
    assert facts.device == "cuda" and facts.features == "cache" and not facts.fits
    assert 0 < facts.cached_share < 0.1 and facts.row_bytes == 2048 and facts.bottom_fanout == 5
    assert facts.feature_gib == pytest.approx(100_000_000 * 2048 / GiB, rel=1e-3) and facts.budget_gib == 16.0
    assert choose_mode(facts).chosen == "neutronorch"


def test_resolving_auto_sets_the_mode_logs_once_and_injects_timings(monkeypatch, caplog):
    monkeypatch.setattr(mode_choice, "mode_facts", lambda *args: BEYOND)
    asked = []

    def probe(config, graph, device, model, threads, names):
        asked.append(names)
        return {"device": {"step_s": 0.02}, "neutronorch": {"step_s": 0.01}}

    cfg = TrainConfig(mode="auto").validate()
    with caplog.at_level(logging.INFO, logger="neutronorch"):
        picked = resolve_mode(cfg, None, torch.device("cpu"), Threads(1, 1, 1), None, probe=probe)
    assert cfg.mode == picked.chosen == "neutronorch" and asked == [("device", "neutronorch")]
    lines = [r.message for r in caplog.records if r.message.startswith("mode auto:")]
    assert lines == [f"mode auto: neutronorch ({picked.reason})"]
    given = TrainConfig(mode="device").validate()
    assert resolve_mode(given, None, torch.device("cpu"), Threads(1, 1, 1), None, probe=probe) is None
    assert given.mode == "device" and len(asked) == 1


def test_data_parallel_ranks_train_in_rank_0_s_mode():
    class World:  # rank 1 of 2, rank 0 having chosen device mode
        distributed, main = True, False

        def all_reduce_(self, tensor, what):
            tensor += MODES.index("device") + 1
            return tensor

    cfg = TrainConfig(mode="auto").validate()
    picked = resolve_mode(cfg, None, torch.device("cpu"), Threads(1, 1, 1), None, World())
    assert cfg.mode == picked.chosen == "device" and picked.reason == "rank 0's choice (this rank's: exact)"


def test_auto_is_a_mode_setting_and_others_are_refused():
    assert TrainConfig(mode="auto").validate().mode == "auto"
    with pytest.raises(ConfigError, match="choose one of exact, device, neutronorch, auto"):
        TrainConfig(mode="fastest").validate()


@pytest.mark.slow
def test_a_run_says_which_mode_auto_chose_and_a_resumed_run_keeps_it(tmp_path, capsys):
    out = tmp_path / "ck"
    args = ["train", "--mode", "auto", "--checkpoint-dir", str(out)] + SETTINGS
    assert main(args + ["--epochs", "1", "--summary-json", str(tmp_path / "a.json")]) == 0
    log = capsys.readouterr().err
    assert "mode auto: exact (training on the CPU" in log and "mode exact, model sage" in log
    summary = json.loads((tmp_path / "a.json").read_text())
    assert summary["mode"] == "exact" and summary["config"]["mode"] == "exact"
    assert summary["mode_choice"]["chosen"] == "exact" and summary["mode_choice"]["reason"].startswith("training")
    assert load_checkpoint(out / "last.pt").config.mode == "exact"  # the checkpoint holds the concrete mode
    assert main(args + ["--epochs", "2", "--resume", "--summary-json", str(tmp_path / "b.json")]) == 0
    resumed = json.loads((tmp_path / "b.json").read_text())
    assert resumed["mode"] == "exact" and len(resumed["epochs"]) == 2
    assert resumed["mode_choice"]["reason"].startswith("resumed in the mode the run chose: training on the CPU")
    given_run = train(TrainConfig(dataset=SMALL, mode="exact", fanouts=[4, 3], hidden=16, batch_size=64, epochs=1,
                                  eval_every=-1, progress=False))
    assert given_run["mode_choice"] is None  # a mode given is not a choice
    assert given_run["epochs"][0]["train_loss"] == summary["epochs"][0]["train_loss"]  # auto trains as its mode


@pytest.mark.slow
def test_a_resumed_auto_run_keeps_its_mode_where_the_rules_would_now_choose_another(tmp_path, monkeypatch, capsys):
    out = tmp_path / "ck"
    with monkeypatch.context() as patched:  # a GPU-like choice, measured: device mode (which runs on the CPU too)
        patched.setattr(mode_choice, "mode_facts", lambda *args: BEYOND)
        patched.setattr(mode_choice, "probe_modes", lambda *args, **kwargs: {"device": {"step_s": 0.01},
                                                                    "neutronorch": {"step_s": 0.02}})
        first = train(TrainConfig(dataset=SMALL, mode="auto", fanouts=[4, 3], hidden=16, batch_size=64, epochs=1,
                                  eval_every=-1, progress=False, checkpoint_dir=str(out)))
    assert first["mode"] == "device" and first["mode_choice"]["measured"]["probe"]["device"]["step_s"] == 0.01
    resumed = train(TrainConfig(dataset=SMALL, mode="auto", fanouts=[4, 3], hidden=16, batch_size=64, epochs=2,
                                eval_every=-1, progress=False, checkpoint_dir=str(out), resume=True))
    assert resumed["mode"] == "device" and resumed["config"]["mode"] == "device"  # not exact, as on the CPU now
    assert resumed["mode_choice"]["measured"] == first["mode_choice"]["measured"]
    # Resumed with another mode given, the run is refused as any other change of mode is.
    args = ["train", "--mode", "exact", "--checkpoint-dir", str(out), "--resume", "--epochs", "3"] + SETTINGS
    assert main(args) == 2
    assert "--mode 'device' then, 'exact' now" in capsys.readouterr().err


@pytest.mark.slow
def test_the_probe_times_each_mode_on_a_copy_and_leaves_the_run_untouched():
    from neutronorch.data import SyntheticSpec, generate

    graph = generate(SyntheticSpec(nodes=1500, degree=8, features=12, classes=4, noise=0.6))
    cfg = TrainConfig(dataset="given", mode="auto", fanouts=[4, 3], hidden=16, batch_size=32, epochs=3,
                      super_batch=2, progress=False).validate()
    torch.manual_seed(0)
    model = GNN("sage", graph.feature_dim, 16, graph.num_classes, 2)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    timings = probe_modes(cfg, graph, torch.device("cpu"), model, Threads(1, 1, 1), MODES, steps=2)
    assert set(timings) == set(MODES)
    for name, measured in timings.items():
        assert measured["step_s"] > 0 and measured["steps"] == 2 and measured["lanes"]["trainer"] > 0, name
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert torch.equal(rng, torch.get_rng_state()) and cfg.mode == "auto" and cfg.epochs == 3


def test_on_the_cpu_auto_refuses_neutronorch_settings_before_reading_any_data(tmp_path, monkeypatch, capsys):
    """Auto trains exact mode on the CPU, which would ignore them: refused with the mode, its reason and the fix,
    before the data is read or a run folder made."""
    from neutronorch.train import trainer

    def unread(*args, **kwargs):
        raise AssertionError("the data was read")

    monkeypatch.setattr(trainer, "load_dataset", unread)
    monkeypatch.chdir(tmp_path)
    args = ["train", "--mode", "auto", "--device", "cpu", "--run-name", "x"] + SETTINGS
    assert main(args + ["--hot-ratio", "0.3", "--super-batch", "4"]) == 2
    err = capsys.readouterr().err
    assert ("--super-batch 4, --hot-ratio 0.3: NeutronOrch mode's, and --mode auto chose exact mode, which would "
            "ignore them (training on the CPU: exact mode by rule, not measured.") in err, err
    assert err.rstrip().endswith("1.23x). Give --mode neutronorch to use them, or leave them out."), err
    assert not (tmp_path / "runs").exists()
    with pytest.raises(ConfigError, match=r"^`hot_ratio` 0.3: NeutronOrch mode's, and `mode` auto chose exact mode"):
        train(TrainConfig(dataset=SMALL, mode="auto", device="cpu", hot_ratio=0.3))


def test_auto_refuses_neutronorch_settings_as_soon_as_it_chose_another_mode(monkeypatch):
    """On a GPU the choice needs the graph (and perhaps a probe): the settings are refused once it is made, before
    training, naming the mode chosen and why; when it chose NeutronOrch they are used."""
    import numpy as np

    from neutronorch.data import Graph

    monkeypatch.setattr(mode_choice, "mode_facts", lambda *args: BEYOND)
    measured = {"device": {"step_s": 0.01}, "neutronorch": {"step_s": 0.02}}
    cfg = TrainConfig(mode="auto", hot_ratio=0.3).validate()
    with pytest.raises(ConfigError, match=r"`hot_ratio` 0.3: NeutronOrch mode's, and `mode` auto chose device mode, "
                                          r"which would ignore it \(.*measured NeutronOrch at 20.0 ms per mini-batch "
                                          r".*\)\. Give `mode` neutronorch to use it, or leave it out\."):
        resolve_mode(cfg, None, torch.device("cuda"), Threads(1, 1, 1), None, probe=lambda *args: measured)
    faster = {"device": {"step_s": 0.02}, "neutronorch": {"step_s": 0.01}}
    cfg = TrainConfig(mode="auto", hot_ratio=0.3).validate()
    assert resolve_mode(cfg, None, torch.device("cuda"), Threads(1, 1, 1), None,
                        probe=lambda *args: faster).chosen == "neutronorch"
    # A graph with times: exact mode, wherever it trains.
    cfg = TrainConfig(mode="auto", snapshot_lead=1).validate()
    timed = Graph.from_arrays([0, 1, 2], [1, 2, 0], np.zeros((10, 2)), np.arange(10) % 2, node_time=np.arange(10.0))
    with pytest.raises(ConfigError, match=r"`snapshot_lead` 1: NeutronOrch mode's, and `mode` auto chose exact mode, "
                                          r"which would ignore it \(a graph with times is sampled by time"):
        resolve_mode(cfg, timed, torch.device("cuda"), Threads(1, 1, 1), None)
    # Resumed: the checkpoint's mode, and its settings (which a resumed run may not change) are checked against it.
    cfg = TrainConfig(mode="auto", host_threads=1).validate()
    with pytest.raises(ConfigError, match=r"`host_threads` 1: .* auto chose exact mode, which would ignore it "
                                          r"\(resumed in the mode the run chose: training on the CPU"):
        resolve_mode(cfg, None, torch.device("cuda"), Threads(1, 1, 1), None,
                     resumed={"config": {"mode": "exact"}, "mode_choice": choose_mode(ModeFacts("cpu")).to_dict()})
