"""Sampling across the parts of a partitioned graph: each rank holds one part, asks the owners of the vertices
its hops reach to draw their neighbours, and gets exactly the blocks the whole-graph ``NeighborSampler`` gives
for the same seeds and key (row pointers, local ids and frontiers, bit for bit); then fetches the input
vertices' feature rows and the seeds' labels from their owners, equal to the whole graph's. The ranks run as
threads of one process (``ThreadExchange``) and as gloo processes (``torch.distributed``, as ``torchrun`` starts
them)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from neutronorch.data import load_dataset
from neutronorch.data.partition import assign, write_partition
from neutronorch.data.partition_files import load_partition
from neutronorch.errors import ConfigError
from neutronorch.orchestration import remote_rows
from neutronorch.orchestration.remote_rows import ROUND_BYTES, RemoteRows
from neutronorch.sampling.exchange import ThreadExchange
from neutronorch.sampling.neighbor_sampler import NeighborSampler, batch_key
from neutronorch.sampling.partitioned import PartitionedSampler, global_in_degrees

SPEC = "synthetic:nodes=900,degree=7,homophily=0.8"
FANOUTS = [[3, 2], [-1, 2], [5, -1, 4]]


@pytest.fixture(scope="module")
def graph():
    return load_dataset(SPEC)


def partition_folders(graph, spec: str, cases, seed: int, tmp_path_factory) -> dict:
    """A partition folder of ``graph`` (read as ``spec``) per (method, parts) of ``cases``, by that key."""
    out = {}
    for method, parts in cases:
        folder = tmp_path_factory.mktemp("parts") / f"{method}-{parts}"
        write_partition(graph, assign(graph, parts, method, seed=seed), parts, folder, method, seed, spec)
        out[method, parts] = folder
    return out


@pytest.fixture(scope="module")
def folders(graph, tmp_path_factory):
    cases = [(method, parts) for method in ("random", "metis") for parts in (2, 4)]
    return partition_folders(graph, SPEC, cases, 1, tmp_path_factory)


def rank_batches(graph, parts: int, rank: int, batches: int = 3, size: int = 40) -> list[np.ndarray]:
    """Rank ``rank``'s share of a few global batches of training vertices; the last gives some ranks none."""
    train = np.asarray(graph.train_idx, dtype=np.int64)
    out = [np.array_split(train[k * size:(k + 1) * size], parts)[rank] for k in range(batches)]
    return out + [np.array_split(train[:1], parts)[rank]]


def assert_same(sub, full):
    assert torch.equal(sub.seeds, full.seeds)
    assert len(sub.blocks) == len(full.blocks)
    for mine, theirs in zip(sub.blocks, full.blocks):
        assert (mine.num_dst, mine.num_src) == (theirs.num_dst, theirs.num_src)
        assert torch.equal(mine.indptr, theirs.indptr) and torch.equal(mine.indices, theirs.indices)
        assert torch.equal(mine.src_ids, theirs.src_ids)
    for mine, theirs in zip(sub.frontiers, full.frontiers):
        assert torch.equal(mine, theirs)


def sample_all(graph, folder, parts: int, rank: int, exchange, fanouts, rows: bool = False) -> list:
    """Rank ``rank``'s batches sampled on its part and on the whole graph; with ``rows``, each batch's input
    rows and seeds' labels fetched from the owners are checked against the whole graph's."""
    part = load_partition(folder, rank, world_size=parts, verify=False)
    sampler = PartitionedSampler(part, exchange, fanouts)
    fetcher = RemoteRows(part, exchange)
    full = NeighborSampler(graph.indptr, graph.indices, fanouts)
    pairs = []
    for k, seeds in enumerate(rank_batches(graph, parts, rank)):
        key = batch_key(7, 0, k)
        pairs.append((sampler.sample(seeds, key), full.sample(seeds, key)))
        if rows:
            inputs = pairs[-1][0].frontiers[0].numpy()
            features, labels = fetcher.fetch(inputs, labelled=seeds.shape[0])
            assert features.dtype == graph.features.dtype and labels.dtype == graph.labels.dtype
            assert np.array_equal(features, graph.features[inputs])
            assert np.array_equal(labels, graph.labels[seeds])
            hidden = np.asarray(part.ids)[:, None] * np.array([[1.5, -2.0, 0.25]])  # any table held by local index
            got, none = fetcher.fetch(inputs, table=hidden)
            assert np.array_equal(got, inputs[:, None] * np.array([[1.5, -2.0, 0.25]])) and none.shape[0] == 0
    return pairs, sampler


def run_threads(target, parts: int) -> list:
    exchanges = ThreadExchange.group(parts, timeout=60)
    results, errors = [None] * parts, []

    def one(rank):
        try:
            results[rank] = target(rank, exchanges[rank])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            exchanges[rank]._shared["barrier"].abort()

    threads = [threading.Thread(target=one, args=(r,)) for r in range(parts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    if errors:
        raise errors[0]
    return results


def test_parts_keep_the_whole_graphs_in_edge_order(graph, folders):
    for (method, parts), folder in folders.items():
        for k in range(parts):
            part = load_partition(folder, k, verify=False)
            for i, v in enumerate(part.ids):
                assert np.array_equal(part.indices[part.indptr[i]:part.indptr[i + 1]],
                                      graph.indices[graph.indptr[v]:graph.indptr[v + 1]])


@pytest.mark.parametrize("parts", [2, 4])
@pytest.mark.parametrize("method", ["random", "metis"])
@pytest.mark.parametrize("fanouts", FANOUTS)
def test_threads_holding_one_part_each_sample_the_whole_graphs_blocks(graph, folders, method, parts, fanouts):
    results = run_threads(lambda rank, exchange: sample_all(graph, folders[method, parts], parts, rank, exchange,
                                                            fanouts), parts)
    asked = 0
    for pairs, sampler in results:
        for sub, full in pairs:
            assert_same(sub, full)
        asked += sampler.asked
        traffic = sampler.exchange.traffic()
        assert traffic["exchanges"] == 3 * len(fanouts) * len(pairs)  # ids (sizes announced), counts, neighbours
        assert traffic["sent_bytes"] > 0 and traffic["received_bytes"] > 0
    assert asked > 0  # the hops reached other parts' vertices
    assert sum(s.exchange.sent_bytes for _, s in results) == sum(s.exchange.received_bytes for _, s in results)
    assert sum(s.asked for _, s in results) == sum(s.served for _, s in results)


@pytest.mark.parametrize("parts", [2, 4])
def test_blocks_carry_their_sources_whole_graph_degrees_where_asked(graph, folders, parts):
    def rank(r, exchange):
        part = load_partition(folders["metis", parts], r, world_size=parts, verify=False)
        gather = lambda t: [torch.from_numpy(a) for a in exchange.all_to_all([t.numpy()] * parts)]  # noqa: E731
        degrees = global_in_degrees(part, gather)
        assert np.array_equal(degrees, np.diff(graph.indptr).astype(np.float32))
        sampler = PartitionedSampler(part, exchange, [5, 3], degrees)
        full = NeighborSampler(graph.indptr, graph.indices, [5, 3], degrees=True)
        for k, seeds in enumerate(rank_batches(graph, parts, r)):
            sub, whole = sampler.sample(seeds, batch_key(7, 0, k)), full.sample(seeds, batch_key(7, 0, k))
            assert_same(sub, whole)
            assert all(torch.equal(a.src_degree, b.src_degree) for a, b in zip(sub.blocks, whole.blocks))

    run_threads(rank, parts)


@pytest.mark.parametrize("parts,round_bytes", [(2, ROUND_BYTES), (4, ROUND_BYTES), (4, 1000)])
def test_threads_fetch_the_whole_graphs_feature_rows_and_labels(graph, folders, parts, round_bytes, monkeypatch):
    """With ``round_bytes`` of 1000, the replies come in rounds of a few rows each, labels across them."""
    monkeypatch.setattr(remote_rows, "ROUND_BYTES", round_bytes)
    results = run_threads(lambda rank, exchange: sample_all(graph, folders["metis", parts], parts, rank, exchange,
                                                            [4, 3], rows=True), parts)
    assert all(sampler.exchange.sent_bytes > 0 for _, sampler in results)
    calls = [sampler.exchange.calls for _, sampler in results]
    assert len(set(calls)) == 1  # every rank took as many rounds
    one_round = len(rank_batches(graph, parts, 0)) * (3 * 2 + 2 * 2)  # per batch: 2 hops of 3, 2 fetches of 2
    assert (calls[0] == one_round) == (round_bytes == ROUND_BYTES), (calls, one_round)


def test_bfloat16_rows_and_a_part_that_owns_nothing(tmp_path):
    from neutronorch.data.dtypes import narrowed  # noqa: PLC0415
    graph = load_dataset("synthetic:nodes=200,degree=4")
    graph.features = narrowed(graph.features, "bfloat16", "test")
    part_of = np.zeros(graph.num_nodes, dtype=np.int32)
    part_of[::2] = 2  # part 1 owns nothing, so its rank only asks
    write_partition(graph, (part_of, []), 3, tmp_path / "p", "random", 0, "test")

    def rank(r, exchange):
        pairs, sampler = sample_all(graph, tmp_path / "p", 3, r, exchange, [3, -1])
        part = sampler.part
        inputs = np.concatenate([sub.frontiers[0].numpy() for sub, _ in pairs])
        features, _ = RemoteRows(part, exchange).fetch(inputs)
        assert np.array_equal(features.view(np.uint16), graph.features[inputs].view(np.uint16))
        return pairs, sampler

    results = run_threads(rank, 3)
    for pairs, _ in results:
        for sub, full in pairs:
            assert_same(sub, full)
    assert results[1][1].served == 0 and results[1][1].asked > 0


def test_a_part_sampled_by_another_rank_is_refused(folders):
    part = load_partition(folders["random", 2], 0, verify=False)
    with pytest.raises(ConfigError, match="each rank samples the part of its number"):
        PartitionedSampler(part, ThreadExchange.group(2)[1], [2])


# ----- ranks as gloo processes, as torchrun starts them ---------------------------------------------------

JOIN_TIMEOUT = 180  # seconds the test waits for the ranks; collectives time out after DIST_TIMEOUT
DIST_TIMEOUT = 60


def spawn_ranks(target, parts: int, args: tuple, monkeypatch) -> None:
    """``target(rank, parts, *args)`` in ``parts`` spawned processes joined in a gloo group; fails (never hangs)
    when a rank fails or the ranks outlive ``JOIN_TIMEOUT``."""
    for name in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.setenv(name, "1")  # before the children start: numba reads its thread count at import
    context = torch.multiprocessing.spawn(target, args=(parts, *args), nprocs=parts, join=False)
    deadline = threading.Event()
    timer = threading.Timer(JOIN_TIMEOUT, deadline.set)
    timer.start()
    try:
        while not context.join(timeout=1):
            if deadline.is_set():
                for process in context.processes:
                    process.kill()
                pytest.fail(f"the {parts} ranks did not finish within {JOIN_TIMEOUT} s")
    finally:
        timer.cancel()


def joined_world(rank: int, parts: int, directory: str):
    import datetime  # noqa: PLC0415 - in the spawned process

    from neutronorch.train.distributed import World  # noqa: PLC0415
    torch.distributed.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=rank,
                                         world_size=parts, timeout=datetime.timedelta(seconds=DIST_TIMEOUT))
    return World(rank=rank, size=parts, backend="gloo", group=torch.distributed.group.WORLD,
                 host_group=torch.distributed.group.WORLD, timeout=DIST_TIMEOUT)


def _gloo_rank_samples(rank: int, parts: int, folder: str, directory: str, fanout_sets: list) -> None:
    from neutronorch.train.part_exchange import GlooExchange  # noqa: PLC0415 - in the spawned process
    world = joined_world(rank, parts, directory)
    try:
        graph = load_dataset(SPEC)
        exchange = GlooExchange(world)
        for fanouts in fanout_sets:
            pairs, _ = sample_all(graph, folder, parts, rank, exchange, fanouts, rows=True)
            for sub, full in pairs:
                assert_same(sub, full)
        assert exchange.sent_bytes > 0 and exchange.received_bytes > 0
    finally:
        torch.distributed.destroy_process_group()


def test_two_gloo_ranks_sample_the_whole_graphs_blocks(graph, folders, tmp_path, monkeypatch):
    spawn_ranks(_gloo_rank_samples, 2, (str(folders["random", 2]), str(tmp_path), [[3, 2], [-1, 2]]), monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["random", "metis"])
def test_four_gloo_ranks_sample_the_whole_graphs_blocks(graph, folders, tmp_path, monkeypatch, method):
    spawn_ranks(_gloo_rank_samples, 4, (str(folders[method, 4]), str(tmp_path), FANOUTS), monkeypatch)
