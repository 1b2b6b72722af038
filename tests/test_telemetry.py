"""Stage spans, utilisation, data counters, the per-epoch table, the timeline picture and the metric logs."""

import csv
import errno
import json
import logging
import os
import threading
import time
import types

import pytest
import torch

from neutronorch import ConfigError, TrainConfig, train
from neutronorch.cli import main
from neutronorch.data import SyntheticSpec, generate
from neutronorch.observe import LANES, Spans, Utilisation, epoch_table
from neutronorch.observe import utilisation
from neutronorch.orchestration.loading import LoadingMode
from neutronorch.orchestration.neutronorch.mode import STAGES as NEUTRONORCH_STAGES, NeutronOrchMode
from neutronorch.train.loop import TimelineWindow
from neutronorch.train.outputs import check_outputs
from neutronorch.train.step import TRAINER_STAGES

TABLE = TRAINER_STAGES.merge(NEUTRONORCH_STAGES)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def graph():
    return generate(SyntheticSpec(nodes=2000, degree=8, features=12, classes=4, noise=0.6))


def config(**overrides):
    values = dict(dataset="given", fanouts=[4, 3], hidden=16, batch_size=64, epochs=2, lr=0.01, dropout=0.0,
                  progress=False, seed=1, eval_every=-1)
    values.update(overrides)
    return TrainConfig(**values)


def test_spans_sum_per_stage_and_keep_raw_spans_only_while_asked():
    spans = Spans()
    spans.add("sample", 1.0, 1.5)
    spans.keep = True
    spans.add("sample", 2.0, 2.25, step=0)
    spans.add("forward", 2.0, 3.0, step=0)
    spans.keep = False
    spans.add("forward", 4.0, 4.5)
    spans.count("feature_rows", 10)
    spans.count("feature_rows", 5)
    totals, counts = spans.take()
    assert totals == {"sample": 0.75, "forward": 1.5}
    assert counts == {"feature_rows": 15}
    assert [e[0] for e in spans.events] == ["sample", "forward"]
    assert spans.take() == ({}, {})


def test_spans_from_many_threads_lose_nothing():
    spans = Spans()

    def work():
        for _ in range(2000):
            spans.add("gather", 0.0, 0.001)
            spans.count("feature_rows", 1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    totals, counts = spans.take()
    assert counts["feature_rows"] == 8000
    assert totals["gather"] == pytest.approx(8.0)


def test_lane_busy_counts_work_and_not_waits():
    busy = TABLE.lane_busy({"forward": 2.0, "backward": 3.0, "wait": 4.0, "sample": 1.0, "host_wait_weights": 9.0,
                            "host_compute": 0.5}, wall=10.0)
    assert busy == {"host": 0.05, "sampler": 0.1, "trainer": 0.5}
    assert list(busy) == [lane for lane in LANES if lane in busy]
    assert TABLE.lane_of("hot_select") == "planner" and TABLE.lane_of("copy") == "copy"


def test_a_stage_span_is_recorded_even_when_its_body_raises():
    spans = Spans()
    with pytest.raises(KeyError):
        with spans.stage("gather"):
            raise KeyError("broke")
    totals, _ = spans.take()
    assert set(totals) == {"gather"} and totals["gather"] >= 0


def test_utilisation_sees_a_busy_thread():
    util = Utilisation(interval=0.05)
    try:
        util.take()
        cpu, start = time.process_time(), time.perf_counter()
        while time.perf_counter() < start + 0.4:
            sum(range(1000))
        got = (time.process_time() - cpu) / (time.perf_counter() - start)  # what the machine gave it
        mean = util.take()
    finally:
        util.close()
    # What the monitor saw matches the CPU time the process was given (on a busy machine, under a core).
    assert got > 0.05 and abs(mean["process_cores"] - got) < max(0.1, 0.3 * got), (mean["process_cores"], got)
    assert 0 < mean["process_share"] <= 1.5
    assert mean["gpu_percent"] is None
    assert util.samples
    assert not [t for t in threading.enumerate() if t.name == "neutronorch-utilisation"]


def test_a_lane_whose_stages_all_round_to_zero_shows_its_busy_share_alone():
    record = {"stage_seconds": {"hot_select": 0.001, "forward": 0.5}, "lane_busy": {"planner": 0.003, "trainer": 0.9}}
    lines = epoch_table(record, TABLE).splitlines()
    assert lines == ["    planner  busy   0.3%", "    trainer  busy  90.0% | forward 0.50"], lines


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["exact", "neutronorch"])
def test_epoch_record_has_stages_lanes_utilisation_and_rows_moved(graph, mode):
    extra = dict(mode="neutronorch", super_batch=2, hot_ratio=0.3) if mode == "neutronorch" else {}
    summary = train(config(fanouts=[4, 3, 3], **extra), graph)
    for epoch in summary["epochs"]:
        stages = epoch["stage_seconds"]
        assert {"sample", "gather", "wait", "forward", "backward", "step"} <= set(stages)
        assert set(epoch["lane_busy"]) >= {"sampler", "trainer"}
        assert 0 < epoch["lane_busy"]["trainer"] <= 1.0
        assert epoch["utilisation"]["process_cores"] > 0
        assert epoch["moved"]["feature_rows"] == pytest.approx(epoch["input_nodes_per_batch"] * epoch["batches"])
        assert epoch["moved"]["feature_bytes"] == epoch["moved"]["feature_rows"] * graph.feature_dim * 4
        assert epoch["moved"]["device_bytes"] == 0  # trained on the CPU: nothing is copied
        table = epoch_table(epoch, TABLE)
        assert "trainer" in table and "busy" in table and "feature rows per batch" in table
    if mode == "neutronorch":  # the host runs ahead: its spans land in the epoch during which they ran
        stages = set().union(*(e["stage_seconds"] for e in summary["epochs"]))
        assert {"hot_select", "host_aggregate", "host_matmul", "publish"} <= stages
        assert "host" in summary["epochs"][0]["lane_busy"]
    assert summary["moved"]["feature_rows"] == sum(e["moved"]["feature_rows"] for e in summary["epochs"])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["exact", "neutronorch"])
def test_timeline_png_and_raw_spans_of_the_window(tmp_path, graph, mode):
    pytest.importorskip("matplotlib")
    png = tmp_path / "timeline.png"
    # The host producer runs up to a super-batch ahead, so a short window may fall between its bursts: for
    # neutronorch the window spans the whole second epoch, whose last super-batches the host must produce.
    extra = dict(mode="neutronorch", super_batch=2, hot_ratio=0.3) if mode == "neutronorch" else {}
    window = 7 if mode == "neutronorch" else 3
    summary = train(config(timeline=str(png), timeline_steps=window, batch_size=32, **extra), graph)
    data = png.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 5000
    raw = json.loads(png.with_suffix(".spans.json").read_text())
    lanes = {s["lane"] for s in raw["spans"]}
    assert {"sampler", "trainer"} <= lanes
    if mode == "neutronorch":
        assert "host" in lanes
    steps = {s["step"] for s in raw["spans"] if s["stage"] == "forward"}
    assert steps == set(range(window))  # the window: the first steps of the second epoch's 7
    assert all(0 <= s["start"] <= s["end"] for s in raw["spans"])
    assert summary["timeline"]["png"] == str(png)
    assert raw["title"].endswith(f"epoch 1, first {window} steps")
    # A window longer than the epoch: the title says the steps it drew.
    longer = tmp_path / "longer.png"
    train(config(timeline=str(longer), timeline_steps=50, batch_size=32, **extra), graph)
    assert json.loads(longer.with_suffix(".spans.json").read_text())["title"].endswith("epoch 1, first 7 steps")


@pytest.mark.slow
def test_metric_logs_jsonl_and_csv(tmp_path, graph):
    jsonl, table = tmp_path / "m.jsonl", tmp_path / "m.csv"
    summary = train(config(log_jsonl=str(jsonl), log_csv=str(table), log_every=3, eval_every=1), graph)
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    steps = [x for x in lines if x["kind"] == "step"]
    epochs = [x for x in lines if x["kind"] == "epoch"]
    batches = summary["epochs"][0]["batches"]
    assert [x["step"] for x in steps] == list(range(2 * batches))
    assert len(epochs) == 2 and "val_acc" in epochs[1] and "stage_seconds" in epochs[1]
    # The logged step losses average to the epoch's reported loss.
    first = [x["loss"] for x in steps if x["epoch"] == 0]
    assert sum(first) / len(first) == pytest.approx(summary["epochs"][0]["train_loss"], rel=1e-5)
    rows = list(csv.DictReader(table.open()))
    assert sum(r["kind"] == "step" for r in rows) == 2 * batches
    assert [float(r["val_acc"]) for r in rows if r["kind"] == "epoch"] == [e["val_acc"] for e in summary["epochs"]]
    # The metric's own column holds the same scores (accuracy here).
    assert [float(r["test_accuracy"]) for r in rows if r["kind"] == "epoch"] == [
        e["test_accuracy"] for e in summary["epochs"]]


def test_csv_log_names_its_score_columns_by_metric_and_a_resumed_run_keeps_the_header_it_finds(tmp_path):
    from neutronorch.config import LogConfig
    from neutronorch.train.summary import CSV_COLUMNS, MetricLog

    record = {"epoch": 0, "train_loss": 0.5, "seconds": 1.0, "val_acc": 0.75, "test_acc": 0.625,
              "val_rocauc": 0.75, "test_rocauc": 0.625, "stage_seconds": {}}
    fresh = tmp_path / "fresh.csv"
    log = MetricLog(LogConfig(None, str(fresh), None, 1), "rocauc")
    log.steps(0, 0, [torch.tensor(0.5)])
    log.epoch(record)
    log.close()
    rows = list(csv.DictReader(fresh.open()))
    assert list(rows[0]) == list(CSV_COLUMNS) + ["val_rocauc", "test_rocauc"]
    assert (rows[1]["val_rocauc"], rows[1]["test_rocauc"]) == ("0.75", "0.625")
    assert rows[0]["val_rocauc"] == ""  # a step row has no scores
    # A log begun before the metric columns existed goes on with its 8 columns when the run resumes.
    old = tmp_path / "old.csv"
    old.write_text(",".join(CSV_COLUMNS) + "\nepoch,0,3,0.9,1.0,0.5,0.5,2.0\n")
    log = MetricLog(LogConfig(None, str(old), None, 1), "rocauc", append=True)
    log.epoch({**record, "epoch": 1})
    log.close()
    lines = list(csv.reader(old.open()))
    assert [len(line) for line in lines] == [8, 8, 8] and lines[2][5] == "0.75"


def _log_records(path):
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in records if r["kind"] == "step"], [r for r in records if r["kind"] == "epoch"]


def test_a_run_stopped_mid_epoch_keeps_every_step_it_logged_and_its_resumption_logs_each_step_once(tmp_path,
                                                                                                   graph):
    """The steps since the last group of ``log_every`` are in the logs when the stop's checkpoint is written; the
    resumed run goes on from the step after, and its resumed epoch's record is the whole epoch's, as the
    uninterrupted run's is."""
    from neutronorch.errors import Interrupted

    whole = train(config(epochs=3, batch_size=16), graph)
    batches = whole["epochs"][0]["batches"]
    assert batches > 6
    stop = threading.Event()
    logs = dict(log_jsonl=str(tmp_path / "m.jsonl"), log_csv=str(tmp_path / "m.csv"), log_every=4,
                checkpoint_dir=str(tmp_path / "ckpt"), batch_size=16,
                tensorboard=str(tmp_path / "tb") if _has("tensorboard") else None)
    with pytest.raises(Interrupted, match="epoch 1 after step 6"):
        train(config(epochs=3, **logs), graph, stop=stop,
              progress=lambda epoch, done, total: stop.set() if (epoch, done) == (1, 6) else None)
    steps, epochs = _log_records(tmp_path / "m.jsonl")
    assert [r["step"] for r in steps] == list(range(batches + 6))  # none lost: 6 is not a multiple of 4
    assert [r["epoch"] for r in epochs] == [0]
    resumed = train(config(epochs=3, resume=True, **logs), graph)
    steps, epochs = _log_records(tmp_path / "m.jsonl")
    assert [r["step"] for r in steps] == list(range(3 * batches))
    assert [(r["epoch"], r["batch"]) for r in steps] == [(e, b) for e in range(3) for b in range(batches)]
    assert [r["epoch"] for r in epochs] == [0, 1, 2]
    rows = list(csv.DictReader((tmp_path / "m.csv").open()))
    assert [int(r["step"]) for r in rows if r["kind"] == "step"] == list(range(3 * batches))
    assert [int(r["epoch"]) for r in rows if r["kind"] == "epoch"] == [0, 1, 2]
    if logs["tensorboard"]:
        assert [step for step, _ in _board_steps(tmp_path / "tb")] == list(range(3 * batches))
    # The resumed epoch's counts are the uninterrupted epoch's (the same batches); it says where it resumed. The
    # host store's rows count what it gathered: the batches prepared ahead of the stop are gathered again.
    record, reference = resumed["epochs"][1], whole["epochs"][1]
    assert record["resumed_at_step"] == 6 and "resumed_at_step" not in resumed["epochs"][2]
    assert "counted_from_step" not in record
    for key in ("sampled_edges", "batches", "input_nodes_per_batch", "train_loss"):
        assert record[key] == reference[key], key
    for key in ("feature_rows", "feature_bytes", "device_bytes", "cache_hits"):
        assert record["moved"][key] == reference["moved"][key], key
    assert record["moved"]["host_rows"] >= reference["moved"]["host_rows"]
    assert record["seconds"] > 0 and set(record["stage_seconds"]) == set(reference["stage_seconds"])


def test_a_resumed_log_is_cut_where_its_checkpoint_was_taken(tmp_path, caplog):
    """Records written after the checkpoint a run resumes from (by a run that then failed or was killed) are cut
    off, a line cut short too; the records before it are kept as they were."""
    from neutronorch.config import LogConfig
    from neutronorch.train.summary import MetricLog

    caplog.set_level(logging.INFO, "neutronorch")
    jsonl, table, board = tmp_path / "m.jsonl", tmp_path / "m.csv", tmp_path / "tb"
    tensorboard = board if _has("tensorboard") else None
    log = MetricLog(LogConfig(str(jsonl), str(table), tensorboard, 3), "acc")
    for step in range(4):
        log.step(0, step, torch.tensor(float(step)))
    log.epoch({"epoch": 0, "train_loss": 1.5, "seconds": 1.0, "stage_seconds": {}})
    for step in range(4, 7):  # epoch 1's first 3 steps: past a checkpoint at the end of epoch 0
        log.step(1, step - 4, torch.tensor(float(step)))
    log.close()
    with jsonl.open("a") as f:
        f.write('{"kind": "step", "epo')  # a line cut short by a kill
    kept = jsonl.read_text().splitlines()[:5]
    log = MetricLog(LogConfig(str(jsonl), str(table), tensorboard, 3), "acc", append=True)
    log.continue_at(1, 4)
    log.step(1, 0, torch.tensor(4.5))  # step 4 trained again
    log.close()
    lines = jsonl.read_text().splitlines()
    assert lines[:5] == kept and [json.loads(line)["step"] for line in lines] == [0, 1, 2, 3, 4, 4]
    rows = list(csv.DictReader(table.open()))
    assert [(r["kind"], int(r["step"])) for r in rows] == [("step", 0), ("step", 1), ("step", 2), ("step", 3),
                                                           ("epoch", 4), ("step", 4)]
    assert f"{jsonl}: cut 3 step record(s), 1 line cut short past the checkpoint" in caplog.text
    assert f"{table}: cut 3 step record(s) past the checkpoint" in caplog.text
    if tensorboard is not None:  # its events from step 4 on are hidden (purged), the new ones shown
        assert _board_steps(board) == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.5)]


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _board_steps(folder) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(folder))
    board.Reload()
    return [(event.step, event.value) for event in board.Scalars("train/loss")]


class _FillingFile:
    """A log file whose disk fills up after ``room`` writes: every later write or flush raises ENOSPC."""

    def __init__(self, file, room: int):
        self._file, self._room = file, room

    def write(self, text):
        self._room -= 1
        if self._room < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._file.write(text)

    def flush(self):
        if self._room < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._file.flush()

    def close(self):
        self._file.close()


@pytest.mark.slow
@pytest.mark.parametrize("option, room", [("log_jsonl", 0), ("log_jsonl", 3), ("log_csv", 0), ("log_csv", 4)])
def test_a_log_on_a_full_disk_ends_the_run_with_an_error_after_saving_it(tmp_path, graph, monkeypatch, option,
                                                                          room, caplog):
    """A log write that fails warns at once; training goes on, the checkpoints and the summary are written,
    and the run ends with an OutputError naming the log (exit 2 on the command line), never as a success."""
    from neutronorch import OutputError
    from neutronorch.train import summary as summary_module

    log = tmp_path / ("m.jsonl" if option == "log_jsonl" else "m.csv")
    monkeypatch.setattr(summary_module, "open", lambda path, *a, **k: _FillingFile(open(path, *a, **k), room),
                        raising=False)
    settings = config(epochs=2, log_every=1, checkpoint_dir=str(tmp_path / "ckpt"),
                      summary_json=str(tmp_path / "s.json"), **{option: str(log)})
    with pytest.raises(OutputError, match=rf"cannot write {log}: No space left on device \(.* MiB free\); what was "
                                          r"there is kept.*went on without it; what it trained was saved"):
        train(settings, graph)
    written = json.loads((tmp_path / "s.json").read_text())
    assert written["status"] == "completed" and len(written["epochs"]) == 2 and str(log) in written["error"]
    assert (tmp_path / "ckpt" / "last.pt").is_file()
    assert f"cannot write {log}: No space left on device" in caplog.text  # said when it happened, too


def test_a_log_that_cannot_be_opened_is_given_up_and_said_at_the_end(tmp_path, monkeypatch):
    from neutronorch import OutputError
    from neutronorch.config import LogConfig
    from neutronorch.train import summary as summary_module

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(summary_module, "open", full, raising=False)
    log = summary_module.MetricLog(LogConfig(str(tmp_path / "m.jsonl"), str(tmp_path / "m.csv"), None, 1), "acc")
    assert not log.per_step
    log.epoch({"epoch": 0, "train_loss": 0.5, "seconds": 1.0, "stage_seconds": {}})
    log.close()
    with pytest.raises(OutputError, match=rf"cannot write {tmp_path / 'm.jsonl'}: No space left on device"):
        log.checked({})


@pytest.mark.slow
def test_a_timeline_that_cannot_be_written_ends_the_run_with_an_error(tmp_path, graph, monkeypatch):
    pytest.importorskip("matplotlib")
    from neutronorch import OutputError
    from neutronorch.train import summary

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(summary, "write_timeline", full)
    png = tmp_path / "t.png"
    with pytest.raises(OutputError, match=rf"cannot write {png}: No space left on device"):
        train(config(epochs=1, timeline=str(png), timeline_steps=2, summary_json=str(tmp_path / "s.json")), graph)
    assert str(png) in json.loads((tmp_path / "s.json").read_text())["error"]


@pytest.mark.slow
def test_tensorboard_scalars(tmp_path, graph):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(config(tensorboard=str(tmp_path / "tb"), eval_every=1, epochs=1, metric="f1-macro"), graph)
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "epoch/seconds", "stage_seconds/forward", "busy/trainer", "epoch/val_f1_macro",
            "epoch/test_f1_macro", "epoch/val_acc"} <= tags


@pytest.mark.parametrize("args,message", [
    (["--timeline", "out.svg"], ".png"),
    (["--timeline", "/no/such/folder/t.png"], "does not exist"),
    (["--log-jsonl", "/no/such/folder/m.jsonl"], "does not exist"),
    (["--timeline-steps", "0"], "at least 1"),
    (["--log-every", "0"], "at least 1"),
])
def test_bad_observation_options_give_one_clear_error(args, message, capsys):
    assert main(["train", "--epochs", "1", "--no-progress"] + args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_timeline_without_matplotlib_fails_before_training(monkeypatch, tmp_path):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(ConfigError, match="pip install matplotlib"):
        check_outputs(config(timeline=str(tmp_path / "t.png")).validate())


class FakeNvml:
    """The driver library's calls, as ctypes sees them."""

    def __init__(self, pci_ok=True):
        self.pci_ok, self.asked = pci_ok, []

    def nvmlInit_v2(self):
        return 0

    def nvmlDeviceGetHandleByPciBusId_v2(self, bus_id, handle_ref):
        self.asked.append(("pci", bus_id))
        if not self.pci_ok:
            return 2
        handle_ref._obj.value = 1234
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index, handle_ref):
        self.asked.append(("index", index.value))
        handle_ref._obj.value = 99
        return 0

    def nvmlDeviceGetUtilizationRates(self, handle, rates_ref):
        rates_ref._obj.gpu = 73 if handle.value == 1234 else 41
        return 0


def test_gpu_utilisation_through_the_driver_library(monkeypatch):
    monkeypatch.setattr(utilisation, "pci_bus_id", lambda device: "00000000:17:00.0")
    gpu = utilisation.GpuMonitor(torch.device("cuda", 0), lib=FakeNvml())
    assert gpu.percent() == 73.0  # the device found by its PCI address
    lib = FakeNvml(pci_ok=False)
    gpu = utilisation.GpuMonitor(torch.device("cuda", 0), lib=lib)
    assert gpu.percent() == 41.0 and lib.asked == [("pci", b"00000000:17:00.0"), ("index", 0)]
    assert utilisation.GpuMonitor(torch.device("cpu")).percent() is None


def test_launched_data_parallel_every_line_of_a_log_record_carries_the_rank(monkeypatch):
    import logging

    from neutronorch.cli import app

    logger = logging.getLogger("neutronorch")
    before, level = list(logger.handlers), logger.level
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    logger.handlers = [h for h in before if not getattr(h, "_neutronorch_cli", False)]
    try:
        app._configure_logging()
        handler = next(h for h in logger.handlers if getattr(h, "_neutronorch_cli", False))
    finally:
        logger.handlers, logger.level = before, level
    table = logging.LogRecord("neutronorch", logging.INFO, __file__, 1, "epoch 1\n    trainer busy\n    cpu", None,
                              None)
    assert handler.format(table).split("\n") == ["[rank 0] epoch 1", "[rank 0]     trainer busy",
                                                   "[rank 0]     cpu"]
    warning = logging.LogRecord("neutronorch", logging.WARNING, __file__, 1, "`batch_size` odd\nsecond", None, None)
    shown = app._StderrHandler("[rank 1] ").format(warning)
    assert shown == "[rank 1] warning: --batch-size odd\n[rank 1] second"
    assert app._StderrHandler().format(table) == "epoch 1\n    trainer busy\n    cpu"


def test_the_epoch_line_shows_evaluation_and_checkpoint_time_beside_training_time():
    from neutronorch.train.loop import epoch_line

    record = {"epoch": 3, "train_loss": 0.5, "seconds": 35.0, "stage_seconds": {"forward": 1.0},
              "val_acc": 0.8, "test_acc": 0.75, "eval_seconds": 8.25, "checkpoint_seconds": 0.3}
    assert epoch_line(record, stages=False) == ("epoch   3 | loss 0.5000 | val accuracy 0.8000 | test 0.7500 | "
                                                "time 35.00s + eval 8.25s + checkpoint 0.30s")
    del record["eval_seconds"], record["checkpoint_seconds"], record["val_acc"]
    assert epoch_line(record).endswith("| time 35.00s | [forward 1.00]")
    record["exchange"] = [{"sent_bytes": 318_234_100}, {"sent_bytes": 1_321_092_552}]  # a partitioned run's ranks
    assert epoch_line(record, stages=False).endswith("| time 35.00s | sent 318.2-1,321.1 MB a rank")
    record["exchange"] = [{"sent_bytes": 35_437}, {"sent_bytes": 31_777}]  # a small graph's: in kB
    assert epoch_line(record, stages=False).endswith("| sent 31.8-35.4 kB a rank")


def test_training_reports_its_running_loss_and_the_evaluations_progress(graph):
    class Progress:
        def __init__(self):
            self.steps, self.losses, self.evaluations = [], [], []

        def __call__(self, epoch, done, total):
            self.steps.append((epoch, done, total))

        def loss(self, epoch, mean):
            self.losses.append((epoch, mean))

        def evaluating(self, epoch, layer, done, total):
            self.evaluations.append((epoch, layer, done, total))

    progress = Progress()
    summary = train(config(eval_every=1, eval_batch_size=128), graph, progress=progress)
    assert len(progress.losses) == len(progress.steps)  # on the CPU the loss is read after every step
    for epoch in summary["epochs"]:
        last = [mean for e, mean in progress.losses if e == epoch["epoch"]][-1]
        assert last == pytest.approx(epoch["train_loss"], rel=1e-6)
        mine = [e[1:] for e in progress.evaluations if e[0] == epoch["epoch"]]
        layers = {layer for layer, _, _ in mine}
        assert layers == {1, 2}  # every vertex at layer 1, the validation and test sets at layer 2
        assert (2, len(graph.val_idx) + len(graph.test_idx), len(graph.val_idx) + len(graph.test_idx)) == mine[-1]
        assert (1, graph.num_nodes, graph.num_nodes) in mine
    sampled = Progress()
    train(config(epochs=1, eval_every=1, eval_fanouts=[4, 3], eval_batch_size=128), graph, progress=sampled)
    assert {e[1] for e in sampled.evaluations} == {0} and sampled.evaluations[-1][2] == sampled.evaluations[-1][3]
    train(config(epochs=1), graph, progress=lambda epoch, done, total: None)  # a plain callback still does


def test_the_progress_bar_shows_the_running_loss_and_a_bar_while_evaluating(monkeypatch):
    from neutronorch.cli import progress

    bars = []

    class FakeBar:
        def __init__(self, total, desc, initial=0, **options):
            self.total, self.desc, self.n, self.postfix, self.closed = total, desc, initial, None, False
            bars.append(self)

        def update(self, k):
            self.n += k

        def set_postfix_str(self, text, refresh=True):
            self.postfix = text

        def close(self):
            self.closed = True

    monkeypatch.setattr(progress, "tqdm", FakeBar)
    bar = progress.ProgressBar()
    bar.loss(0, 1.25)
    bar(0, 1, 3)
    bar.loss(0, 0.75)
    bar(0, 2, 3)
    assert bars[0].desc == "epoch 0" and bars[0].postfix == "loss 0.7500" and bars[0].n == 2
    bar(0, 3, 3)
    bar.evaluating(0, 1, 100, 700)
    assert bars[0].closed and bars[1].desc == "evaluating after epoch 0, layer 1" and bars[1].n == 100
    bar.evaluating(0, 2, 50, 50)
    assert bars[1].closed and bars[2].desc == "evaluating after epoch 0, layer 2" and bars[2].closed
    bar(1, 1, 3)  # the next epoch's bar shows no loss until its own is read
    assert bars[3].desc == "epoch 1" and bars[3].postfix is None


def test_a_timeline_window_shorter_than_the_sampling_interval_still_shows_the_utilisation(tmp_path, graph,
                                                                                         monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    from neutronorch.observe import write_timeline

    util = Utilisation(interval=3600)  # the sampling thread never ticks: only samples taken on demand
    try:
        util.sample()
        start = time.perf_counter()
        while time.perf_counter() < start + 0.05:
            sum(range(1000))
        util.sample()
    finally:
        util.close()
    assert len(util.samples) == 2 and util.samples[1][1] > 0  # the busy loop's cores
    events = [("forward", 10.0, 10.004, 0), ("backward", 10.004, 10.01, 0)]
    texts = []
    real_text = Axes.text
    monkeypatch.setattr(Axes, "text", lambda self, *a, **k: texts.append(a[2]) or real_text(self, *a, **k))
    png = tmp_path / "t.png"
    write_timeline(str(png), events, [(9.8, 1.0, 0.5, None), (10.2, 2.0, 0.5, None), (10.4, 3.0, 0.5, None)],
                   "short", TABLE)
    # The sample before the window (where the next one's interval starts) and the one after it, covering it.
    assert [u["t"] for u in json.loads(png.with_suffix(".spans.json").read_text())["utilisation"]] == [-0.2, 0.2]
    assert texts == []
    write_timeline(str(png), events, [(9.8, 1.0, 0.5, None)], "nothing after", TABLE)
    assert texts == ["utilisation: window too short to sample"]
    assert json.loads(png.with_suffix(".spans.json").read_text())["utilisation"] == []
    # In a run, the window's start and end are sampled: a one-step window of a few milliseconds is covered.
    png = tmp_path / "run.png"
    train(config(epochs=1, timeline=str(png), timeline_steps=1), graph)
    raw = json.loads(png.with_suffix(".spans.json").read_text())
    window = max(s["end"] for s in raw["spans"])
    assert [u for u in raw["utilisation"] if u["t"] >= window - 1e-3], raw["utilisation"]  # its end is covered


def test_a_cold_kernel_cache_is_announced_once_before_compiling_and_a_warm_one_is_not(tmp_path):
    import subprocess
    import sys

    from neutronorch.jit import MESSAGE

    # Cached numba kernels counted as ours (by their module's name), compiled in one process, loaded in the next.
    (tmp_path / "probe.py").write_text("from numba import njit\n\n\n@njit(cache=True)\ndef add(x):\n    return x + 1\n"
                                       "\n\n@njit(cache=True)\ndef twice(x):\n    return 2 * x\n")
    script = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(message)s')\n"
              "import neutronorch.sampling.kernels, neutronorch.jit, probe; neutronorch.jit.PREFIX = 'probe'\n"
              "from numba import njit\n"
              "njit(lambda x: x - 1)(1)\n"  # not ours: no word
              "print('before'); probe.add(1); probe.twice(2); print('after')\n")
    runs = [subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300) for _ in range(2)]
    assert [run.returncode for run in runs] == [0, 0], runs[0].stderr[-2000:]
    assert runs[0].stdout.split("\n")[:3] == ["before", MESSAGE, "after"]  # once, before the compilation
    assert MESSAGE not in runs[1].stdout  # read from the cache: nothing to say


def test_a_span_begun_before_the_timeline_window_is_drawn_from_where_the_window_opens():
    """A producer's wait through the evaluation before the window's epoch starts at the window's opening, so
    the picture is the window's steps, not the wait before them."""
    spans = Spans()
    spans.add("host_wait_weights", 1.0, 5.0)  # before the window: totals only
    spans.keep, spans.opened = True, 10.0
    spans.add("host_wait_weights", 4.0, 12.0)  # begun during the evaluation
    spans.add("forward", 10.5, 11.0)
    assert spans.events == [("host_wait_weights", 10.0, 12.0, -1), ("forward", 10.5, 11.0, -1)]
    assert spans.take()[0]["host_wait_weights"] == 12.0  # the stage's seconds stay whole


def test_the_timeline_window_is_the_first_epoch_after_the_mode_s_warm_up():
    """NeutronOrch with ``auto`` serves nothing hot in its first epoch and compiles the hot rows' path in its
    second: the window is its third epoch; exact and device mode's is their second; a short run's its last."""
    auto, fixed = (types.SimpleNamespace(config=types.SimpleNamespace(hot_ratio=r)) for r in ("auto", 0.2))
    assert NeutronOrchMode.warm_epochs.fget(auto) == 2 and NeutronOrchMode.warm_epochs.fget(fixed) == 1
    assert LoadingMode.warm_epochs == 1
    assert [TimelineWindow(True, epochs, 40, 2).epoch for epochs in (1, 2, 3, 10)] == [0, 1, 2, 2]
    assert [TimelineWindow(True, epochs, 40, 1).epoch for epochs in (1, 2, 10)] == [0, 1, 1]


def test_the_closing_line_gives_every_ranks_peak_memory_as_a_range():
    from neutronorch.observe.report import peak_summary

    assert peak_summary({"peak_rss_mb": 708.1, "distributed": None}) == "peak RSS 708 MB"
    ranks = {"peak_rss_mb": 708.1, "distributed": {"peak_rss_mb_per_rank": [708.1, 733.3, 696.6, 693.5]}}
    assert peak_summary(ranks) == "peak RSS 694-733 MB a rank"
    assert peak_summary({"distributed": {"peak_rss_mb_per_rank": [396.2, 395.8]}}) == "peak RSS 396 MB a rank"
