"""A cost model of partitioned training's bytes between ranks (docs/distributed.md, "Cost model"): per epoch and
rank, what the exchanges of ``sampling/partitioned.py`` (per hop: the ids, their counts, the neighbours),
``orchestration/remote_rows.py`` (the ids, the feature rows, the seeds' labels) and ``train/part_eval.py``
(per layer and chunk, the remote in-neighbours' rows) send, as ``sampling/exchange.py`` counts them.

The frontier of a hop is modelled per class of vertices of one (in-degree, out-degree) pair, and per cohort (the
hop a vertex joined the frontier at): a frontier vertex draws min(in-degree, fanout) of its in-neighbours, of
which the ones it already drew at earlier hops, and the one it was reached from, add nothing new; the fresh draws
land on a vertex with probability in proportion to its out-degree, so among d draws a vertex of out-degree o
outside the frontier joins it with probability 1 - exp(-d o / (sum of out-degrees)). A draw from a vertex of
this rank's part lands on another part with probability ``cut`` (the part's cut in-edges over its in-edges); a
draw from another part's vertex lands here with probability cut / (K - 1). NeutronOrch mode's bytes (hot rows
computed by their owners) are ``partition_cost_hot.py``'s. The model's bytes are expected values: a rank sends
what it receives, up to the parts' imbalance."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from neutronorch.errors import ConfigError
from neutronorch.sampling.exchange import SIZE_BYTES
from neutronorch.sampling.frontier_map import FRONTIER_MAP_BYTES

ID_BYTES, COUNT_BYTES, FLOAT_BYTES = 8, 4, 4  # an asked id (int64), a drawn count (int32), a hidden row's entry
DEALINGS = ("owner", "position")


@dataclass(frozen=True)
class Degrees:
    """The vertices by class: per class its in-degree, out-degree, vertices and training vertices."""

    in_deg: np.ndarray
    out_deg: np.ndarray
    count: np.ndarray
    train: np.ndarray

    @classmethod
    def uniform(cls, nodes: int, edges: int, train: int) -> "Degrees":
        """One class: every vertex with the mean degree (an assumption where the degrees are not known)."""
        mean = np.array([edges / nodes])
        return cls(mean, mean, np.array([float(nodes)]), np.array([float(train)]))

    @classmethod
    def of(cls, in_deg: np.ndarray, out_deg: np.ndarray, train_idx: np.ndarray) -> "Degrees":
        """The classes of a graph whose vertex v has ``in_deg[v]``, ``out_deg[v]``; ``train_idx`` its training
        vertices."""
        (ins, outs), count, (train,) = degree_classes([in_deg, out_deg], [train_idx])
        return cls(ins, outs, count, train)


def degree_classes(columns: list[np.ndarray], members: list[np.ndarray]
                   ) -> tuple[list[np.ndarray], np.ndarray, list[np.ndarray]]:
    """The classes of vertices of one degree vector (vertex v's: ``column[v]`` of each of ``columns``), in
    ascending order of the vectors: each column's value per class, the vertices per class, and per array of
    ``members`` (vertex ids) how many of them each class holds; all as floats."""
    table = np.stack([np.asarray(c, np.int64) for c in columns], axis=1)
    if table.shape[0] == 0:
        return [np.zeros(0) for _ in columns], np.zeros(0), [np.zeros(0) for _ in members]
    widths = table.max(axis=0) + 1
    if float(np.prod(widths.astype(float))) < 2.0**62:  # one int64 key per vertex: a faster unique than by rows
        keys = np.ravel_multi_index(tuple(table.T), tuple(int(w) for w in widths))
        first, inverse, count = np.unique(keys, return_index=True, return_inverse=True, return_counts=True)[1:]
        classes = table[first]
    else:
        classes, inverse, count = np.unique(table, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    held = [np.bincount(inverse[np.asarray(m, np.int64)], minlength=classes.shape[0]).astype(float) for m in members]
    return [classes[:, i].astype(float) for i in range(table.shape[1])], count.astype(float), held


@dataclass(frozen=True)
class CostInputs:
    """What the model reads. ``cut``: the fraction of the in-edges whose source another part owns (``part_cut``:
    per part, else ``cut`` for every part); ``part_nodes``, ``part_train``, ``part_eval``: per part its vertices,
    training vertices, validation and test vertices (else an equal share). ``batch_size``: seeds per rank and
    batch; ``dealing``: how a global batch of ``batch_size * ranks`` seeds is dealt to the ranks
    (``orchestration/seeds.py``): ``owner`` (each rank trains the seeds its part owns, as a partitioned run
    deals them) or ``position`` (split by position, as a full-copy run deals them). ``hot_ratio``: None for
    exact mode, else NeutronOrch mode at that hot ratio (``partition_cost_hot.py``), with super-batches of
    ``super_batch`` mini-batches and hot rows of ``hot_row_bytes`` a float (4: float32, 2: bfloat16)."""

    nodes: int
    edges: int
    train: int
    eval_nodes: int
    ranks: int
    fanouts: tuple[int, ...]
    batch_size: int
    feature_dim: int
    cut: float
    feature_bytes: int = 4
    hidden: int = 64
    neighbour_bytes: int = 4
    label_bytes: int = 8
    eval_batch_size: int = 4096
    dealing: str = "owner"
    hot_ratio: float | None = None
    super_batch: int = 8
    hot_row_bytes: int = 4
    degrees: Degrees | None = None
    part_cut: tuple[float, ...] | None = None
    part_nodes: tuple[int, ...] | None = None
    part_edges: tuple[int, ...] | None = None
    part_train: tuple[int, ...] | None = None
    part_eval: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.dealing not in DEALINGS:
            raise ConfigError(f"dealing {self.dealing!r}: give one of {', '.join(DEALINGS)}")
        if not 0 <= (self.hot_ratio or 0) <= 1 or not 0 <= self.cut <= 1:
            raise ConfigError(f"hot ratio {self.hot_ratio} and cut {self.cut} are fractions: give values in [0, 1]")
        if self.super_batch < 1:
            raise ConfigError(f"super-batch {self.super_batch}: give at least one mini-batch")
        if self.ranks < 1 or self.batch_size < 1 or not self.fanouts:
            raise ConfigError(f"ranks {self.ranks}, batch size {self.batch_size}, fanouts {self.fanouts}: give at "
                              f"least one rank, a batch of at least one seed and one fanout")

    def share(self, name: str, rank: int) -> float:
        """Part ``rank``'s ``part_<name>`` where given, else its equal share of the whole."""
        per_part = getattr(self, f"part_{name}")
        if per_part is not None:
            return float(per_part[rank])
        whole = {"nodes": self.nodes, "edges": self.edges, "train": self.train, "eval": self.eval_nodes,
                 "cut": None}[name]
        return self.cut if whole is None else whole / self.ranks


class Walk:
    """A batch's frontier of ``seeds`` on rank ``rank`` as its hops add to it (``frontier``): per class and per
    cohort (the hop a vertex joined at, cohort 0 the seeds), the share of this rank's vertices (``own``) and of
    other ranks' (``remote``) in the frontier, and per cohort the share of its in-edges drawn already."""

    def __init__(self, inputs: CostInputs, rank: int, seeds: float):
        deg = inputs.degrees or Degrees.uniform(inputs.nodes, inputs.edges, inputs.train)
        k, share = inputs.ranks, inputs.share("nodes", rank) / inputs.nodes
        self.deg, self.cut_here = deg, inputs.share("cut", rank)
        self.cut_in = inputs.cut / (k - 1) if k > 1 else 0.0  # of another part's draws, the share landing here
        self.own_pool, self.remote_pool = deg.count * share, deg.count * (1 - share)
        seed_rate = np.divide(deg.train, deg.count, out=np.zeros_like(deg.count), where=deg.count > 0)
        if inputs.dealing == "position":
            self.own, self.remote = [seed_rate * seeds / inputs.train], [seed_rate * seeds / inputs.train]
        else:
            self.own = [seed_rate * seeds / max(1.0, inputs.share("train", rank))]
            self.remote = [np.zeros_like(deg.count)]
        self.covered = [np.zeros_like(deg.count)]  # per cohort: the share of its in-edges it has drawn
        self.in_deg = np.maximum(deg.in_deg, 1.0)
        self.draws_into: list[tuple[float, float]] = []

    def draws(self, fanout: int) -> np.ndarray:
        return self.deg.in_deg if fanout < 0 else np.minimum(self.deg.in_deg, fanout)

    def summary(self, draws: np.ndarray | None) -> dict:
        """The frontier's expected vertices of this rank and of others, and the draws of the remote ones."""
        own_now, remote_now = sum(self.own), sum(self.remote)
        remote_draws = 0.0 if draws is None else float((remote_now * self.remote_pool * draws).sum())
        return {"own": float((own_now * self.own_pool).sum()), "remote": float((remote_now * self.remote_pool).sum()),
                "remote_draws": remote_draws}

    def landing(self, draws: np.ndarray, keep_own=None, keep_remote=None) -> tuple[np.ndarray, np.ndarray]:
        """Per class, the chance that a vertex of this rank's part and of another's is hit by the fresh draws of
        the frontier's vertices (of each cohort's only the share ``keep_own[i]``, ``keep_remote[i]`` drawing)."""
        keep_own = keep_own or [1.0] * len(self.own)
        keep_remote = keep_remote or [1.0] * len(self.remote)
        fresh = [draws * (1 - c) for c in self.covered]
        d_own = sum(float((a * s * self.own_pool * f).sum()) for a, s, f in zip(self.own, keep_own, fresh))
        d_remote = sum(float((z * s * self.remote_pool * f).sum()) for z, s, f in zip(self.remote, keep_remote, fresh))
        land_own = d_own * (1 - self.cut_here) + d_remote * self.cut_in
        land_remote = d_own * self.cut_here + d_remote * (1 - self.cut_in)
        self.landed = (land_own, land_remote)
        return (-np.expm1(-land_own * landing_weights(self.deg.out_deg, self.own_pool)),
                -np.expm1(-land_remote * landing_weights(self.deg.out_deg, self.remote_pool)))

    def advance(self, draws: np.ndarray) -> None:
        """One hop: every frontier vertex draws ``draws`` (per class) of its in-neighbours."""
        hit_own, hit_remote = self.landing(draws)
        own_now, remote_now = sum(self.own), sum(self.remote)
        self.own.append((1 - own_now) * hit_own)
        self.remote.append((1 - remote_now) * hit_remote)
        self.draws_into.append(self.landed)  # the fresh draws landing in each pool, of which the new cohort came
        self.covered = [1 - (1 - c) * (1 - draws / self.in_deg) for c in self.covered] + [
            np.minimum(1.0, 1 / self.in_deg)]


def frontier(inputs: CostInputs, rank: int, seeds: float) -> list[dict]:
    """Per hop of a batch of ``seeds`` on rank ``rank``: the frontier's expected vertices this rank owns and
    other ranks own (``own``, ``remote``), the draws of its remote vertices (``remote_draws``), and after the
    last hop the input frontier."""
    walk, hops = Walk(inputs, rank, seeds), []
    for fanout in inputs.fanouts:
        draws = walk.draws(fanout)
        hops.append(walk.summary(draws))
        walk.advance(draws)
    hops.append(walk.summary(None))
    return hops


def landing_weights(out_deg: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """Per class, the chance one draw into ``pool`` lands on a given vertex of the class (by out-degree)."""
    total = float((out_deg * pool).sum())
    return out_deg / total if total > 0 else np.zeros_like(out_deg)


def batch_bytes(inputs: CostInputs, rank: int, seeds: float) -> dict[str, float]:
    """The bytes rank ``rank`` receives (and, in expectation, sends) in one batch of ``seeds``, by what they
    carry: ``sampling`` (the ids asked, the counts, the neighbours, the announced sizes) and ``rows`` (the ids
    asked and their count of seeds, the sizes, the feature rows, the seeds' labels), in exact mode."""
    k = inputs.ranks
    others = k - 1
    hops = frontier(inputs, rank, seeds)
    sampling = 0.0
    for hop in hops[:-1]:
        sampling += hop["remote"] * (ID_BYTES + COUNT_BYTES) + hop["remote_draws"] * inputs.neighbour_bytes
        sampling += SIZE_BYTES * others
    last = hops[-1]
    remote_seeds = hops[0]["remote"]
    rows = (last["remote"] * (ID_BYTES + inputs.feature_dim * inputs.feature_bytes) + remote_seeds * inputs.label_bytes
            + 2 * SIZE_BYTES * others)  # a count of seeds to each rank, and the request's sizes
    return {"sampling": sampling, "rows": rows, "input_rows": last["own"] + last["remote"]}


def rank_batches(inputs: CostInputs, rank: int) -> list[tuple[float, int]]:
    """The epoch's batches for rank ``rank``, as (its seeds, how many such batches): the global batches of
    ``batch_size * ranks`` seeds, of which it trains a share by position (``torch.tensor_split``) or the seeds
    its part owns (in expectation its part's share of the training vertices)."""
    k, b = inputs.ranks, inputs.batch_size
    full, rest = divmod(inputs.train, b * k)
    if inputs.dealing == "position":
        last = rest // k + (rank < rest % k)  # tensor_split: the first rest % k ranks take one more
    else:
        b = b * k * inputs.share("train", rank) / inputs.train
        last = rest * inputs.share("train", rank) / inputs.train
    return [(float(b), full)] + ([(float(last), 1)] if rest else [])


def training_bytes(inputs: CostInputs, rank: int) -> dict[str, float]:
    """An epoch's training bytes of rank ``rank`` in exact mode, by what they carry (``batch_bytes``), and their
    ``total``. NeutronOrch mode's (``hot_ratio`` given) are ``partition_cost_hot.neutronorch_bytes``'s."""
    if inputs.hot_ratio is not None:
        raise ConfigError(f"hot ratio {inputs.hot_ratio}: this is exact mode's model; NeutronOrch mode's bytes are "
                          f"partition_cost_hot.neutronorch_bytes's. Give hot_ratio None here, or call that.")
    out = {"sampling": 0.0, "rows": 0.0}
    for seeds, count in rank_batches(inputs, rank):
        if count <= 0:
            continue
        got = batch_bytes(inputs, rank, seeds) if seeds > 0 else empty_batch_bytes(inputs)
        for key in out:
            out[key] += got[key] * count
    out["total"] = sum(out.values())
    return out


def empty_batch_bytes(inputs: CostInputs) -> dict[str, float]:
    """A batch in which this rank has no seeds still takes part in every exchange: the sizes and seed counts."""
    others = inputs.ranks - 1
    return {"sampling": SIZE_BYTES * others * len(inputs.fanouts), "rows": 2 * SIZE_BYTES * others}


def distinct_remote(inputs: CostInputs, rank: int, in_edges: float) -> float:
    """Expected distinct vertices of other parts among the sources of ``in_edges`` in-edges of rank ``rank``'s
    vertices (all their in-edges, as full-neighbour inference reads them): the cut share of them, landing by
    out-degree on the other parts' vertices."""
    deg = inputs.degrees or Degrees.uniform(inputs.nodes, inputs.edges, inputs.train)
    pool = deg.count * (1 - inputs.share("nodes", rank) / inputs.nodes)
    landing = in_edges * inputs.share("cut", rank)
    return float((pool * -np.expm1(-landing * landing_weights(deg.out_deg, pool))).sum())


def evaluation_bytes(inputs: CostInputs, rank: int) -> dict[str, float]:
    """One full-neighbour evaluation's bytes of rank ``rank``: per layer, the chunks' remote in-neighbours'
    rows (the features, then ``hidden`` floats) and their ids, every rank taking as many chunks as the rank with
    the most; the last layer for the owned validation and test vertices only."""
    k, chunk, layers = inputs.ranks, inputs.eval_batch_size, len(inputs.fanouts)
    others = k - 1
    mean_in = inputs.share("edges", rank) / inputs.share("nodes", rank)
    out, first_layer = {"ids": 0.0, "rows": 0.0, "sizes": 0.0}, 0.0
    for layer in range(layers):
        name = "nodes" if layer < layers - 1 else "eval"
        mine = inputs.share(name, rank)
        chunks = max(math.ceil(inputs.share(name, r) / chunk) for r in range(k))
        width = inputs.feature_dim * inputs.feature_bytes if layer == 0 else inputs.hidden * FLOAT_BYTES
        full, rest = divmod(int(mine), chunk)
        for size, count in ((chunk, full), (rest, 1 if rest else 0)):
            remote = distinct_remote(inputs, rank, size * mean_in) * count
            out["ids"] += remote * ID_BYTES
            out["rows"] += remote * width
            first_layer += remote if layer == 0 else 0.0
        out["sizes"] += SIZE_BYTES * others * (1 + 2 * chunks)  # the chunk count; per fetch a seed count, sizes
    out["total"] = sum(out.values())
    out["first_layer_rows"] = first_layer  # rows, not bytes: what a disk serves
    return out


def of_partition(folder, fanouts, batch_size: int, hidden: int = 64, **options) -> CostInputs:
    """``CostInputs`` of a partition folder (``neutronorch partition``): its sizes, per part cut, vertices and
    splits from the manifest, and the degree classes from the parts' in-edges (every part read once)."""
    folder = Path(folder)
    manifest = json.loads((folder / "partition.json").read_text())
    graph, stats = manifest["graph"], manifest["part_stats"]
    n = graph["num_nodes"]
    in_deg, out_deg = np.zeros(n, np.int64), np.zeros(n, np.int64)
    for part in range(manifest["parts"]):
        sub = folder / f"part-{part}"
        ids = np.load(sub / "ids.npy", mmap_mode="r")
        in_deg[ids] = np.diff(np.load(sub / "indptr.npy", mmap_mode="r"))
        out_deg += np.bincount(np.load(sub / "indices.npy", mmap_mode="r"), minlength=n)
    train_idx = np.load(folder / "train_idx.npy", mmap_mode="r")
    indices_dtype = np.load(folder / "part-0" / "indices.npy", mmap_mode="r").dtype
    feature_bytes = {"float32": 4, "float16": 2, "bfloat16": 2}.get(graph["feature_dtype"], 4)
    values = dict(nodes=n, edges=graph["num_edges"], train=int(train_idx.shape[0]),
                  eval_nodes=sum(s["val"] + s["test"] for s in stats), ranks=manifest["parts"],
                  fanouts=tuple(fanouts), batch_size=batch_size, feature_dim=graph["feature_dim"],
                  cut=manifest["edge_cut"]["fraction"], feature_bytes=feature_bytes, hidden=hidden,
                  neighbour_bytes=indices_dtype.itemsize, degrees=Degrees.of(in_deg, out_deg, train_idx),
                  part_cut=tuple(s["cut_edges"] / max(1, s["edges"]) for s in stats),
                  part_nodes=tuple(s["nodes"] for s in stats), part_edges=tuple(s["edges"] for s in stats),
                  part_train=tuple(s["train"] for s in stats),
                  part_eval=tuple(s["val"] + s["test"] for s in stats))
    return replace(CostInputs(**values), **options)


def machine_memory(inputs: CostInputs, layers_kept: int = 2) -> dict[str, float]:
    """Bytes one machine (one rank) holds of an equal part: the part's features and topology (CSC offsets and
    in-neighbours), its ids and labels, the whole graph's id maps (``part_of`` int32, ``local_index`` int32
    below 2**31 rows a part) and split, the vertex maps of the sampler and of evaluation (sized to a batch's
    input frontier and to an evaluation chunk's: ``FRONTIER_MAP_BYTES`` a vertex at most), and evaluation's
    ``layers_kept`` layers of ``hidden`` floats for the part's vertices."""
    n, k = inputs.nodes, inputs.ranks
    part = n / k
    local_bytes = 4 if part < 2**31 else 8
    memory = {"features": part * inputs.feature_dim * inputs.feature_bytes,
              "topology": 8 * (part + 1) + inputs.neighbour_bytes * inputs.edges / k,
              "ids_labels": part * (8 + inputs.label_bytes),
              "id_maps": n * (4 + local_bytes) + 8 * (inputs.train + inputs.eval_nodes),
              "vertex_maps": FRONTIER_MAP_BYTES * (sum(frontier(inputs, 0, inputs.batch_size)[-1][where]
                                                       for where in ("own", "remote"))
                                                   + min(n, inputs.eval_batch_size * (1 + inputs.edges / n))),
              "evaluation_rows": layers_kept * part * inputs.hidden * FLOAT_BYTES}
    memory["total"] = sum(memory.values())
    return memory


def epoch_seconds(inputs: CostInputs, network_gbit: float, disk_gb: float | None = None,
                  page_bytes: int = 4096, train: dict | None = None) -> dict[str, float]:
    """Seconds rank 0's bytes take in an epoch and its evaluation: at ``network_gbit`` Gbit/s each way (a rank
    sends what it receives, at once), and, with ``disk_gb``, the feature rows read from a disk of that many
    GB/s (the features not in memory: every input row a batch reads, its own and those it serves, and every
    row of the part once in evaluation's first layer, each row at least a ``page_bytes`` read). ``train``: rank
    0's training bytes of NeutronOrch mode (``partition_cost_hot.neutronorch_bytes``, whose ``input_rows`` are
    the cold batches' and those its hot rows read); default exact mode's."""
    if inputs.hot_ratio is not None and train is None:
        raise ConfigError(f"hot ratio {inputs.hot_ratio}: give NeutronOrch mode's training bytes as `train` "
                          f"(partition_cost_hot.neutronorch_bytes(inputs, 0))")
    train, evaluation = train or training_bytes(inputs, 0), evaluation_bytes(inputs, 0)
    per_second = network_gbit * 1e9 / 8
    out = {"train_network": train["total"] / per_second, "eval_network": evaluation["total"] / per_second}
    if disk_gb:
        row = max(page_bytes, inputs.feature_dim * inputs.feature_bytes)
        rows = train["input_rows"] if inputs.hot_ratio is not None else sum(
            batch_bytes(inputs, 0, seeds)["input_rows"] * count
            for seeds, count in rank_batches(inputs, 0) if seeds > 0)
        part = inputs.share("nodes", 0)
        out["train_disk"] = rows * row / (disk_gb * 1e9)
        out["eval_disk"] = (part + evaluation["first_layer_rows"]) * row / (disk_gb * 1e9)
    return out
