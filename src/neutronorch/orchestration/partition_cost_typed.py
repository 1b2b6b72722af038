"""The cost model of a typed graph's parts (docs/distributed.md, "Cost model", "Typed graphs"): per epoch and
rank, the bytes that ``sampling/partitioned_typed.py`` (per hop one round for every relation: the ids per
destination type with each relation's header, the counts, the neighbours), ``train/part_typed.py`` (per batch
each featured type's input rows) and ``train/part_tables.py`` (per batch the featureless types' table rows
fetched from their owners, then their gradient rows sent back) send, as ``sampling/exchange.py`` counts them;
and the sampled evaluation, which fetches as a training batch does, without the gradients.

The frontier is ``partition_cost.py``'s, per type: the vertices of a type are grouped by their degree vector
(in-degree through each relation into the type, out-degree through each relation out of it), and per cohort
(the hop a vertex joined at) the model follows each class's share of the frontier, this rank's part apart from
the others'. A frontier vertex of type t draws, through each relation r into t, min(in-degree, fanout) of its
in-neighbours, of which the ones it drew through r at earlier hops, and the one it was reached from (through
r's reverse), add nothing new; the fresh draws land on r's source type by out-degree through r, a draw of this
part's vertex on another part with r's cut of this part, another part's on this one with r's cut / (K - 1)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from neutronorch.data.relation import RelationType
from neutronorch.data.typed import reverse_relation
from neutronorch.errors import ConfigError
from neutronorch.orchestration.partition_cost import (COUNT_BYTES, FLOAT_BYTES, ID_BYTES, degree_classes,
                                                      landing_weights, rank_batches)
from neutronorch.sampling.exchange import SIZE_BYTES
from neutronorch.sampling.partitioned_typed import HEADER

LANES = ("sampling", "rows", "tables")  # the run's lanes: "sampling" holds the model's sampling and rows


@dataclass(frozen=True)
class TypeClasses:
    """One type's vertices by class: per class its vertices, training and evaluated (validation and test)
    vertices, and its in-degree through each relation into the type and out-degree through each out of it."""

    count: np.ndarray
    train: np.ndarray
    evals: np.ndarray
    in_deg: dict
    out_deg: dict

    @classmethod
    def uniform(cls, nodes: int, ins: dict, outs: dict, train: int = 0, evals: int = 0) -> "TypeClasses":
        """One class at the mean degrees (``ins``, ``outs``: each relation's edges)."""
        one = np.ones(1)
        return cls(one * nodes, one * train, one * evals, {r: one * e / max(1, nodes) for r, e in ins.items()},
                   {r: one * e / max(1, nodes) for r, e in outs.items()})


@dataclass(frozen=True)
class TypedCostInputs:
    """What the model reads: per type its vertices (``num_nodes``) and feature width (``feature_dims``, 0 for a
    featureless type, whose embedding table of ``table_width`` floats is split by owner when ``tables``), per
    relation its edges and cut (the share of its in-edges whose source another part owns; per part in
    ``part_cut``), the target's training and evaluated vertices, ``ranks``, ``fanouts`` (every relation's, the
    seeds' hop first), ``batch_size`` seeds per rank and batch, and ``eval_fanouts`` / ``eval_batch_size`` of
    the sampled evaluation. ``part_nodes`` (per part, per type), ``part_train``, ``part_eval``: else equal
    shares. ``classes``: per type its ``TypeClasses``, else one class at the mean degrees. ``feature_bytes``:
    the bytes of a feature, for every type or per type. Seeds are dealt by owner, as a typed graph's parts deal
    them. ``hot_ratio``: None for exact mode, else NeutronOrch mode at that ratio with super-batches of
    ``super_batch`` mini-batches (``partition_cost_typed_hot.py``)."""

    num_nodes: dict
    relations: dict
    target: str
    train: int
    eval_nodes: int
    ranks: int
    fanouts: tuple
    batch_size: int
    feature_dims: dict
    cut: dict
    feature_bytes: int | dict = 4
    hidden: int = 64
    table_width: int | None = None
    tables: bool = True
    eval_fanouts: tuple | None = None
    eval_batch_size: int = 4096
    classes: dict | None = None
    part_cut: tuple | None = None
    part_nodes: tuple | None = None
    part_train: tuple | None = None
    part_eval: tuple | None = None
    hot_ratio: float | None = None
    super_batch: int = 8
    dealing: str = field(default="owner", init=False)

    def __post_init__(self):
        if self.ranks < 1 or self.batch_size < 1 or not self.fanouts:
            raise ConfigError(f"ranks {self.ranks}, batch size {self.batch_size}, fanouts {self.fanouts}: give at "
                              f"least one rank, a batch of at least one seed and one fanout")
        if self.target not in self.num_nodes:
            raise ConfigError(f"target {self.target!r} is not one of the types {', '.join(self.num_nodes)}")
        unknown = [r for r in self.relations if r[0] not in self.num_nodes or r[2] not in self.num_nodes]
        if unknown or set(self.cut) != set(self.relations):
            raise ConfigError(f"relations {unknown or sorted(set(self.cut) ^ set(self.relations))}: every relation "
                              f"joins two of the types and has a cut; give both")
        if not 0 <= (self.hot_ratio or 0) <= 1 or self.super_batch < 1:
            raise ConfigError(f"hot ratio {self.hot_ratio}, super-batch {self.super_batch}: give a ratio in [0, 1] "
                              f"and at least one mini-batch a super-batch")
        if not all(0 <= c <= 1 for c in self.cut.values()):
            raise ConfigError(f"cuts {self.cut}: each is a fraction; give values in [0, 1]")

    def share(self, name: str, rank: int) -> float:
        """Part ``rank``'s training (``train``) or evaluated (``eval``) vertices, else an equal share."""
        per_part = {"train": self.part_train, "eval": self.part_eval}[name]
        whole = {"train": self.train, "eval": self.eval_nodes}[name]
        return float(per_part[rank]) if per_part is not None else whole / self.ranks

    def nodes_of(self, node_type: str, rank: int) -> float:
        if self.part_nodes is not None:
            return float(self.part_nodes[rank][node_type])
        return self.num_nodes[node_type] / self.ranks

    def cut_of(self, relation: RelationType, rank: int) -> float:
        return float(self.part_cut[rank][relation]) if self.part_cut is not None else self.cut[relation]

    def classes_of(self, node_type: str) -> TypeClasses:
        if self.classes is not None:
            return self.classes[node_type]
        ins = {r: e for r, e in self.relations.items() if r[2] == node_type}
        outs = {r: e for r, e in self.relations.items() if r[0] == node_type}
        target = node_type == self.target
        return TypeClasses.uniform(self.num_nodes[node_type], ins, outs, self.train if target else 0,
                                   self.eval_nodes if target else 0)

    def row_bytes(self, node_type: str) -> int:
        """The bytes of one of ``node_type``'s features (``feature_bytes``: one for every type, or per type)."""
        given = self.feature_bytes
        return int(given.get(node_type, 4)) if isinstance(given, dict) else int(given)

    @property
    def table_types(self) -> list[str]:
        """The featureless types, whose embedding tables are split by owner (none without ``tables``)."""
        return [t for t in self.num_nodes if not self.feature_dims.get(t)] if self.tables else []


class TypedWalk:
    """A batch's frontier of ``seeds`` target vertices on rank ``rank`` as its hops add to it: per type, class
    and cohort the share of this part's vertices (``own``) and of other parts' (``remote``) in the frontier, and
    per cohort and relation into the type the share of its in-edges drawn already (``covered``). ``evaluated``:
    the seeds are evaluated vertices, else training ones."""

    def __init__(self, inputs: TypedCostInputs, rank: int, seeds: float, evaluated: bool = False):
        k, self.inputs, self.rank = inputs.ranks, inputs, rank
        self.types = list(inputs.num_nodes)
        self.classes = {t: inputs.classes_of(t) for t in self.types}
        self.into = {t: [r for r in inputs.relations if r[2] == t] for t in self.types}
        self.reverse = {r: reverse_relation(r, inputs.relations) for r in inputs.relations}
        self.own_pool, self.remote_pool, self.own, self.remote, self.covered = {}, {}, {}, {}, {}
        self.parent, self.landed = {}, []  # per type and cohort its parent's share of its in-edges; per hop
        for t, c in self.classes.items():
            share = inputs.nodes_of(t, rank) / max(1, inputs.num_nodes[t])
            self.own_pool[t], self.remote_pool[t] = c.count * share, c.count * (1 - share)
            zero = np.zeros_like(c.count)
            self.own[t], self.remote[t], self.covered[t] = [zero], [zero], [{r: zero for r in self.into[t]}]
            self.parent[t] = [dict(self.covered[t][0])]
        c, t = self.classes[inputs.target], inputs.target
        seeded, whole = (c.evals, inputs.share("eval", rank)) if evaluated else (c.train, inputs.share("train", rank))
        rate = np.divide(seeded, c.count, out=np.zeros_like(c.count), where=c.count > 0)
        self.own[t] = [rate * seeds / max(1.0, whole)]
        self.cut_in = {r: inputs.cut[r] / (k - 1) if k > 1 else 0.0 for r in inputs.relations}

    def present(self, node_type: str) -> bool:
        return float(sum(self.own[node_type]).sum() + sum(self.remote[node_type]).sum()) > 0

    def counts(self, node_type: str) -> tuple[float, float]:
        """The frontier's expected vertices of ``node_type``: this part's and other parts'."""
        return (float((sum(self.own[node_type]) * self.own_pool[node_type]).sum()),
                float((sum(self.remote[node_type]) * self.remote_pool[node_type]).sum()))

    def draws(self, relation: RelationType, fanout: int) -> np.ndarray:
        ins = self.classes[relation[2]].in_deg[relation]
        return ins if fanout < 0 else np.minimum(ins, fanout)

    def landing(self, fanout: int, keep: dict | None = None) -> dict:
        """Per relation drawing ``fanout`` (into a type of the frontier), the expected fresh draws landing on a
        vertex of each class of its source type: (this part's, other parts'). ``keep``: per type, of each
        cohort only the share (``keep[t][0][i]`` of this part's, ``keep[t][1][i]`` of others') draws."""
        by_relation = {}
        for r in self.inputs.relations:
            s, t = r[0], r[2]
            if not self.present(t):
                continue
            ones = [1.0] * len(self.own[t])
            keep_own, keep_remote = keep[t] if keep is not None else (ones, ones)
            fresh = [self.draws(r, fanout) * (1 - cov[r]) for cov in self.covered[t]]
            d_own = sum(float((a * k * self.own_pool[t] * f).sum()) for a, k, f in zip(self.own[t], keep_own, fresh))
            d_remote = sum(float((z * k * self.remote_pool[t] * f).sum())
                           for z, k, f in zip(self.remote[t], keep_remote, fresh))
            cut, outs = self.inputs.cut_of(r, self.rank), self.classes[s].out_deg[r]
            into_own = (d_own * (1 - cut) + d_remote * self.cut_in[r]) * landing_weights(outs, self.own_pool[s])
            into_remote = (d_own * cut + d_remote * (1 - self.cut_in[r])) * landing_weights(outs, self.remote_pool[s])
            by_relation[r] = (into_own, into_remote)
        return by_relation

    def hop(self, fanout: int) -> dict:
        """One hop, every relation into a type of the frontier drawing ``fanout``: the hop's remote vertices
        asked (per type), their counts (a vertex and relation each) and draws; then the frontier grows (each
        hop's landings per relation kept in ``landed``, each new cohort's parent share of its in-edges in
        ``parent``)."""
        drawing = [r for r in self.inputs.relations if self.present(r[2])]
        asked = {t: self.counts(t)[1] for t in self.types if self.present(t)}
        out = {"ids": sum(asked.values()), "counts": sum(asked[r[2]] for r in drawing), "draws": 0.0}
        for r in drawing:
            out["draws"] += float((sum(self.remote[r[2]]) * self.remote_pool[r[2]] * self.draws(r, fanout)).sum())
        by_relation = self.landing(fanout)
        land_own = {t: np.zeros_like(c.count) for t, c in self.classes.items()}
        land_remote = {t: np.zeros_like(c.count) for t, c in self.classes.items()}
        for r, (into_own, into_remote) in by_relation.items():
            land_own[r[0]] = land_own[r[0]] + into_own
            land_remote[r[0]] = land_remote[r[0]] + into_remote
        self.landed.append(by_relation)
        for t in self.types:
            for cov in self.covered[t]:
                for r in self.into[t]:
                    if r in drawing:
                        cov[r] = 1 - (1 - cov[r]) * (1 - self.draws(r, fanout) / np.maximum(
                            self.classes[t].in_deg[r], 1.0))
        for s in self.types:
            own_now, remote_now = sum(self.own[s]), sum(self.remote[s])
            self.own[s].append((1 - own_now) * -np.expm1(-land_own[s]))
            self.remote[s].append((1 - remote_now) * -np.expm1(-land_remote[s]))
            self.covered[s].append(self.parents(s, by_relation, land_own[s] + land_remote[s]))
            self.parent[s].append(dict(self.covered[s][-1]))
        return out

    def parents(self, node_type: str, by_relation: dict, hazard: np.ndarray) -> dict:
        """A new cohort's drawn share of its in-edges: through the reverse of the relation it was reached by
        (by each relation's share of the landings on its class), the one edge back to its parent."""
        c = self.classes[node_type]
        covered = {r: np.zeros_like(c.count) for r in self.into[node_type]}
        for r, (into_own, into_remote) in by_relation.items():
            back = self.reverse[r]
            if r[0] != node_type or back is None:
                continue
            share = np.divide(into_own + into_remote, hazard, out=np.zeros_like(hazard), where=hazard > 0)
            covered[back] = np.minimum(1.0, covered[back] + share / np.maximum(c.in_deg[back], 1.0))
        return covered


def batch_bytes(inputs: TypedCostInputs, rank: int, seeds: float, evaluated: bool = False) -> dict[str, float]:
    """The bytes rank ``rank`` receives (and, in expectation, sends) in one batch of ``seeds`` target vertices:
    ``sampling`` (per hop the ids asked, their counts and neighbours, the messages' headers and sizes),
    ``rows`` (per featured type the ids asked and their rows, the sizes) and ``tables`` (per table the ids and
    rows fetched; in training also the gradient rows and ids sent back, and the weights), and per type the
    input frontier's vertices (``input_rows``). ``evaluated``: an evaluation chunk of evaluated vertices."""
    walk, others = TypedWalk(inputs, rank, seeds, evaluated), inputs.ranks - 1
    fanouts = (inputs.eval_fanouts or inputs.fanouts) if evaluated else inputs.fanouts
    sampling = 0.0
    for fanout in fanouts:
        hop = walk.hop(fanout)
        sampling += hop["ids"] * ID_BYTES + hop["counts"] * COUNT_BYTES + hop["draws"] * ID_BYTES
    frontier = {t: walk.counts(t) for t in walk.types}
    width = (inputs.table_width or inputs.hidden) * FLOAT_BYTES
    rows = sum(frontier[t][1] * (ID_BYTES + inputs.feature_dims[t] * inputs.row_bytes(t))
               for t in walk.types if inputs.feature_dims.get(t))
    tables = sum(frontier[t][1] * (ID_BYTES + width) for t in inputs.table_types) * (1 if evaluated else 2)
    fixed = fixed_bytes(inputs, len(fanouts), evaluated)
    return {"sampling": sampling + fixed["sampling"], "rows": rows + fixed["rows"],
            "tables": tables + fixed["tables"], "input_rows": {t: sum(frontier[t]) for t in walk.types}}


def fixed_bytes(inputs: TypedCostInputs, hops: int, evaluated: bool = False) -> dict[str, float]:
    """What a batch costs a rank whatever its seeds (an empty batch's bytes): per hop the message's header to
    every other rank (a count per type and a header per relation) and its announced size; per featured type
    and per table fetch a count of seeds and the request's size; per step the tables' weights and, per table,
    the gradient ids' sizes."""
    others, types = inputs.ranks - 1, len(inputs.num_nodes)
    header = (types + HEADER * len(inputs.relations)) * ID_BYTES + SIZE_BYTES
    featured = sum(1 for t in inputs.num_nodes if inputs.feature_dims.get(t))
    tables = len(inputs.table_types)
    table_bytes = 2 * SIZE_BYTES * tables + (0 if evaluated or not tables else 8 * (1 + tables) + SIZE_BYTES * tables)
    return {"sampling": others * header * hops, "rows": others * 2 * SIZE_BYTES * featured,
            "tables": others * table_bytes}


def training_bytes(inputs: TypedCostInputs, rank: int) -> dict[str, float]:
    """An epoch's training bytes of rank ``rank`` per lane of the run's summary (``sampling``: the model's
    sampling and rows; ``tables``), by what they carry, and their ``total``."""
    out = {key: 0.0 for key in LANES}
    for seeds, count in rank_batches(inputs, rank):
        if count <= 0:
            continue
        got = batch_bytes(inputs, rank, seeds) if seeds > 0 else fixed_bytes(inputs, len(inputs.fanouts))
        for key in LANES:
            out[key] += got[key] * count
    return lanes(out)


def evaluation_bytes(inputs: TypedCostInputs, rank: int) -> dict[str, float]:
    """One sampled evaluation's bytes of rank ``rank``: its evaluated vertices in chunks of
    ``eval_batch_size``, every rank taking as many chunks as the rank with the most (after one exchange of
    the counts), each chunk sampled and fetched as a training batch is, without gradients."""
    chunk, hops = inputs.eval_batch_size, len(inputs.eval_fanouts or inputs.fanouts)
    chunks = max(-(-int(round(inputs.share("eval", r))) // chunk) for r in range(inputs.ranks))
    full, rest = divmod(int(round(inputs.share("eval", rank))), chunk)
    out = {key: 0.0 for key in LANES}
    for size, count in ((chunk, full), (rest, 1 if rest else 0), (0, chunks - full - (1 if rest else 0))):
        if count <= 0:
            continue
        got = batch_bytes(inputs, rank, size, evaluated=True) if size else fixed_bytes(inputs, hops, True)
        for key in LANES:
            out[key] += got[key] * count
    out["sampling"] += 8 * (inputs.ranks - 1)  # the chunk counts
    return lanes(out)


def lanes(out: dict[str, float]) -> dict[str, float]:
    """The model's bytes by what they carry, the run's lanes (``lane_sampling``: sampling and rows;
    ``lane_tables``) and the ``total``."""
    out = dict(out, lane_sampling=out["sampling"] + out["rows"], lane_tables=out["tables"])
    out["total"] = out["sampling"] + out["rows"] + out["tables"]
    return out


def of_typed_partition(folder, fanouts, batch_size: int, hidden: int = 64, **options) -> TypedCostInputs:
    """``TypedCostInputs`` of a typed partition folder (``neutronorch partition`` of a typed dataset): the
    types' and relations' sizes, per part its vertices, splits and each relation's cut (from its CSC's sources'
    owners), and the types' degree classes from the parts' CSCs (every part read once)."""
    folder = Path(folder)
    manifest = json.loads((folder / "partition.json").read_text())
    if manifest.get("kind") != "typed":
        raise ConfigError(f"{folder}: not a typed graph's partition (its manifest's kind is "
                          f"{manifest.get('kind', 'homogeneous')!r}); read it with partition_cost.of_partition")
    graph, stats, k = manifest["graph"], manifest["part_stats"], manifest["parts"]
    num_nodes, target = dict(graph["num_nodes"]), graph["target"]
    relations = [tuple(r) for r in graph["relations"]]
    owners = {t: np.load(folder / "types" / t / "part_of.npy", mmap_mode="r") for t in num_nodes}
    ins = {r: np.zeros(num_nodes[r[2]], np.int64) for r in relations}
    outs = {r: np.zeros(num_nodes[r[0]], np.int64) for r in relations}
    cut_edges = [{r: 0 for r in relations} for _ in range(k)]
    edges = [{r: 0 for r in relations} for _ in range(k)]
    for part in range(k):
        sub = folder / f"part-{part}"
        for r in relations:
            ids = np.load(sub / "types" / r[2] / "ids.npy", mmap_mode="r")
            base = sub / "relations" / "___".join(r)
            indices = np.asarray(np.load(base / "indices.npy", mmap_mode="r"), np.int64)
            ins[r][ids] = np.diff(np.load(base / "indptr.npy", mmap_mode="r"))
            outs[r] += np.bincount(indices, minlength=num_nodes[r[0]])
            cut_edges[part][r] = int((np.asarray(owners[r[0]])[indices] != part).sum())
            edges[part][r] = int(indices.shape[0])
    splits = {s: np.load(folder / f"{s}_idx.npy", mmap_mode="r") for s in ("train", "val", "test")}
    evaluated = np.concatenate([splits["val"], splits["test"]])
    classes = {}
    for t in num_nodes:
        into, out_of = [r for r in relations if r[2] == t], [r for r in relations if r[0] == t]
        none = np.zeros(0, np.int64)
        columns, count, (train, evals) = degree_classes(
            [ins[r] for r in into] + [outs[r] for r in out_of] or [np.zeros(num_nodes[t], np.int64)],
            [splits["train"], evaluated] if t == target else [none, none])
        classes[t] = TypeClasses(count, train, evals, dict(zip(into, columns)), dict(zip(out_of, columns[len(into):])))
    whole = {r: sum(e[r] for e in edges) for r in relations}
    values = dict(num_nodes=num_nodes, relations=whole, target=target, train=int(splits["train"].shape[0]),
                  eval_nodes=int(evaluated.shape[0]), ranks=k, fanouts=tuple(fanouts), batch_size=batch_size,
                  feature_dims={t: int(graph["feature_dims"].get(t, 0)) for t in num_nodes},
                  feature_bytes={t: np.dtype(d).itemsize if d != "bfloat16" else 2
                                 for t, d in graph.get("feature_dtype", {}).items()},
                  cut={r: sum(c[r] for c in cut_edges) / max(1, whole[r]) for r in relations}, hidden=hidden,
                  classes=classes, part_cut=tuple({r: c[r] / max(1, e[r]) for r in relations}
                                                  for c, e in zip(cut_edges, edges)),
                  part_nodes=tuple(dict(s["nodes"]) for s in stats), part_train=tuple(s["train"] for s in stats),
                  part_eval=tuple(s["val"] + s["test"] for s in stats))
    return replace(TypedCostInputs(**values), **options)
