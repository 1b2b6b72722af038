"""Embedding tables in files (train/typed_tables.py, train/table_files.py): a run with memory-mapped tables is
the run with tables in memory, to the bit; the files go where they are told and are refused where they would
overwrite; checkpoints keep them as files beside them, resume exactly from them and refuse missing or damaged
ones; auto chooses by the memory available; predict and embed read them."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from neutronorch import (CheckpointError, ConfigError, Interrupted, OutputError, TrainConfig, embed,
                         load_typed_checkpoint, predict, train)
from neutronorch.data import synthetic_typed, write_typed
from neutronorch.nn.typed_models import TypedGNN, TypedSpec
from neutronorch.train import output_guard, typed_tables
from neutronorch.train.optim import RowAdam
from neutronorch.train.typed_tables import draw_like_embedding, plan_tables

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def mag():
    """1,200 papers (360 for training: 6 batches of 64), 1,500 authors, 60 institutions, 240 fields."""
    return synthetic_typed(nodes=3000, train=0.3, val=0.1, seed=0)


def config(directory, **settings) -> TrainConfig:
    base = dict(epochs=3, fanouts=[4, 4], hidden=16, batch_size=64, lr=0.01, dropout=0.3, threads=1, device="cpu",
                checkpoint_dir=str(directory), progress=False, embedding_storage="mmap")
    return TrainConfig(**{**base, **settings})


def outcome(summary: dict, directory) -> tuple:
    """Every epoch's loss and scores, the best, and the final weights (tables included)."""
    epochs = [(e["epoch"], e["train_loss"], e.get("val_acc"), e.get("test_acc")) for e in summary["epochs"]]
    weights = load_typed_checkpoint(Path(directory) / "last.pt").model.state_dict()
    return epochs, (summary["val_acc"], summary["test_acc"], summary["best_epoch"]), weights


def assert_same(a: tuple, b: tuple) -> None:
    assert a[0] == b[0] and a[1] == b[1]
    assert a[2].keys() == b[2].keys() and all(torch.equal(a[2][k], b[2][k]) for k in a[2]), \
        [k for k in a[2] if not torch.equal(a[2][k], b[2][k])]


def folders(directory, stem: str) -> list[Path]:
    return sorted(p for p in Path(directory).iterdir() if p.is_dir() and p.name.startswith(f"{stem}-tables-"))


@pytest.fixture(scope="module")
def in_memory(mag, tmp_path_factory):
    """An uninterrupted run of 4 epochs with its tables in memory: (summary, its checkpoint folder)."""
    directory = tmp_path_factory.mktemp("memory")
    return train(config(directory, epochs=4, embedding_storage="memory"), graph=mag), directory


@pytest.fixture(scope="module")
def mapped(mag, tmp_path_factory):
    """The same run with its tables memory-mapped."""
    directory = tmp_path_factory.mktemp("mapped")
    return train(config(directory, epochs=4), graph=mag), directory


def test_drawn_into_a_file_a_chunk_at_a_time_a_table_is_what_nn_embedding_draws(monkeypatch, tmp_path):
    monkeypatch.setattr(typed_tables, "CHUNK_BYTES", 16 * 4 * 3)  # 16 rows of 3 floats a chunk: many chunks
    for rows, width in [(5, 3), (37, 3), (100, 3), (1001, 3), (64, 1)]:
        torch.manual_seed(7)
        expected = torch.nn.Embedding(rows, width).weight.detach().clone()
        after = torch.rand(4)
        array = np.lib.format.open_memmap(tmp_path / f"t{rows}.npy", mode="w+", dtype=np.float32, shape=(rows, width))
        torch.manual_seed(7)
        draw_like_embedding(torch.from_numpy(array))
        assert torch.equal(torch.from_numpy(np.array(array)), expected), (rows, width)
        assert torch.equal(torch.rand(4), after)  # the generator is left where nn.Embedding leaves it


def test_a_typed_gnn_is_built_in_memory_as_before_or_with_tables_given(mag):
    spec = TypedSpec.of(mag.with_reverse())
    torch.manual_seed(0)
    plain = TypedGNN("sage", spec, 8, mag.num_classes, 2)
    given = {}

    def tables(node_type, rows, width):
        given[node_type] = torch.empty(rows, width)
        draw_like_embedding(given[node_type])
        return given[node_type]

    torch.manual_seed(0)
    made = TypedGNN("sage", spec, 8, mag.num_classes, 2, tables=tables)
    assert set(given) == set(plain.embeddings) and made.arguments == plain.arguments
    assert all(made.embeddings[t].weight.data_ptr() == given[t].data_ptr() for t in given)
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), made.state_dict().values()))
    with pytest.raises(ValueError, match="the table of author given is \\(3, 8\\)"):
        TypedGNN("sage", spec, 8, mag.num_classes, 2, tables=lambda t, rows, width: torch.zeros(3, width))
    table = torch.zeros(10, 4)
    with pytest.raises(ValueError, match="a moment given for a \\(10, 4\\) table is a \\(10, 3\\)"):
        RowAdam([table], moments=lambda p: (torch.zeros(10, 3), torch.zeros(10, 3)))


def test_a_run_with_mapped_tables_is_the_run_in_memory_to_the_bit(in_memory, mapped):
    summary, directory = mapped
    assert summary["embedding_tables"]["storage"] == "mmap" and in_memory[0]["embedding_tables"]["storage"] == "memory"
    assert_same(outcome(*mapped), outcome(*in_memory))
    # The checkpoint keeps its tables beside it: last.pt holds no table, its folder holds each table's three files.
    state = torch.load(directory / "last.pt", weights_only=True)
    assert not any(k.startswith("embeddings.") for k in state["model"])
    assert all(t["exp_avg"] is None for t in state["tables_optimizer"]["state"]["tables"])
    [last] = folders(directory, "last")
    assert state["table_files"]["folder"] == last.name
    assert sorted(p.name for p in last.iterdir()) == sorted(
        f"{t}.{part}.npy" for t in ("author", "institution", "field") for part in ("weight", "exp_avg", "exp_avg_sq"))
    assert (directory / "last.pt").stat().st_size < (in_memory[1] / "last.pt").stat().st_size / 2
    # best.pt of the last epoch links last.pt's files where the file system allows, rather than copying them.
    if summary["best_epoch"] == 3:
        [best] = folders(directory, "best")
        assert (best / "author.weight.npy").stat().st_ino == (last / "author.weight.npy").stat().st_ino


def test_the_files_go_where_told_and_leave_nothing_behind(mag, tmp_path):
    where = tmp_path / "tables"
    seen = []

    def progress(epoch, done, total):
        if not seen:
            with open("/proc/self/maps") as f:
                seen.extend(sorted({line.split(None, 5)[5].strip() for line in f if str(where) in line}))

    summary = train(config(tmp_path / "run", epochs=1, embedding_dir=str(where)), graph=mag, progress=progress)
    assert summary["embedding_tables"]["folder"] == str(where)
    assert len(seen) == 9 and all(s.endswith("(deleted)") and Path(s).parent == where for s in seen), seen
    assert not where.exists()  # made for the run, deleted once empty: the files went as soon as they were open
    # Without embedding_dir, next to the checkpoints; without those, in the temporary folder.
    summary = train(config(tmp_path / "other", epochs=1), graph=mag)
    assert summary["embedding_tables"]["folder"] == str(tmp_path / "other")
    summary = train(config(None, epochs=1, checkpoint_dir=None), graph=mag)
    assert summary["embedding_tables"]["folder"] == tempfile.gettempdir()


def test_files_that_could_overwrite_or_not_fit_are_refused_before_any_work(mag, tmp_path, monkeypatch):
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    with pytest.raises(ConfigError, match="`embedding_dir` .*a_file: exists and is not a folder"):
        train(config(tmp_path / "run", embedding_dir=str(a_file)), graph=mag)
    assert not (tmp_path / "run").exists() and a_file.read_text() == "mine"
    data = tmp_path / "data"
    write_typed(mag, data)
    with pytest.raises(ConfigError, match="`embedding_dir` .*lies inside .*data, the folder read as `dataset`"):
        train(config(tmp_path / "run", dataset=str(data), embedding_dir=str(data / "tables")))
    with pytest.raises(ConfigError, match="`embedding_storage` mmap: memory-mapped tables live on the host, and this "
                                          "run trains on cuda"):
        plan_tables(config(tmp_path / "run"), mag.with_reverse(), 2, None, torch.device("cuda"))
    # An earlier run's table folders are never replaced silently; `overwrite` removes them.
    train(config(tmp_path / "earlier", epochs=1), graph=mag)
    (tmp_path / "earlier" / "last.pt").unlink()
    (tmp_path / "earlier" / "best.pt").unlink()
    with pytest.raises(ConfigError, match="holds an earlier run's embedding table files \\(last-tables-6-"):
        train(config(tmp_path / "earlier", epochs=1), graph=mag)
    train(config(tmp_path / "earlier", epochs=1, embedding_storage="memory", overwrite=True), graph=mag)
    assert not folders(tmp_path / "earlier", "last") and not folders(tmp_path / "earlier", "best")
    # No room: said before anything is written, naming what is needed.
    monkeypatch.setattr(output_guard, "free_bytes", lambda path: 1000)
    with pytest.raises(OutputError, match="`embedding_dir` .*needs about .* MiB, and its disk has 0.0 MiB free"):
        train(config(tmp_path / "full", embedding_dir=str(tmp_path / "t")), graph=mag)
    with pytest.raises(OutputError, match="`embedding_storage` mmap: no folder takes the tables' files"):
        train(config(tmp_path / "full"), graph=mag)
    assert not (tmp_path / "full").exists() and not (tmp_path / "t").exists()


def test_auto_maps_the_tables_when_the_memory_available_is_small(mag, tmp_path, monkeypatch):
    graph = mag.with_reverse()
    need = 3 * 4 * 16 * 1800  # three tables of 1,800 rows in all, 16 wide, and their two moments
    auto, cpu = config(tmp_path, embedding_storage="auto"), torch.device("cpu")
    big = plan_tables(auto, graph, 2, None, cpu, available=4 * need)
    small = plan_tables(auto, graph, 2, None, cpu, available=need)
    assert big.nbytes == need and big.storage == "memory" and "within half" in big.reason
    assert small.storage == "mmap" and "above half the 0.3 MiB of memory available" in small.reason
    on_gpu = plan_tables(auto, graph, 2, None, torch.device("cuda"), available=1)
    assert on_gpu.storage == "memory" and "train on cuda" in on_gpu.reason
    monkeypatch.setattr(typed_tables, "available_memory_bytes", lambda: need)
    summary = train(config(tmp_path / "run", epochs=1, embedding_storage="auto"), graph=mag)
    assert summary["embedding_tables"]["storage"] == "mmap" and folders(tmp_path / "run", "last")


def test_resumed_from_mapped_tables_the_run_ends_bit_identical(mag, mapped, in_memory, tmp_path):
    train(config(tmp_path / "a", epochs=2), graph=mag)
    resumed = train(config(tmp_path / "a", epochs=4, resume=True), graph=mag)
    assert_same(outcome(resumed, tmp_path / "a"), outcome(*mapped))
    assert len(folders(tmp_path / "a", "last")) == 1  # the folders replaced were removed
    # Stopped mid-epoch; and the storage may change on resume (the results do not depend on it).
    stop = threading.Event()

    def progress(epoch, done, total):
        if (epoch, done) == (1, 2):
            stop.set()

    with pytest.raises(Interrupted):
        train(config(tmp_path / "b", epochs=4), graph=mag, progress=progress, stop=stop)
    resumed = train(config(tmp_path / "b", epochs=4, resume=True, embedding_storage="memory"), graph=mag)
    assert_same(outcome(resumed, tmp_path / "b"), outcome(*in_memory))
    train(config(tmp_path / "c", epochs=2, embedding_storage="memory"), graph=mag)
    resumed = train(config(tmp_path / "c", epochs=4, resume=True), graph=mag)
    assert_same(outcome(resumed, tmp_path / "c"), outcome(*mapped))


def test_a_checkpoint_whose_table_files_are_missing_or_damaged_is_refused_naming_them(mag, mapped, tmp_path):
    def copy() -> Path:
        directory = tmp_path / f"copy{len(list(tmp_path.iterdir()))}"
        shutil.copytree(mapped[1], directory, ignore=shutil.ignore_patterns(".neutronorch.lock"))
        return directory

    directory = copy()
    [folder] = folders(directory, "last")
    (folder / "author.exp_avg.npy").unlink()
    with pytest.raises(CheckpointError, match="last.pt: its embedding table files in .* are missing or damaged: "
                                              "author's exp_avg \\(author.exp_avg.npy\\): missing\\. "
                                              ".*keep last-tables-"):
        load_typed_checkpoint(directory / "last.pt")
    with pytest.raises(CheckpointError, match="author's exp_avg \\(author.exp_avg.npy\\): missing"):
        train(config(directory, epochs=5, resume=True), graph=mag)
    directory = copy()
    [folder] = folders(directory, "last")
    with open(folder / "field.weight.npy", "r+b") as f:
        f.truncate(1000)
    with pytest.raises(CheckpointError, match="field's weight \\(field.weight.npy\\): 1,000 bytes, 15,488 when written "
                                              "\\(truncated or replaced\\)"):
        load_typed_checkpoint(directory / "last.pt")
    directory = copy()
    [folder] = folders(directory, "last")
    array = np.lib.format.open_memmap(folder / "institution.weight.npy", mode="r+")
    array[0, 0] += 1.0  # the first row is in every sample
    array.flush()
    del array
    with pytest.raises(CheckpointError, match="institution's weight .*: its sampled rows' checksum differs"):
        predict(directory / "last.pt", mag)
    directory = copy()
    shutil.rmtree(folders(directory, "best")[0])
    with pytest.raises(CheckpointError, match="best.pt: its embedding tables are kept beside it in .*best-tables-.*, "
                                              "which is missing"):
        load_typed_checkpoint(directory / "best.pt")


def test_predict_and_embed_read_mapped_tables_from_their_files(mag, mapped, in_memory):
    ours = load_typed_checkpoint(mapped[1] / "best.pt")
    assert ours.model.embeddings["author"].weight.data_ptr() != 0
    assert torch.equal(ours.model.embeddings["author"].weight,
                       load_typed_checkpoint(in_memory[1] / "best.pt").model.embeddings["author"].weight)
    for checkpoint in (mapped[1] / "best.pt", in_memory[1] / "best.pt"):
        assert np.array_equal(predict(checkpoint, mag, nodes="test"), predict(in_memory[1] / "best.pt", mag,
                                                                              nodes="test"))
    assert np.array_equal(embed(mapped[1] / "best.pt", mag, node_type="author", nodes=np.arange(50)),
                          embed(in_memory[1] / "best.pt", mag, node_type="author", nodes=np.arange(50)))
    # Layer by layer (every neighbour), the input layer's table rows read from the files too.
    assert np.array_equal(predict(mapped[1] / "best.pt", mag, nodes=np.arange(40), fanouts=-1),
                          predict(in_memory[1] / "best.pt", mag, nodes=np.arange(40), fanouts=-1))


def test_a_failed_table_write_keeps_the_checkpoint_before_it_whole(mag, tmp_path, monkeypatch):
    copy_file_range = os.copy_file_range

    def full_disk_in_epoch_1(source, target, count, *offsets):
        if "-tables-12-" in os.readlink(f"/proc/self/fd/{target}"):  # the end of epoch 1: 12 steps
            raise OSError(errno.ENOSPC, "No space left on device")
        return copy_file_range(source, target, count, *offsets)

    monkeypatch.setattr(os, "copy_file_range", full_disk_in_epoch_1)
    with pytest.raises(OutputError, match="cannot write .*last-tables-12-.*No space left on device"):
        train(config(tmp_path, epochs=3), graph=mag)
    assert load_typed_checkpoint(tmp_path / "last.pt").epoch == 0  # with its tables, checked
    assert [p.name.split("-")[2] for p in folders(tmp_path, "last")] == ["6"]
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_a_checkpoint_the_disk_has_no_room_for_still_leaves_the_summary(mag, tmp_path, monkeypatch):
    copy_file_range = os.copy_file_range

    def full_disk_in_epoch_1(source, target, count, *offsets):  # the checkpoint folder's disk, not the summary's
        where = os.readlink(f"/proc/self/fd/{target}")
        if "-tables-12-" in where and "/ck/" in where:
            raise OSError(errno.ENOSPC, "No space left on device")
        return copy_file_range(source, target, count, *offsets)

    monkeypatch.setattr(os, "copy_file_range", full_disk_in_epoch_1)
    summary = tmp_path / "s.json"
    with pytest.raises(OutputError, match="No space left on device"):
        train(config(tmp_path / "ck", epochs=3, summary_json=str(summary)), graph=mag)
    written = json.loads(summary.read_text())
    assert written["status"] == "failed" and "No space left" in written["error"] and len(written["epochs"]) == 2
    rescued = re.search(r"A copy was saved to (\S+) with its table folder (\S+)/ \(move both\)", written["error"])
    assert rescued and (Path(rescued[1]).parent / rescued[2]).is_dir()
    assert load_typed_checkpoint(rescued[1]).epoch == 1  # read with its tables, beside it
    assert not [p for p in (tmp_path / "ck").iterdir() if ".tmp-" in p.name or p.name.startswith(".neutronorch")]


@pytest.mark.parametrize("mode", ["device", "neutronorch"])
def test_the_other_typed_modes_train_mapped_tables_as_those_in_memory(mag, tmp_path, mode):
    runs = [train(config(tmp_path / storage, epochs=2, mode=mode, embedding_storage=storage), graph=mag)
            for storage in ("memory", "mmap")]
    assert [e["train_loss"] for e in runs[0]["epochs"]] == [e["train_loss"] for e in runs[1]["epochs"]]
    assert runs[1]["embedding_tables"]["storage"] == "mmap"
