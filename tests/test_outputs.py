"""Nothing lost: outputs never overwrite inputs, each other or another run's outputs; a run's checkpoint
folder is its own; unwritable outputs and full disks are clear errors found early, after what was trained
is saved; interrupted writes leave no partial files. A command-line run that names no output keeps its
results in a run folder of its own (runs/NAME/), made only once every check has passed."""

import errno
import hashlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from neutronorch import OutputError, TrainConfig, predict, train
from neutronorch.atomic import open_array_atomically, sweep_stale, temp_prefix, write_atomically
from neutronorch.cli import main
from neutronorch.data import SyntheticSpec, generate, save_native
from neutronorch.train import output_guard
from neutronorch.train import outputs as outputs_module
from neutronorch.train import run as run_module
from neutronorch.train import trainer as trainer_module

TINY = "synthetic:nodes=300,degree=5,features=8,classes=3"
TRAIN = ["--fanouts", "4,4", "--hidden", "8", "--epochs", "1", "--no-progress", "--no-stage-table",
         "--device", "cpu"]


def _digest(folder: Path) -> dict:
    """Every file under ``folder`` (hidden ones included) with a hash of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A native dataset, a trained checkpoint, a nodes file and a config file: the inputs to protect."""
    root = tmp_path_factory.mktemp("inputs")
    save_native(generate(SyntheticSpec(nodes=300, degree=5, features=8, classes=3)), root / "data")
    assert main(["train", "--dataset", str(root / "data"), *TRAIN, "--checkpoint-dir", str(root / "ckpt")]) == 0
    np.save(root / "ids.npy", np.arange(10))
    (root / "run.yaml").write_text("epochs: 1\n")
    np.savez(root / "graph.npz", x=np.zeros(1))
    return root


def _no_data_loaded(monkeypatch):
    fail = lambda *a, **k: pytest.fail("data loaded before the outputs were checked")  # noqa: E731
    monkeypatch.setattr(trainer_module, "load_dataset", fail)
    monkeypatch.setattr("neutronorch.cli.app.load_dataset", fail)


# Each case: a command line whose output is an input or another output ({w}: the workspace).
OVERLAPS = [
    ("train", "--summary-json {w}/data/features.npy"),
    ("train", "--summary-json {w}/data/new.json"),  # into the dataset's folder
    ("train", "--summary-json {w}/run.yaml --config {w}/run.yaml"),
    ("train", "--log-csv {w}/out/a.txt --summary-json {w}/out/a.txt"),
    ("train", "--timeline {w}/out/t.png --summary-json {w}/out/t.spans.json"),
    ("train", "--checkpoint-dir {w}/data"),
    ("train", "--tensorboard {w}/data"),
    ("train", "--log-jsonl {w}/link-to-features.npy"),  # a symbolic link to an input
    ("train", "--summary-json {w}/hard-link-to-labels.npy"),  # a hard link to an input
    ("predict", "--out {w}/ckpt/best.pt"),
    ("predict", "--out {w}/ids.npy --nodes {w}/ids.npy"),
    ("predict", "--out {w}/data/labels.npy"),
    ("predict", "--out {w}/data/preds.npy"),
    ("predict", "--out {w}/ckpt/../ckpt/best.pt --overwrite"),  # another spelling, even with --overwrite
    ("embed", "--out {w}/link-to-checkpoint.pt"),
    ("convert", "{w}/graph.npz {w}"),  # the output folder holds the input
    ("convert", "{w}/data {w}/data/copy"),  # into the input's folder
    ("convert", "{w}/data {w}/data"),  # in place without --overwrite: refused by the dataset writer
]


@pytest.mark.parametrize("command,args", OVERLAPS)
def test_an_output_onto_an_input_or_another_output_is_refused_before_anything_is_read(
        workspace, command, args, capsys, monkeypatch):
    w = workspace
    for link, target in (("link-to-features.npy", "data/features.npy"), ("link-to-checkpoint.pt", "ckpt/best.pt")):
        if not (w / link).is_symlink():
            (w / link).symlink_to(w / target)
    if not (w / "hard-link-to-labels.npy").exists():
        os.link(w / "data" / "labels.npy", w / "hard-link-to-labels.npy")
    before = _digest(w)
    _no_data_loaded(monkeypatch)
    words = args.format(w=w).split()
    if command == "train":
        words = ["train", "--dataset", str(w / "data"), *TRAIN, *words]
    elif command in ("predict", "embed"):
        words = [command, "--checkpoint", str(w / "ckpt" / "best.pt"), "--dataset", str(w / "data"),
                 "--device", "cpu", *(["--layer", "1"] if command == "embed" else []), *words]
    else:
        words = [command, *words]
    assert main(words) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err, err
    assert _digest(w) == before


def test_the_python_api_refuses_an_output_onto_its_own_inputs(workspace):
    from neutronorch import load_dataset

    graph = load_dataset(str(workspace / "data"))
    before = _digest(workspace)
    for out in (workspace / "ckpt" / "best.pt", workspace / "data" / "features.npy", workspace / "ids.npy"):
        with pytest.raises(Exception, match="read as|already exists|ending in .npy"):
            predict(str(workspace / "ckpt" / "best.pt"), graph, str(workspace / "ids.npy"), out=out, overwrite=True)
    assert _digest(workspace) == before


def test_a_new_run_into_a_folder_with_checkpoints_is_refused_unless_resumed_or_overwritten(tmp_path, capsys):
    ckpt, summary = tmp_path / "ckpt", tmp_path / "s.json"
    base = ["train", "--dataset", TINY, *TRAIN, "--checkpoint-dir", str(ckpt), "--eval-every", "1"]
    assert main(base + ["--epochs", "2", "--summary-json", str(summary)]) == 0
    before = _digest(ckpt)
    assert main(base) == 2  # forgot --resume
    err = capsys.readouterr().err
    assert "already exists" in err and "--resume" in err and "--overwrite" in err
    assert main(base + ["--summary-json", str(summary), "--checkpoint-dir", str(tmp_path / "other")]) == 2
    assert "--summary-json" in capsys.readouterr().err
    assert _digest(ckpt) == before and not (tmp_path / "other" / "last.pt").exists()
    assert main(base + ["--epochs", "3", "--resume", "--summary-json", str(summary)]) == 0
    assert json.loads(summary.read_text())["epochs"][-1]["epoch"] == 2
    # --overwrite starts over, and no checkpoint of the earlier run survives to be taken for this one's.
    assert main(base + ["--eval-every", "-1", "--overwrite", "--summary-json", str(summary)]) == 0
    assert sorted(p.name for p in ckpt.iterdir() if not p.name.startswith(".")) == ["last.pt"]


def test_two_runs_into_one_checkpoint_folder_the_second_is_refused(tmp_path, capsys):
    with output_guard.claim_folder("checkpoint_dir", tmp_path / "ckpt"):  # another run holds it
        assert main(["train", "--dataset", TINY, *TRAIN, "--checkpoint-dir", str(tmp_path / "ckpt")]) == 2
        err = capsys.readouterr().err
        assert "in use by another run" in err and f"process {os.getpid()}" in err
    assert main(["train", "--dataset", TINY, *TRAIN, "--checkpoint-dir", str(tmp_path / "ckpt")]) == 0


def test_the_folder_lock_is_released_when_its_process_is_killed(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from neutronorch.train.output_guard import "
                               "claim_folder\nwith claim_folder('checkpoint_dir', sys.argv[1]):\n print(1, flush=True)"
                               "\n time.sleep(60)", str(tmp_path)], stdout=subprocess.PIPE)
    assert holder.stdout.readline().strip() == b"1"
    with pytest.raises(Exception, match="in use by another run"):
        with output_guard.claim_folder("checkpoint_dir", tmp_path):
            pass
    holder.kill()
    holder.wait()
    with output_guard.claim_folder("checkpoint_dir", tmp_path):
        pass


def test_existing_outputs_of_predict_need_overwrite(workspace, tmp_path, capsys):
    out = tmp_path / "p.npy"
    np.save(out, np.arange(3))
    base = ["predict", "--checkpoint", str(workspace / "ckpt" / "best.pt"), "--dataset", str(workspace / "data"),
            "--device", "cpu", "--no-progress", "--out", str(out)]
    assert main(base) == 2
    assert "already exists" in capsys.readouterr().err
    np.testing.assert_array_equal(np.load(out), np.arange(3))
    assert main(base + ["--overwrite"]) == 0
    assert np.load(out).shape == (len(np.load(workspace / "data" / "test_idx.npy")),)


def _refuse_writes(monkeypatch, code):
    def refuse(*args, **kwargs):
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(output_guard.tempfile, "mkstemp", refuse)


@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS, errno.ENOSPC])
def test_an_output_folder_that_takes_no_file_is_found_before_the_data_is_loaded(tmp_path, monkeypatch, capsys, code):
    # Root ignores permission bits, so a refusing folder is simulated where the probe file is created.
    _no_data_loaded(monkeypatch)
    _refuse_writes(monkeypatch, code)
    assert main(["train", "--dataset", TINY, *TRAIN, "--summary-json", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err
    assert f"--summary-json {tmp_path / 's.json'}: cannot be written" in err and os.strerror(code) in err
    assert "Traceback" not in err


def test_a_disk_without_room_for_the_checkpoints_is_found_before_training(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(output_guard, "free_bytes", lambda path: 1000)  # what the disk has left
    monkeypatch.setattr(run_module, "run_epochs", lambda *a: pytest.fail("trained"))
    assert main(["train", "--dataset", TINY, *TRAIN, "--checkpoint-dir", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "--checkpoint-dir" in err and "needs about" in err and "free" in err


def test_a_checkpoint_that_cannot_be_written_still_leaves_the_summary_and_a_rescued_copy(tmp_path, monkeypatch,
                                                                                       capsys):
    real = run_module.save_checkpoint
    ckpt = tmp_path / "ckpt"

    def full_after_one_epoch(path, **kwargs):
        if Path(path).parent == ckpt and kwargs["epoch"] >= 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # the disk filled up during epoch 1
        return real(path, **kwargs)

    monkeypatch.setattr(run_module, "save_checkpoint",
                        lambda path, **kw: _as_output_error(full_after_one_epoch, path, **kw))
    summary = tmp_path / "elsewhere" / "s.json"
    assert main(["train", "--dataset", TINY, *TRAIN, "--epochs", "3", "--checkpoint-dir", str(ckpt),
                 "--summary-json", str(summary)]) == 2
    err = capsys.readouterr().err
    assert f"cannot write {ckpt / 'last.pt'}: No space left on device" in err and "Traceback" not in err
    rescued = list(summary.parent.glob("neutronorch-rescued-*-last.pt"))
    assert len(rescued) == 1 and str(rescued[0]) in err
    from neutronorch import load_checkpoint

    assert load_checkpoint(rescued[0]).epoch == 1 and load_checkpoint(ckpt / "last.pt").epoch == 0
    written = json.loads(summary.read_text())
    assert written["status"] == "failed" and "No space left" in written["error"] and len(written["epochs"]) == 2


def _as_output_error(save, path, **kwargs):
    from neutronorch.atomic import write_error

    try:
        return save(path, **kwargs)
    except OSError as exc:
        raise write_error(Path(path), exc, Path(path).exists()) from exc


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs, where the system allows mounting one (as root); skipped elsewhere."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_real_full_disk_is_a_clear_error_and_keeps_the_previous_file(small_disk):
    import torch

    target = small_disk / "state.pt"
    write_atomically(target, lambda f: torch.save({"a": torch.zeros(10)}, f))
    before = target.read_bytes()
    # torch.save reports the failed write as a RuntimeError of its own; the disk's error is what is said.
    with pytest.raises(OutputError, match=r"cannot write .*state.pt: No space left on device \(.* MiB free\); what "
                                          r"was there is kept"):
        write_atomically(target, lambda f: torch.save({"a": torch.zeros(1_000_000)}, f))
    assert target.read_bytes() == before
    # A memory-mapped output is reserved before it is filled: an error, never a SIGBUS mid-write.
    with pytest.raises(OutputError, match="No space left"):
        with open_array_atomically(small_disk / "big.npy", (1_000_000,), np.float32):
            pytest.fail("a map larger than the disk was handed out")
    assert sorted(p.name for p in small_disk.iterdir()) == ["state.pt"]


def test_metric_logs_on_a_full_disk_end_a_completed_run_with_an_error(small_disk, tmp_path, capsys):
    _fill(small_disk)
    log = small_disk / "m.jsonl"
    assert main(["train", "--dataset", TINY, *TRAIN, "--epochs", "2", "--log-jsonl", str(log),
                 "--log-every", "1", "--summary-json", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err
    assert f"neutronorch: error: cannot write {log}: No space left on device" in err and "Traceback" not in err
    written = json.loads((tmp_path / "s.json").read_text())
    assert written["status"] == "completed" and str(log) in written["error"]


@pytest.mark.slow
def test_a_timeline_on_a_full_disk_ends_the_run_with_an_error_and_leaves_no_partial_file(small_disk, tmp_path,
                                                                                         capsys):
    """The run trains on and is summarised, then ends with the error (never a success that lost an output)."""
    pytest.importorskip("matplotlib")
    _fill(small_disk)
    assert main(["train", "--dataset", TINY, *TRAIN, "--timeline", str(small_disk / "t.png"), "--summary-json",
                 str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err
    assert "training goes on without it" in err and "neutronorch: error: cannot write" in err, err
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["timeline"] is None and "No space left on device" in summary["error"]


def _fill(disk: Path) -> None:
    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        except OSError:
            pass


def test_sigterm_during_predict_leaves_no_partial_file(workspace, tmp_path, monkeypatch, capsys):
    from neutronorch.train import predict as predict_module

    real = predict_module.layerwise

    def terminated_midway(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(predict_module, "layerwise", terminated_midway)
    assert main(["predict", "--checkpoint", str(workspace / "ckpt" / "best.pt"), "--dataset",
                 str(workspace / "data"), "--device", "cpu", "--no-progress", "--out", str(tmp_path / "p.npy")]) \
        == 128 + signal.SIGTERM
    assert "interrupted; nothing was written" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_sigterm_during_convert_leaves_no_partial_folder(tmp_path, monkeypatch):
    from neutronorch.data import native

    real, calls = native.save_array, []

    def terminated_midway(path, array):
        calls.append(path)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(path, array)

    monkeypatch.setattr(native, "save_array", terminated_midway)
    assert main(["generate", "synthetic", "--nodes", "300", "--out", str(tmp_path / "g")]) == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []


def test_what_a_killed_writer_left_is_removed_by_the_next_write(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    host = temp_prefix(tmp_path / "x").split("@", 1)[1]
    stale = tmp_path / f".out.npy.tmp-{pid}@{host}abc123"
    stale.write_bytes(b"x" * 100)
    mine = tmp_path / f".out.npy.tmp-{os.getpid()}@{host}def456"  # a write in progress in a running process
    mine.write_bytes(b"y")
    remote = tmp_path / f".out.npy.tmp-{pid}@elsewhere-abc123"  # another machine's, on a shared disk
    remote.write_bytes(b"w")
    other = tmp_path / f".other.npy.tmp-{pid}@{host}abc123"  # another target's: left to its own next write
    other.write_bytes(b"z")
    with open_array_atomically(tmp_path / "out.npy", (4,), np.int64) as array:
        array[:] = 7
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out.npy", mine.name, remote.name, other.name])
    sweep_stale(tmp_path / "other.npy")
    assert not other.exists()


def test_ctrl_c_while_the_modules_load_is_an_interruption_not_a_traceback(monkeypatch, capsys):
    import builtins

    import neutronorch.cli as cli

    real = builtins.__import__

    def interrupted(name, *args, **kwargs):
        if name == "neutronorch.cli.app":
            raise KeyboardInterrupt
        return real(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "neutronorch.cli.app")
    monkeypatch.setattr(builtins, "__import__", interrupted)
    assert cli.main(["info", TINY]) == 130
    assert capsys.readouterr().err == "neutronorch: interrupted\n"


def test_convert_into_a_native_folder_in_place_still_works(tmp_path):
    save_native(generate(SyntheticSpec(nodes=300, degree=5, features=8, classes=3)), tmp_path / "g")
    assert main(["convert", str(tmp_path / "g"), str(tmp_path / "g"), "--overwrite", "--float16"]) == 0
    assert np.load(tmp_path / "g" / "features.npy").dtype == np.float16


def test_the_api_checks_as_the_command_line_does(tmp_path):
    summary = tmp_path / "s.json"
    summary.write_text("{}")
    with pytest.raises(Exception, match="already exists"):
        train(TrainConfig(dataset=TINY, epochs=1, fanouts=[4, 4], hidden=8, progress=False,
                          summary_json=str(summary)))
    assert summary.read_text() == "{}"


def _spellings(path: Path, root: Path, rng) -> Path | str:
    """``path`` written one of several ways: as it is, relative to ``root`` (the working folder), through a
    symbolic link to it or to its folder, with ``..`` in it, or (a file) through a hard link."""
    links = root / "links"
    links.mkdir(exist_ok=True)
    kind = rng.integers(6)
    if kind == 1:
        return os.path.relpath(path, root)
    if kind == 2:
        link = links / f"l{rng.integers(1 << 30)}"
        link.symlink_to(path)
        return link
    if kind == 3:
        link = links / f"d{rng.integers(1 << 30)}"
        link.symlink_to(path.parent, target_is_directory=True)
        return link / path.name
    if kind == 4:
        return path.parent / ".." / path.parent.name / "." / path.name
    if kind == 5 and path.is_file():
        link = links / f"h{rng.integers(1 << 30)}{path.suffix}"
        os.link(path, link)
        return link
    return path


def test_fuzzed_output_paths_never_touch_an_input_or_another_output(workspace, tmp_path, monkeypatch, capsys):
    """200 seeded command lines, each pointing one output at an input or at another output of the same
    command, spelled in varied ways: every one is refused before any data is read, inputs untouched."""
    rng = np.random.default_rng(2026)
    w = workspace
    monkeypatch.chdir(w)
    _no_data_loaded(monkeypatch)
    data, ckpt, ids, config = w / "data", w / "ckpt" / "best.pt", w / "ids.npy", w / "run.yaml"
    data_files = sorted(data.glob("*"))
    before = _digest(data) | {"best.pt": hashlib.sha256(ckpt.read_bytes()).hexdigest()}
    refused = 0
    for case in range(200):
        command = ["train", "predict", "embed", "convert"][rng.integers(4)]
        overwrite = ["--overwrite"] if rng.integers(2) else []
        if command == "train":
            flags = ["--summary-json", "--log-jsonl", "--log-csv"]
            flag = flags[rng.integers(3)]
            victim = [data_files[rng.integers(len(data_files))], config, data / "new.json",
                      w / "out" / "same.json"][rng.integers(4)]
            words = ["train", "--dataset", str(_spellings(data, w, rng)), "--config", str(config), *TRAIN,
                     flag, str(_spellings(victim, w, rng)) if victim.exists() else str(victim), *overwrite]
            if victim.name == "same.json":  # two outputs on one file
                other = flags[(flags.index(flag) + 1 + rng.integers(2)) % 3]
                words += [other, str(w / "out" / "." / "same.json")]
        elif command in ("predict", "embed"):
            victim = [ckpt, ids, data_files[rng.integers(len(data_files))], data / "p.npy"][rng.integers(4)]
            words = [command, "--checkpoint", str(_spellings(ckpt, w, rng)), "--dataset", str(data), "--nodes",
                     str(ids), "--device", "cpu", "--out",
                     str(_spellings(victim, w, rng)) if victim.exists() else str(victim), *overwrite]
            words += ["--layer", "1"] if command == "embed" else []
        else:
            source = [data, w / "graph.npz"][rng.integers(2)]
            victim = [w, data / "sub"][rng.integers(2)] if source == data else w  # holds it, or lies inside it
            words = ["convert", str(_spellings(source, w, rng)), str(victim), *overwrite]
        code = main(words)
        err = capsys.readouterr().err
        assert code == 2 and "error:" in err and "Traceback" not in err, (case, words, err)
        refused += 1
    assert refused == 200
    assert _digest(data) | {"best.pt": hashlib.sha256(ckpt.read_bytes()).hexdigest()} == before


def test_a_graph_passed_to_train_is_protected_as_its_files(workspace, tmp_path):
    from neutronorch import load_dataset

    graph = load_dataset(str(workspace / "data"))
    with pytest.raises(Exception, match="read as `graph`"):
        train(TrainConfig(epochs=1, fanouts=[4, 4], hidden=8, progress=False, overwrite=True,
                          log_csv=str(workspace / "data" / "labels.npy")), graph=graph)


# ----- run folders: a command-line run that names no output keeps its results in runs/NAME/ -----------

# The console's copy and, with matplotlib, the training curves besides the results.
RUN_FILES = sorted(["best.pt", "last.pt", "metrics.jsonl", "summary.json", "console.log"]
                   + ["curves.png"] * bool(importlib.util.find_spec("matplotlib")))


def _visible(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def test_a_run_that_names_no_output_keeps_its_results_in_a_new_run_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--dataset", TINY, *TRAIN]) == 0
    (folder,) = (tmp_path / "runs").iterdir()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d-sage-synthetic", folder.name), folder.name
    assert capsys.readouterr().out.splitlines()[-1] == f"results in runs/{folder.name}/"
    assert _visible(folder) == RUN_FILES
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "completed" and len(summary["epochs"]) == 1
    assert summary["checkpoints"] and summary["config"]["checkpoint_dir"] == f"runs/{folder.name}"
    kinds = {json.loads(line)["kind"] for line in (folder / "metrics.jsonl").read_text().splitlines()}
    assert kinds == {"step", "epoch"}


def test_two_runs_get_two_folders_even_in_the_same_second(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    name = "2026-12-03T07-15-02-gcn-synthetic"
    monkeypatch.setattr(outputs_module, "generated_run_name", lambda config, now=None: name)
    for _ in range(2):
        assert main(["train", "--dataset", TINY, *TRAIN, "--model", "gcn"]) == 0
    assert _visible(tmp_path / "runs") == [name, f"{name}-2"]
    assert capsys.readouterr().out.splitlines()[-1] == f"results in runs/{name}-2/"
    assert _visible(tmp_path / "runs" / name) == _visible(tmp_path / "runs" / f"{name}-2") == RUN_FILES


def test_a_run_name_in_use_is_refused_unless_resumed_or_overwritten(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    base = ["train", "--dataset", TINY, *TRAIN, "--run-name", "cora-sage"]
    assert main(base) == 0
    folder = tmp_path / "runs" / "cora-sage"
    before = _digest(folder)
    capsys.readouterr()
    assert main(base) == 2
    err = capsys.readouterr().err
    assert "--run-name cora-sage: runs/cora-sage/ already holds an earlier run's results" in err
    assert "--resume" in err and "--overwrite" in err and "Traceback" not in err
    assert _digest(folder) == before
    # --resume continues it: one more epoch, the metric log added to, the summary rewritten.
    assert main(base + ["--resume", "--epochs", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "results in runs/cora-sage/"
    summary = json.loads((folder / "summary.json").read_text())
    assert [e["epoch"] for e in summary["epochs"]] == [0, 1]
    epochs = [r for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [0, 1]
    # The console's copy is continued: both runs' epoch lines, each run's last line.
    console = (folder / "console.log").read_text()
    assert re.search(r"^epoch   0 .*^epoch   1 ", console, re.M | re.S) and console.count("results in runs/") == 2
    # --overwrite replaces its results: one epoch again.
    assert main(base + ["--overwrite"]) == 0
    assert len(json.loads((folder / "summary.json").read_text())["epochs"]) == 1
    assert _visible(tmp_path / "runs") == ["cora-sage"]
    assert (folder / "console.log").read_text().count("results in runs/") == 1


def test_a_run_that_fails_after_its_first_checkpoint_keeps_its_console_copy(tmp_path, monkeypatch, capsys):
    """The folder stays with what the run wrote, and so does console.log: the lines that say how it failed.
    The lock file goes (the run has ended)."""
    from neutronorch.train.task import Task

    monkeypatch.chdir(tmp_path)
    real, calls = Task.loss, []

    def nan_in_epoch_1(self, *args):  # TINY trains one step an epoch at the default batch size
        calls.append(1)
        return real(self, *args) * (float("nan") if len(calls) > 1 else 1.0)

    monkeypatch.setattr(Task, "loss", nan_in_epoch_1)
    assert main(["train", "--dataset", TINY, *TRAIN, "--epochs", "2", "--run-name", "f"]) != 0
    folder = tmp_path / "runs" / "f"
    assert {"last.pt", "console.log"} <= set(_visible(folder))
    assert not (folder / output_guard.LOCK_NAME).exists()
    console = (folder / "console.log").read_text()
    assert "epoch   0 | loss" in console and console.splitlines()[-1].startswith("neutronorch: error: "), console
    assert "diverged" in console.splitlines()[-1]


def test_a_stopped_run_says_the_whole_command_that_continues_it(tmp_path, monkeypatch, capsys):
    """The command a stop prints continues the run as given (its data and settings again, --resume added), and
    the console copy ends with that line; the old advice, --resume and the run name alone, is refused naming
    the data it trained on."""
    import shlex

    monkeypatch.chdir(tmp_path)
    _terminated_while_training(monkeypatch)
    assert main(["train", "--dataset", TINY, *TRAIN, "--epochs", "2", "--run-name", "X"]) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert line.startswith("neutronorch: interrupted: ") and "Traceback" not in err, err
    assert (tmp_path / "runs/X/console.log").read_text().splitlines()[-1] == line
    command = shlex.split(line.partition("continue it with ")[2])
    assert command[:2] == ["neutronorch", "train"] and command[-1] == "--resume", line
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--resume", "--run-name", "X"]) == 2
    assert f"It trained on --dataset {TINY!r}, and this run reads 'synthetic'" in capsys.readouterr().err
    assert main(command[1:]) == 0
    summary = json.loads((tmp_path / "runs/X/summary.json").read_text())
    assert summary["status"] == "completed" and [e["epoch"] for e in summary["epochs"]] == [0, 1]


def test_a_second_sigterm_stops_at_once_exiting_143_and_keeps_what_the_run_wrote(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    real = run_module.train_epoch

    def epoch(run, epoch, *args, **kwargs):
        if epoch == 1:  # after epoch 0's checkpoint: the first asks for a stop, the second stops at once
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
        return real(run, epoch, *args, **kwargs)

    monkeypatch.setattr(run_module, "train_epoch", epoch)
    assert main(["train", "--dataset", TINY, *TRAIN, "--epochs", "3", "--run-name", "X"]) == 128 + signal.SIGTERM
    assert "interrupted; stopped at once, writing nothing more (a last.pt is as it was)" in capsys.readouterr().err
    assert {"last.pt", "console.log"} <= set(_visible(tmp_path / "runs/X"))


def test_the_command_that_continues_a_run_drops_overwrite_and_names_a_generated_folder():
    from neutronorch.cli.again import resume_command

    assert resume_command(["--dataset", "a b", "--overwrite"], "2026-x") == \
        "neutronorch train --dataset 'a b' --resume --run-name 2026-x"
    assert resume_command(["--run-name=r", "--resume"], "r") == "neutronorch train --run-name=r --resume"
    assert resume_command(None, "r") == "the same command with --resume --run-name r"


def test_a_run_folder_keeps_the_console_and_a_timeline_named_beside_it(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--dataset", TINY, *TRAIN, "--run-name", "t", "--timeline", "t.png"]) == 0
    out = capsys.readouterr().out
    folder = tmp_path / "runs" / "t"
    assert _visible(folder) == RUN_FILES and (tmp_path / "t.png").is_file() and (tmp_path / "t.spans.json").is_file()
    console = (folder / "console.log").read_text()
    assert "epoch   0 | loss" in console and console.endswith(out)  # the log lines, then what was printed
    assert (folder / "curves.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("args, message", [
    (["--resume"], "--resume continues a run from its last.pt: name the run (--run-name"),
    (["--resume", "--run-name", "nothing-here"], "runs/nothing-here/ holds no last.pt"),
    (["--run-name", "a/b"], "--run-name 'a/b': give a folder name"),
    (["--run-name", ".hidden"], "give a folder name"),
    (["--run-name", "x", "--no-save"], "--no-save turns off"),
    (["--run-name", "x", "--log-jsonl", "m.jsonl"], "made only when no output option is given"),
    (["--batch-size", "-1"], "--batch-size -1"),  # the options are checked before a folder is made
])
def test_run_folder_mistakes_are_clear_errors_that_make_no_folder(args, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _no_data_loaded(monkeypatch)
    assert main(["train", "--dataset", TINY, *TRAIN, *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS])
def test_an_unwritable_working_folder_is_found_before_training(code, tmp_path, monkeypatch, capsys):
    # Root ignores permission bits, so a refusing folder is simulated where the probe file is created.
    monkeypatch.chdir(tmp_path)
    _no_data_loaded(monkeypatch)
    _refuse_writes(monkeypatch, code)
    assert main(["train", "--dataset", TINY, *TRAIN]) == 2
    err = capsys.readouterr().err
    assert "error: the run folder runs/" in err and "cannot be written" in err and os.strerror(code) in err, err
    assert "--no-save" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_run_that_fails_before_writing_leaves_no_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--dataset", str(tmp_path / "no-such-data"), *TRAIN]) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_no_save_and_named_outputs_make_no_run_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--dataset", TINY, *TRAIN, "--no-save"]) == 0
    assert list(tmp_path.iterdir()) == []
    assert "results in" not in capsys.readouterr().out
    assert main(["train", "--dataset", TINY, *TRAIN, "--log-csv", "m.csv"]) == 0  # today's behaviour: what it names
    assert _visible(tmp_path) == ["m.csv"]
    assert "results in" not in capsys.readouterr().out


def test_a_config_file_names_the_run_or_turns_the_folder_off(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "named.yaml").write_text("run-name: from-file\n")
    (tmp_path / "off.yaml").write_text("no_save: true\n")
    assert main(["train", "--dataset", TINY, *TRAIN, "--config", "off.yaml"]) == 0
    assert _visible(tmp_path) == ["named.yaml", "off.yaml"]
    assert main(["train", "--dataset", TINY, *TRAIN, "--config", "named.yaml"]) == 0
    assert _visible(tmp_path / "runs") == ["from-file"]
    assert main(["train", "--dataset", TINY, *TRAIN, "--config", "named.yaml", "--run-name", "flag"]) == 0
    assert _visible(tmp_path / "runs") == ["flag", "from-file"]  # the command line wins


def test_the_python_api_keeps_nothing_unless_asked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train(TrainConfig(dataset=TINY, epochs=1, fanouts=[4, 4], hidden=8, progress=False, device="cpu"))
    assert list(tmp_path.iterdir()) == []


# ----- --overwrite: the earlier run's outputs are replaced only once the new run has written its own ------------


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """A native dataset, and a copy whose features hold a NaN (it loads, and fails its checks after)."""
    root = tmp_path_factory.mktemp("datasets")
    save_native(generate(SyntheticSpec(nodes=300, degree=5, features=8, classes=3)), root / "good")
    bad = root / "nan"
    save_native(generate(SyntheticSpec(nodes=300, degree=5, features=8, classes=3)), bad)
    features = np.load(bad / "features.npy")
    features[5, 2] = np.nan
    np.save(bad / "features.npy", features)
    return root


def _diverging(monkeypatch):
    from neutronorch.train.task import Task

    real = Task.loss
    monkeypatch.setattr(Task, "loss", lambda self, *a: real(self, *a) * float("nan"))  # NaN at the first step


def _terminated_while_loading(monkeypatch):
    real = trainer_module.load_dataset

    def load(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler asks the run to stop after its current step
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "load_dataset", load)


def _terminated_while_training(monkeypatch):
    real = run_module.train_epoch

    def epoch(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # the step finishes, last.pt is written at the epoch's end, it stops
        return real(*args, **kwargs)

    monkeypatch.setattr(run_module, "train_epoch", epoch)


# Each case: what the second run is given and what goes wrong, the exit status and what the error says.
FAILED_REPLACEMENTS = [
    ("typo", ["--dataset", "{d}/good/typo"], 2, "no such"),
    ("fails-its-checks", ["--dataset", "{d}/nan"], 2, "NaN"),
    ("link-split-refused", ["--split", "edges:0.8,0.1"], 2, "a link split"),
    ("diverges", [], 2, "diverged"),
    ("sigterm-while-loading", [], 128 + signal.SIGTERM, "the earlier run's results it was to replace are kept"),
    # Stopped on request in its first epoch: the checkpoint the stop writes does not replace the earlier run's.
    ("sigterm-while-training", ["--epochs", "2"], 128 + signal.SIGTERM,
     "the earlier run's results it was to replace are kept"),
]


@pytest.mark.slow
@pytest.mark.parametrize("case, args, status, message", FAILED_REPLACEMENTS, ids=[c[0] for c in FAILED_REPLACEMENTS])
@pytest.mark.parametrize("where", ["run-folder", "checkpoint-dir"])
def test_overwrite_keeps_the_earlier_run_whole_until_the_new_one_has_its_own(
        datasets, tmp_path, monkeypatch, capsys, case, args, status, message, where):
    monkeypatch.chdir(tmp_path)
    outputs = (["--run-name", "X"] if where == "run-folder" else
               ["--checkpoint-dir", "ck", "--summary-json", "out/s.json", "--log-csv", "out/m.csv"])
    (tmp_path / "out").mkdir()
    first = ["train", "--dataset", str(datasets / "good"), *TRAIN, "--eval-every", "1", *outputs]
    assert main(first) == 0
    before = _digest(tmp_path)
    assert any(name.endswith("best.pt") for name in before) and any(name.endswith("last.pt") for name in before)
    if case == "diverges":
        _diverging(monkeypatch)
    if case == "sigterm-while-loading":
        _terminated_while_loading(monkeypatch)
    if case == "sigterm-while-training":
        _terminated_while_training(monkeypatch)
    again = [word.format(d=datasets) for word in first + args + ["--overwrite"]]
    assert main(again) == status
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert _digest(tmp_path) == before  # byte for byte; no set-aside folder, no lock, nothing of the new run
    assert not [p for p in tmp_path.rglob(".neutronorch-*")]


@pytest.mark.slow
def test_a_stop_asked_while_the_data_loads_stops_before_training(tmp_path, monkeypatch, capsys):
    _terminated_while_loading(monkeypatch)
    monkeypatch.setattr(run_module, "train_epoch", lambda *a, **k: pytest.fail("trained after the stop"))
    summary = tmp_path / "s.json"
    assert main(["train", "--dataset", TINY, *TRAIN, "--checkpoint-dir", str(tmp_path / "ck"), "--summary-json",
                 str(summary)]) == 128 + signal.SIGTERM
    assert "stopped on request before the first step; it stopped before its first checkpoint: there is nothing " \
           "to resume, start it again" in capsys.readouterr().err
    assert json.loads(summary.read_text())["status"] == "interrupted" and not (tmp_path / "ck").exists()


@pytest.mark.slow
def test_a_run_that_overwrites_leaves_only_its_own_outputs(datasets, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    base = ["train", "--dataset", str(datasets / "good"), *TRAIN, "--run-name", "X"]
    assert main(base + ["--eval-every", "1", "--epochs", "2"]) == 0
    earlier = _digest(tmp_path / "runs" / "X")
    assert main(base + ["--eval-every", "-1", "--overwrite"]) == 0  # no evaluation: no best.pt of its own
    assert sorted(p.name for p in (tmp_path / "runs" / "X").iterdir()) == [
        name for name in RUN_FILES if name != "best.pt"]
    assert all(earlier[name] != digest for name, digest in _digest(tmp_path / "runs" / "X").items())
    summary = json.loads((tmp_path / "runs" / "X" / "summary.json").read_text())
    assert summary["checkpoints"]["best"] is None and len(summary["epochs"]) == 1


@pytest.mark.slow
def test_outputs_a_killed_run_set_aside_are_the_users_to_keep_or_drop(datasets, tmp_path, monkeypatch, capsys):
    from neutronorch.atomic import host_tag

    monkeypatch.chdir(tmp_path)
    base = ["train", "--dataset", str(datasets / "good"), *TRAIN, "--run-name", "X"]
    assert main(base) == 0
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    folder = tmp_path / "runs" / "X"
    aside = folder / f".neutronorch-replaced-{dead}@{host_tag()}-0a1b2c3d"  # killed while replacing them
    aside.mkdir()
    for name in ("last.pt", "summary.json"):
        (folder / name).rename(aside / name)
    kept = _digest(folder)
    for more in (["--overwrite"], ["--resume"]):
        assert main(base + more) == 2
        err = capsys.readouterr().err
        assert f"holds {aside.name}/, an earlier run's outputs (last.pt, summary.json)" in err
        shown = Path("runs") / "X" / aside.name
        assert f"mv {shown}/* runs/X/" in err and f"rm -r {shown}" in err and "Traceback" not in err
        assert _digest(folder) == kept
    # A set-aside folder of a run still going is its own: not refused.
    (folder / aside.name).rename(folder / f".neutronorch-replaced-{os.getpid()}@{host_tag()}-0a1b2c3d")
    assert main(base + ["--overwrite"]) == 0


@pytest.mark.slow
def test_a_typed_run_folder_is_kept_with_its_table_folders_until_replaced(tmp_path, monkeypatch, capsys):
    from neutronorch.data import synthetic_typed, write_typed
    from neutronorch.train import run, trainer

    monkeypatch.chdir(tmp_path)
    write_typed(synthetic_typed(nodes=1200, train=0.3, val=0.1, seed=0), tmp_path / "mag")
    base = ["train", "--dataset", str(tmp_path / "mag"), *TRAIN, "--batch-size", "128", "--embedding-storage",
            "mmap", "--run-name", "X"]
    assert main(base) == 0
    folder = tmp_path / "runs" / "X"
    assert [p for p in folder.iterdir() if "-tables-" in p.name]
    before = _digest(tmp_path)

    def diverged(*args):
        raise TrainingError("the training loss became NaN or infinite in epoch 0 (within its first 1 steps)")

    from neutronorch.errors import TrainingError

    monkeypatch.setattr(run, "run_epochs", diverged)
    assert main(base + ["--overwrite"]) == 2
    assert "NaN or infinite" in capsys.readouterr().err
    assert _digest(tmp_path) == before and not list(tmp_path.rglob(".neutronorch-*"))
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    real = trainer.load_typed_dataset

    def terminated_while_loading(*args):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args)

    monkeypatch.setattr(trainer, "load_typed_dataset", terminated_while_loading)
    assert main(base + ["--overwrite", "--epochs", "2"]) == 128 + signal.SIGTERM
    assert "the earlier run's results it was to replace are kept" in capsys.readouterr().err
    assert _digest(tmp_path) == before and not list(tmp_path.rglob(".neutronorch-*"))
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert main(base + ["--overwrite", "--eval-every", "-1"]) == 0
    tables = sorted(p.name.split("-")[0] for p in folder.iterdir() if "-tables-" in p.name)
    assert tables == ["last"] and not (folder / "best.pt").exists()
    from neutronorch import load_typed_checkpoint

    assert load_typed_checkpoint(folder / "last.pt").epoch == 0  # its own tables, checked


@pytest.mark.slow
def test_a_full_disk_under_the_checkpoint_folder_leaves_no_temporary_file(tmp_path, monkeypatch, capsys):
    import torch

    real = torch.save

    def full(obj, f, *args, **kwargs):
        f.write(b"x" * 100)  # part of it went in before the disk filled up
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", full)
    ckpt = tmp_path / "ck"
    ckpt.mkdir()
    assert main(["train", "--dataset", TINY, *TRAIN, "--checkpoint-dir", str(ckpt)]) == 2
    err = capsys.readouterr().err
    assert f"cannot write {ckpt / 'last.pt'}: No space left on device" in err and "Free some space" in err
    assert list(ckpt.iterdir()) == []  # no temporary file, no lock file
    # Room found missing before the work: the folder the run made goes again.
    monkeypatch.setattr(torch, "save", real)
    monkeypatch.setattr(output_guard, "free_bytes", lambda path: 1000)
    assert main(["train", "--dataset", TINY, *TRAIN, "--checkpoint-dir", str(tmp_path / "new" / "deeper")]) == 2
    assert "needs about" in capsys.readouterr().err and not (tmp_path / "new").exists()


@pytest.mark.slow
def test_every_explicit_output_is_kept_until_replaced(datasets, tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    pytest.importorskip("tensorboard")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    first = ["train", "--dataset", str(datasets / "good"), *TRAIN, "--summary-json", "out/s.json", "--log-jsonl",
             "out/m.jsonl", "--log-csv", "out/m.csv", "--timeline", "out/t.png", "--tensorboard", "tb",
             "--log-every", "1"]
    assert main(first) == 0
    before = _digest(tmp_path)
    assert {"out/t.png", "out/t.spans.json", "out/m.jsonl"} <= set(before) and any(k.startswith("tb/events") for k in before)
    _diverging(monkeypatch)
    assert main(first + ["--overwrite"]) == 2  # no checkpoint folder: replaced only by a completed run
    assert "diverged" in capsys.readouterr().err
    assert _digest(tmp_path) == before and not list(tmp_path.rglob(".neutronorch-*"))
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert main(first + ["--overwrite"]) == 0
    after = _digest(tmp_path)
    assert sorted(k for k in after if not k.startswith("tb/")) == sorted(k for k in before if not k.startswith("tb/"))
    assert len([k for k in after if k.startswith("tb/")]) == 1 and not set(after.items()) & set(before.items())


@pytest.mark.slow
def test_a_run_killed_while_replacing_leaves_the_earlier_outputs_recoverable(datasets, tmp_path, monkeypatch,
                                                                              capsys):
    monkeypatch.chdir(tmp_path)
    base = ["train", "--dataset", str(datasets / "good"), *TRAIN, "--run-name", "X"]
    assert main(base) == 0
    folder = tmp_path / "runs" / "X"
    earlier = _digest(folder)
    hanging = ("import sys, time\nfrom neutronorch.train import trainer\n"
               "def load(*a, **k):\n print('loading', flush=True)\n time.sleep(600)\n"
               "trainer.load_dataset = load\nfrom neutronorch.cli import main\nmain(sys.argv[1:])")
    child = subprocess.Popen([sys.executable, "-c", hanging, *base, "--overwrite"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                 [str(Path(__file__).resolve().parents[1] / "src"), os.environ.get("PYTHONPATH", "")])})
    try:
        assert child.stdout.readline().strip() == "loading"  # its earlier outputs set aside, its data loading
    finally:
        child.kill()  # kill -9: nothing of it runs again
        child.wait()
    asides = list(folder.glob(".neutronorch-replaced-*"))
    assert len(asides) == 1 and _digest(asides[0]) == earlier  # whole, in one place
    assert main(base + ["--overwrite"]) == 2
    assert asides[0].name in capsys.readouterr().err
    for path in asides[0].iterdir():  # what the message says to do to keep them
        path.rename(folder / path.name)
    asides[0].rmdir()
    assert {k: v for k, v in _digest(folder).items() if k != ".neutronorch.lock"} == earlier  # the lock: kill -9's
    assert main(base + ["--epochs", "2", "--resume"]) == 0


def test_a_dataset_folder_that_cannot_be_swapped_in_stays_as_it_was(tmp_path, monkeypatch):
    save_native(generate(SyntheticSpec(nodes=300, degree=5, features=8, classes=3)), tmp_path / "g")
    before = _digest(tmp_path)
    real = Path.replace

    def refused(self, target):
        if temp_prefix(tmp_path / "g") in self.name:  # the new folder, renamed into place
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(self, target)

    monkeypatch.setattr(Path, "replace", refused)
    with pytest.raises(OutputError, match="cannot write .*g: Input/output error; what was there is kept"):
        save_native(generate(SyntheticSpec(nodes=200, degree=5, features=8, classes=3)), tmp_path / "g",
                    overwrite=True)
    assert _digest(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["g"]


def test_resume_and_overwrite_together_are_refused_as_a_contradiction(tmp_path, monkeypatch, capsys):
    _no_data_loaded(monkeypatch)
    assert main(["train", "--dataset", TINY, *TRAIN, "--checkpoint-dir", str(tmp_path / "c"), "--resume",
                 "--overwrite"]) == 2
    assert "--resume and --overwrite contradict each other" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_once_the_new_run_has_a_checkpoint_it_keeps_its_own_when_it_fails_later(datasets, tmp_path, monkeypatch):
    from neutronorch.errors import TrainingError
    from neutronorch.train.task import Task

    base = dict(dataset=str(datasets / "good"), fanouts=[4, 4], hidden=8, device="cpu", progress=False,
                checkpoint_dir=str(tmp_path / "ck"), summary_json=str(tmp_path / "s.json"), eval_every=1)
    train(TrainConfig(**base, epochs=3))
    real, calls = Task.loss, []

    def nan_in_epoch_1(self, *args):  # one step an epoch: the second step is epoch 1's
        calls.append(1)
        return real(self, *args) * (float("nan") if len(calls) > 1 else 1.0)

    monkeypatch.setattr(Task, "loss", nan_in_epoch_1)
    with pytest.raises(TrainingError, match="diverged"):
        train(TrainConfig(**base, epochs=3, overwrite=True))
    summary = json.loads((tmp_path / "s.json").read_text())  # this run's: it replaced the earlier at epoch 0
    assert summary["status"] == "failed" and [e["epoch"] for e in summary["epochs"]] == [0]
    from neutronorch import load_checkpoint

    assert [load_checkpoint(tmp_path / "ck" / name).epoch for name in ("last.pt", "best.pt")] == [0, 0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "s.json"]
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["best.pt", "last.pt"]
@pytest.mark.parametrize("option", ["--checkpoint-dir", "--summary-json", "--log-jsonl"])
def test_a_failed_run_removes_every_folder_it_made_for_its_outputs(option, tmp_path, monkeypatch, capsys):
    """Not only the last part of a/b/c: every folder the run made, while folders there before stay."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kept").mkdir()
    path = "kept/a/b/c" + ("" if option == "--checkpoint-dir" else "/out.json")
    if option == "--log-jsonl":  # the logs' folder must exist: made here, by the user, and kept
        (tmp_path / "kept/a/b/c").mkdir(parents=True)
    assert main(["train", "--dataset", str(tmp_path / "no-such-data"), *TRAIN, option, path]) == 2
    assert "Traceback" not in capsys.readouterr().err
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert left == (["kept", "kept/a", "kept/a/b", "kept/a/b/c"] if option == "--log-jsonl" else ["kept"]), left


def test_made_folders_are_removed_deepest_first_and_only_while_empty(tmp_path):
    from neutronorch.atomic import make_folder, remove_made

    (tmp_path / "there").mkdir()
    made = make_folder(tmp_path / "there/a/b/c")
    assert made == [tmp_path / "there/a/b/c", tmp_path / "there/a/b", tmp_path / "there/a"]
    (tmp_path / "there/a/note").write_text("someone else's")
    remove_made(made)
    assert sorted(p.name for p in (tmp_path / "there").rglob("*")) == ["a", "note"]
    with pytest.raises(OSError):  # a part of the path is a file: nothing it made is left
        make_folder(tmp_path / "there/a/note/z")
    assert sorted(p.name for p in (tmp_path / "there").rglob("*")) == ["a", "note"]
    with pytest.raises(OutputError):
        write_atomically(tmp_path / "there/p/q/out.bin", lambda f: (_ for _ in ()).throw(OSError(errno.EIO, "EIO")))
    assert not (tmp_path / "there/p").exists()
    with output_guard.claim_folder("checkpoint_dir", tmp_path / "there/ck/a/b"):
        assert (tmp_path / "there/ck/a/b" / output_guard.LOCK_NAME).is_file()
    assert not (tmp_path / "there/ck").exists()
    with output_guard.claim_folder("checkpoint_dir", tmp_path / "there/ck/a/b"):
        (tmp_path / "there/ck/a/b/last.pt").write_bytes(b"kept")
    assert (tmp_path / "there/ck/a/b/last.pt").is_file()


def test_a_typed_runs_embedding_folder_goes_with_its_parents(tmp_path):
    from neutronorch.train.typed_tables import TypedTables

    (tmp_path / "there").mkdir()
    tables = TypedTables("mmap", "asked", {"author": (8, 4)}, folder=tmp_path / "there/a/b/c")
    with tables:
        assert tables.table("author", 8, 4) is not None
    assert list((tmp_path / "there").iterdir()) == []


@pytest.mark.parametrize("args, message", [
    (["--run-name", "漢" * 100], "--run-name '漢漢漢漢漢漢漢漢漢漢漢漢漢漢漢漢漢漢漢漢漢漢漢漢'... (100 characters): the name is 300 "
                                 "bytes long in UTF-8; names on this file system take at most 255 bytes"),
    (["--checkpoint-dir", "ck/" + "é" * 128], "the name is 256 bytes long"),
    (["--summary-json", "é" * 120 + ".json"], "the name is 245 bytes long in UTF-8, and it is written under a temporary"),
    (["--log-jsonl", "x" * 256], "the name is 256 bytes long in UTF-8; names"),  # written in place
])
def test_a_name_too_long_in_bytes_is_refused_before_anything_is_made(args, message, tmp_path, monkeypatch, capsys):
    """The file system counts a name's bytes, not its characters (a CJK character is 3 bytes), and an output is
    written under a longer temporary name first: both are checked before the work, never met at its end."""
    monkeypatch.chdir(tmp_path)
    _no_data_loaded(monkeypatch)
    assert main(["train", "--dataset", TINY, *TRAIN, *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []
    assert main(["generate", "synthetic", "--nodes", "200", "--out", "漢" * 80]) == 2  # 240 bytes and a temporary name
    assert "the name is 240 bytes long in UTF-8, and it is written under a temporary" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
