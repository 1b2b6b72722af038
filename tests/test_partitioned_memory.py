"""What a partitioned rank holds while it trains and evaluates (docs/results/partitioned-memory-2026-12-07.md):
a batch's fetched rows go into buffers reused from batch to batch, an evaluation's chunks into one buffer, a
rank's own rows are read into a fetch's output without a copy of them all on the way, and an evaluation's
freed blocks go back to the system instead of staying in the heap."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
import torch

import neutronorch
from neutronorch.data import load_dataset
from neutronorch.data.partition import assign, write_partition
from neutronorch.data.partition_files import load_partition
from neutronorch.nn.models import GNN
from neutronorch.orchestration import remote_rows
from neutronorch.orchestration.remote_rows import RemoteRows, RowBuffers, rows_bytes
from neutronorch.sampling.exchange import ThreadExchange
from neutronorch.sampling.frontier_map import FrontierMap
from neutronorch.train import part_eval
from neutronorch.train import run as run_module
from neutronorch.train.distributed import World
from neutronorch.train.evaluate import eval_subset
from neutronorch.train.part_eval import PartEvaluation

GRAPH = "synthetic:nodes=3000,features=16,degree=8"


@pytest.fixture(scope="module")
def one_part(tmp_path_factory):
    graph = load_dataset(GRAPH)
    folder = tmp_path_factory.mktemp("parts") / "p1"
    write_partition(graph, assign(graph, 1, "random", seed=0), 1, folder, "random", 0, GRAPH)
    return graph, folder


def test_row_buffers_hand_out_a_free_one_large_enough_never_block_and_keep_at_most_their_count():
    buffers = RowBuffers(2)
    first = buffers.take(1000)
    assert first.dtype == np.uint8 and first.shape[0] >= 1000
    buffers.give_back(first)
    assert buffers.take(900) is first  # large enough: reused
    held = [buffers.take(1000) for _ in range(5)]  # none free: new ones, never a wait
    assert len({id(b) for b in held + [first]}) == 6
    for buffer in held:
        buffers.give_back(buffer)
    assert len(buffers._free) == 2
    larger = buffers.take(10_000)  # none large enough: the smallest free one makes way
    assert larger.shape[0] >= 10_000 and len(buffers._free) == 1
    buffers.drop()
    assert buffers._free == [] and buffers.take(10) is not larger


def test_a_fetch_writes_into_the_buffer_given_without_a_copy_of_the_own_rows(one_part, monkeypatch):
    graph, folder = one_part
    part = load_partition(folder, 0, verify=False)
    fetcher = RemoteRows(part, ThreadExchange.group(1)[0])
    ids = np.random.default_rng(0).permutation(graph.num_nodes).astype(np.int64)
    table = np.random.default_rng(1).random((graph.num_nodes, 256))  # 6 MB of rows, held by local index
    into = np.empty(rows_bytes(ids.shape[0], table), np.uint8)
    monkeypatch.setattr(remote_rows, "OWN_ROWS", 64)
    tracemalloc.start()
    try:
        rows, _ = fetcher.fetch(ids, table=table, into=into)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert np.array_equal(rows, table[np.asarray(part.local_index)[ids]])
    assert np.shares_memory(rows, into)
    assert peak < table.nbytes / 8, peak  # the ids' own bookkeeping only: no array of all the rows
    features, labels = fetcher.fetch(ids[:500], labelled=100, into=np.empty(rows_bytes(500, part.features), np.uint8))
    assert np.array_equal(features, graph.features[ids[:500]]) and np.array_equal(labels, graph.labels[ids[:100]])


def test_an_evaluation_holds_a_chunk_sized_vertex_map_and_chunk_buffer_only_while_it_evaluates(one_part):
    graph, folder = one_part
    part = load_partition(folder, 0, verify=False)
    evaluation = PartEvaluation(part, ThreadExchange.group(1)[0], World())
    empty = FrontierMap()._table.nbytes
    assert evaluation._map._table.nbytes == empty and evaluation._buffer.nbytes == 0
    net = GNN("sage", graph.feature_dim, 8, graph.num_classes, 2).eval()
    nodes = np.asarray(graph.test_idx, dtype=np.int64)
    logits = evaluation.logits(net, nodes, torch.device("cpu"), 300)
    assert logits.shape == (nodes.shape[0], graph.num_classes) and torch.isfinite(logits).all()
    assert evaluation._map._table.nbytes == empty and evaluation._buffer.nbytes == 0


def test_an_evaluation_chunk_fetches_no_more_rows_than_its_budget_and_gives_the_same_logits(one_part, monkeypatch):
    """A chunk stops at ``chunk_size`` destinations or at ``EVAL_CHUNK_BYTES`` of rows (each destination with its
    in-neighbours, one alone whatever its degree): a hub's chunk fetches no more than it must."""
    graph, folder = one_part
    part = load_partition(folder, 0, verify=False)
    net = GNN("sage", graph.feature_dim, 8, graph.num_classes, 2).eval()
    nodes = np.asarray(graph.test_idx, dtype=np.int64)
    evaluation = PartEvaluation(part, ThreadExchange.group(1)[0], World())
    whole = evaluation.logits(net, nodes, torch.device("cpu"), 300)
    budget_rows = 50  # rows of the features a chunk may fetch
    monkeypatch.setattr(part_eval, "EVAL_CHUNK_BYTES", budget_rows * part.features[0].nbytes)
    owned = np.asarray(part.ids)
    bounds = evaluation._bounded(owned, 300, None)
    rows = np.diff(np.asarray(part.indptr))[part.local(owned)] + 1
    assert bounds[0][0] == 0 and bounds[-1][1] == owned.shape[0] and len(bounds) > owned.shape[0] // 300
    assert all(end - start == 1 or rows[start:end].sum() <= budget_rows for start, end in bounds)
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    torch.testing.assert_close(evaluation.logits(net, nodes, torch.device("cpu"), 300), whole, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("max_nodes", [0, 70])
def test_a_rank_finds_its_evaluated_vertices_a_block_at_a_time_as_from_all_of_them(tmp_path, monkeypatch, max_nodes):
    """``evaluated`` reads the whole graph's validation and test vertices a block at a time instead of copying
    them all: the same count, positions and vertices as found from all of them (``eval_subset``'s sample too)."""
    graph = load_dataset(GRAPH)
    write_partition(graph, assign(graph, 3, "random", seed=0), 3, tmp_path / "p3", "random", 0, GRAPH)
    monkeypatch.setattr(part_eval, "SCAN_BLOCK", 7)
    config = neutronorch.TrainConfig(eval_max_nodes=max_nodes, seed=4)
    nodes = np.concatenate([eval_subset(graph.val_idx, max_nodes, 4), eval_subset(graph.test_idx, max_nodes, 5)])
    found = []
    for rank in range(3):
        evaluation = PartEvaluation(load_partition(tmp_path / "p3", rank, verify=False), None, World())
        split, positions, own = evaluation.evaluated(config)
        assert split == (max_nodes or len(graph.val_idx)) and np.array_equal(own, nodes[positions])
        assert np.array_equal(positions, np.flatnonzero(np.asarray(evaluation.part.part_of[nodes]) == rank))
        assert np.array_equal(evaluation.evaluated_nodes(config), nodes)
        found.append(positions)
    assert sorted(np.concatenate(found).tolist()) == list(range(nodes.shape[0]))


def test_a_one_part_run_reuses_its_batches_and_chunks_buffers_and_evaluates_with_freed_blocks_returned(
        one_part, tmp_path, monkeypatch):
    _, folder = one_part
    taken, into, entered = [], [], []
    take, fetch, evaluate = RowBuffers.take, RemoteRows.fetch, PartEvaluation.evaluate

    def spy_take(self, nbytes):
        buffer = take(self, nbytes)
        taken.append(buffer.ctypes.data)
        return buffer

    def spy_fetch(self, ids, labelled=0, table=None, into_=None, **kwargs):
        buffer = kwargs.get("into", into_)
        if entered and entered[-1] == "evaluating":
            into.append(None if buffer is None else buffer.ctypes.data)
        return fetch(self, ids, labelled, table, buffer)

    @contextlib.contextmanager
    def returned():
        entered.append("returned")
        yield
        entered.append("left")

    def spy_evaluate(self, *args, **kwargs):
        entered.append("evaluating")
        try:
            return evaluate(self, *args, **kwargs)
        finally:
            entered.append("evaluated")

    monkeypatch.setattr(RowBuffers, "take", spy_take)
    monkeypatch.setattr(RemoteRows, "fetch", spy_fetch)
    monkeypatch.setattr(PartEvaluation, "evaluate", spy_evaluate)
    monkeypatch.setattr(run_module, "freed_blocks_returned", returned)
    neutronorch.train(neutronorch.TrainConfig(partitions=str(folder), hidden=16, fanouts=[4, 4], epochs=1,
                                              batch_size=20, threads=1, sampler_threads=1, device="cpu",
                                              eval_batch_size=200, prefetch=2))
    assert len(taken) >= 15 and len(set(taken)) <= len(taken) // 2  # a batch's rows: a buffer used before
    assert len(into) >= 20 and None not in into and len(set(into)) <= 4  # every chunk: the evaluation's buffer
    assert entered == ["returned", "evaluating", "evaluated", "left"]


_FREED = """
import re, torch
from neutronorch.train.resources import freed_blocks_returned, keep_freed_memory

def anon():
    return int(re.search(r"RssAnon:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) // 1024

kept = keep_freed_memory()
with freed_blocks_returned():
    block = torch.ones(64 << 18)  # 64 MiB, touched
    held = anon()
    del block
    returned = held - anon()
block = torch.ones(64 << 18)
held = anon()
del block
print(kept, returned, held - anon())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_blocks_freed_inside_go_back_to_the_system_and_are_kept_again_after():
    kept, returned, after = subprocess.run([sys.executable, "-c", _FREED], capture_output=True, text=True,
                                           check=True).stdout.split()
    if kept != "True":
        pytest.skip("not glibc: nothing is tuned")
    assert int(returned) >= 60  # its own mapping, unmapped when freed
    assert int(after) <= 4  # kept in the heap for reuse, as before


def _mapped_rss_kb(path) -> int:
    """This process's resident kB of the mappings of ``path`` (``/proc/self/smaps``)."""
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        if "-" in line.split(" ", 1)[0]:
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps")
def test_a_file_read_once_leaves_the_resident_memory_and_reads_the_same_after(tmp_path):
    from neutronorch.data.files import open_npy, release_pages

    path = tmp_path / "ids.npy"
    np.save(path, np.arange(1 << 20, dtype=np.int64))  # 8 MiB
    ids = open_npy(path, "ids")
    assert int(ids.sum()) == (1 << 20) * ((1 << 20) - 1) // 2 and _mapped_rss_kb(path) >= 4096
    release_pages(ids)
    assert _mapped_rss_kb(path) < 1024
    assert int(ids[12345]) == 12345 and int(ids.sum()) == (1 << 20) * ((1 << 20) - 1) // 2
    release_pages(np.arange(3))  # an array in memory: nothing


def test_threads_opening_arrays_at_once_parse_one_header_at_a_time(tmp_path, monkeypatch):
    """numpy parses a .npy header with ``ast.literal_eval``, which CPython 3.11 may fail with a spurious
    SystemError when threads parse at once (ranks held by threads open their parts together)."""
    import threading
    import time

    from neutronorch.data import files

    np.save(tmp_path / "a.npy", np.arange(10))
    load, active, most = np.load, [0], [0]

    def slow_load(*args, **kwargs):
        active[0] += 1
        most[0] = max(most[0], active[0])
        time.sleep(0.02)
        active[0] -= 1
        return load(*args, **kwargs)

    monkeypatch.setattr(files.np, "load", slow_load)
    threads = [threading.Thread(target=files.open_npy, args=(tmp_path / "a.npy", "ids")) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert most[0] == 1
