"""The cost model's NeutronOrch term on a typed graph's parts (docs/distributed.md, "Cost model", "Typed graphs"):
per epoch and rank, the bytes of ``train --partitions DIR --mode neutronorch --hot-ratio R`` of a typed partition
by lane, as ``TrafficRecord`` counts them. It is ``partition_cost_hot.py``'s model per vertex type and relation,
over ``partition_cost_typed.TypedWalk``.

Per super-batch of P mini-batches a rank's planner samples the upper hops of each (lane ``plan``, as exact mode
does) and makes hot the top R share of each type's distinct bottom-layer destinations (``hot_groups`` per type:
the planner chooses per type). Per mini-batch the cold sampler (lane ``cold``) draws, through every relation into
their types, the bottom hop of the cold destinations only, from a frontier of those (``TypedHops.sample_bottom``):
so a hot destination's row is fetched where a cold one draws it, by a fresh draw or by drawing again a neighbour
it drew at an earlier hop. It fetches each featured type's rows of that input frontier; the featureless types'
table rows of it come from their owners and their gradient rows go back (lane ``tables``), as in exact mode.

Per super-batch the host (lane ``host``) sends the ids of its remote hot vertices (every type's as one) to their
owners; an owner computes the union of every rank's asks of its vertices (the ranks' hot sets taken as
independent), draws their bottom hop from its own part through every relation into their types, fetches each
featured type's remote sources' rows, exchanges a version and sends each rank its rows of H float32s. The
snapshot fetches the featureless sources' table rows from their owners (lane ``tables``, a fetch per table), and
at the super-batch's last step their gradient goes back to the owners in a reduction of its own (with the ranks'
weights); the trainer sends dL/dY of each remote hot row to its owner (lane ``gradient``). Each unit of the lanes
plan, cold and host begins with one byte to every other rank, and each of those lanes ends with one more."""

from __future__ import annotations

import numpy as np

from neutronorch.orchestration.partition_cost import COUNT_BYTES, FLOAT_BYTES, ID_BYTES, landing_weights
from neutronorch.orchestration.partition_cost_hot import AGREE_BYTES, hot_groups, over_epoch
from neutronorch.orchestration.partition_cost_typed import TypedCostInputs, TypedWalk, fixed_bytes
from neutronorch.sampling.exchange import SIZE_BYTES

LANES = ("plan", "cold", "host", "gradient", "tables")  # the run's lanes (``tables`` where a type has a table)


def bottom_walk(inputs: TypedCostInputs, rank: int, seeds: float) -> tuple[TypedWalk, float]:
    """A mini-batch's walk up to its bottom-layer destinations, and the bytes of its upper hops (lane ``plan``:
    per hop the ids asked, their counts and draws, the headers and sizes, and the unit's agreement)."""
    walk, plan, hops = TypedWalk(inputs, rank, seeds), 0.0, len(inputs.fanouts) - 1
    for fanout in inputs.fanouts[:-1]:
        hop = walk.hop(fanout)
        plan += hop["ids"] * ID_BYTES + hop["counts"] * COUNT_BYTES + hop["draws"] * ID_BYTES
    return walk, plan + fixed_bytes(inputs, hops)["sampling"] + AGREE_BYTES * (inputs.ranks - 1) * hops


class TypedSuperBatch:
    """One super-batch of rank ``rank`` (``seeds`` per mini-batch): its walks with their plan bytes, and per type
    the hot set of its destinations (``groups``: ``hot_groups``' per class of this part's vertices, then of the
    others'), with the statistics ``partition_cost_hot.over_epoch`` reads summed over the types."""

    def __init__(self, inputs: TypedCostInputs, rank: int, seeds: list[float]):
        self.walks = [bottom_walk(inputs, rank, s) for s in seeds]
        first = self.walks[0][0]
        self.split = {t: first.own_pool[t].shape[0] for t in first.types}
        self.pool = {t: np.concatenate([first.own_pool[t], first.remote_pool[t]]) for t in first.types}
        self.groups = {}
        for t in first.types:
            reach = [np.concatenate([sum(w.own[t][1:], np.zeros_like(w.own[t][0])),
                                     sum(w.remote[t][1:], np.zeros_like(w.remote[t][0]))]) for w, _ in self.walks]
            every = [np.concatenate([sum(w.own[t]), sum(w.remote[t])]) for w, _ in self.walks]
            self.groups[t] = hot_groups(self.pool[t], reach, every, inputs.hot_ratio or 0.0)
        for name in ("reached", "appearances", "hot_appearances"):
            setattr(self, name, sum(getattr(g, name) for g in self.groups.values()))

    def hot_of(self, node_type: str, side: int) -> np.ndarray:
        """Per class of ``node_type``, the chance a vertex of this rank's part (``side`` 0) or of the others' is
        hot."""
        hot, split = self.groups[node_type].hot, self.split[node_type]
        return hot[:split] if side == 0 else hot[split:]

    def hot_count(self, pool: str) -> float:
        """Expected hot vertices, every type's, of this rank's part (``own``) or of the others' (``remote``)."""
        part = 0 if pool == "own" else 1
        walk = self.walks[0][0]
        return sum(float(((walk.own_pool, walk.remote_pool)[part][t] * self.hot_of(t, part)).sum())
                   for t in self.groups)


def redrawn(walk: TypedWalk, fanout: int, keep: dict) -> dict:
    """Per type, side (this rank's part, the others') and cohort, the chance that a vertex of it is drawn again
    at the bottom hop by a cold destination that drew it at an earlier hop (through a relation into the
    destination's type: its child, one cohort down) or was reached from it (through the reverse of the
    relation that reached the destination: its parent, one cohort up), per relation as
    ``partition_cost_hot.redrawn``: a parent draws again each edge it drew with the chance (its draws again) /
    (the edges into the children's cohort), a child reached through m such edges (the relation's landings on
    it, given it was reached through the relation) is drawn again unless none is; a child's draw of its parent
    lands among the parents' cohort by out-degree through the relation."""
    n = len(walk.landed) + 1
    again = {t: tuple([np.zeros_like(c.count) for _ in range(n)] for _ in range(2)) for t, c in walk.classes.items()}
    for r in walk.inputs.relations:
        s, t = r[0], r[2]
        if not walk.present(t):
            continue
        draws, outs = walk.draws(r, fanout), walk.classes[s].out_deg[r]
        cut, cut_in = walk.inputs.cut_of(r, walk.rank), walk.cut_in[r]
        for i in range(n):
            parent = walk.parent[t][i][r]
            for target, share in ((i + 1, np.maximum(walk.covered[t][i][r] - parent, 0.0)), (i - 1, parent)):
                if not 0 <= target < n or (target > i and r not in walk.landed[i]):  # r drew nothing at hop i
                    continue
                d_own = float((walk.own[t][i] * keep[t][0][i] * walk.own_pool[t] * draws * share).sum())
                d_remote = float((walk.remote[t][i] * keep[t][1][i] * walk.remote_pool[t] * draws * share).sum())
                mass = (d_own * (1 - cut) + d_remote * cut_in, d_own * cut + d_remote * (1 - cut_in))
                for side, (pool, cohorts) in enumerate(((walk.own_pool, walk.own), (walk.remote_pool, walk.remote))):
                    members = pool[s] * cohorts[s][target]
                    if target < i:  # children drawing their parents: by out-degree through r among them
                        hit = -np.expm1(-mass[side] * landing_weights(outs, members))
                    else:  # parents drawing again the edges through r that reached their children
                        rate = walk.landed[i][r][side]
                        whole = sum(h[side] for q, h in walk.landed[i].items() if q[0] == s)
                        via = np.divide(-np.expm1(-rate), -np.expm1(-whole), out=np.zeros_like(rate),
                                        where=whole > 1e-12)
                        edges = np.where(rate > 1e-12, rate / -np.expm1(-np.maximum(rate, 1e-12)), 1.0)
                        total = float((members * via * edges).sum())
                        chance = min(1.0, mass[side] / total) if total > 0 else 0.0
                        hit = via * (1 - (1 - chance) ** edges)
                    again[s][side][target] = 1 - (1 - again[s][side][target]) * (1 - hit)
    return again


def cold_bytes(inputs: TypedCostInputs, walk: TypedWalk, served: dict, split: dict) -> dict:
    """One mini-batch's bytes of lanes ``cold`` (the bottom hop of its cold destinations, each featured type's
    rows of their input frontier, the units' agreements) and ``tables`` (the featureless types' table rows of it
    and their gradient rows, the sizes and weights), and its input rows. ``served``: per type the chance a
    destination it reaches (not as a seed) is hot in it."""
    others, fanout = inputs.ranks - 1, inputs.fanouts[-1]
    keep = {}  # per type, of each cohort the cold share (a mini-batch's seeds are never hot in it)
    for t in walk.types:
        later = len(walk.own[t]) - 1
        keep[t] = ([1.0] + [1 - served[t][:split[t]]] * later, [1.0] + [1 - served[t][split[t]:]] * later)
    cold = {t: [sum(a * k for a, k in zip(cohorts[t], keep[t][side])) * pool[t]
                for side, (pool, cohorts) in enumerate(((walk.own_pool, walk.own), (walk.remote_pool, walk.remote)))]
            for t in walk.types}
    sampling = sum(float(cold[t][1].sum()) * ID_BYTES for t in walk.types if walk.present(t))
    for r in inputs.relations:
        if walk.present(r[2]):
            remote = cold[r[2]][1]
            sampling += float(remote.sum()) * COUNT_BYTES + float((remote * walk.draws(r, fanout)).sum()) * ID_BYTES
    hazard = {t: [np.zeros_like(c.count), np.zeros_like(c.count)] for t, c in walk.classes.items()}
    for r, landed in walk.landing(fanout, keep).items():
        for side in range(2):
            hazard[r[0]][side] = hazard[r[0]][side] + landed[side]
    again = redrawn(walk, fanout, keep)
    inputs_of = {}  # per type, the input frontier's vertices of this part and of the others'
    for t in walk.types:
        inputs_of[t] = []
        for side, (pool, cohorts) in enumerate(((walk.own_pool, walk.own), (walk.remote_pool, walk.remote))):
            hit = -np.expm1(-hazard[t][side])
            # The cold destinations, and the vertices their draws hit: outside the frontier (its fresh draws), or
            # hot destinations (fresh draws, or again the neighbours it drew at an earlier hop).
            rows = cold[t][side] + pool[t] * (1 - sum(cohorts[t])) * hit
            for j, share in enumerate(cohorts[t]):
                rows = rows + pool[t] * share * (1 - keep[t][side][j]) * (1 - (1 - hit) * (1 - again[t][side][j]))
            inputs_of[t].append(float(rows.sum()))
    featured = [t for t in walk.types if inputs.feature_dims.get(t)]
    width = (inputs.table_width or inputs.hidden) * FLOAT_BYTES
    rows = sum(inputs_of[t][1] * (ID_BYTES + inputs.feature_dims[t] * inputs.row_bytes(t)) for t in featured)
    fixed = fixed_bytes(inputs, 1)
    return {"cold": sampling + rows + fixed["sampling"] + fixed["rows"] + AGREE_BYTES * others * (1 + len(featured)),
            "tables": sum(inputs_of[t][1] for t in inputs.table_types) * (ID_BYTES + width) * 2 + fixed["tables"],
            "input_rows": sum(sum(v) for v in inputs_of.values())}


def host_bytes(inputs: TypedCostInputs, rank: int, batches: list[TypedSuperBatch]) -> dict:
    """One super-batch's bytes of lanes ``host``, ``gradient`` and ``tables`` (the snapshot's table rows and their
    gradient) on rank ``rank`` (``batches``: every rank's same super-batch), with the vertices it computes as
    owner (``computed``: the union of the ranks' asks of its part's vertices, every type's) and the rows they
    read (``rows``: the computed vertices' and their sources', this part's and fetched)."""
    others, mine, fanout = inputs.ranks - 1, batches[rank], inputs.fanouts[-1]
    walk = mine.walks[0][0]
    asked = mine.hot_count("remote")
    computed = {}
    for t in walk.types:
        missing = 1 - mine.hot_of(t, 0)  # per class of this part: the chance no rank asks for a vertex
        for r, other in enumerate(batches):
            if r != rank:
                missing = missing * (1 - other.hot_of(t, 1))
        computed[t] = walk.own_pool[t] * (1 - missing)
    hazard = {t: [np.zeros_like(c.count), np.zeros_like(c.count)] for t, c in walk.classes.items()}
    for r in inputs.relations:  # the owner's bottom hop, from its own part: the cut share lands on the others'
        s, drawn = r[0], float((computed[r[2]] * walk.draws(r, fanout)).sum())
        cut, outs = inputs.cut_of(r, rank), walk.classes[s].out_deg[r]
        hazard[s][0] = hazard[s][0] + drawn * (1 - cut) * landing_weights(outs, walk.own_pool[s])
        hazard[s][1] = hazard[s][1] + drawn * cut * landing_weights(outs, walk.remote_pool[s])
    fetched = {t: float((walk.remote_pool[t] * -np.expm1(-hazard[t][1])).sum()) for t in walk.types}
    own = sum(float((walk.own_pool[t] - (walk.own_pool[t] - computed[t]) * np.exp(-hazard[t][0])).sum())
              for t in walk.types)
    featured = [t for t in walk.types if inputs.feature_dims.get(t)]
    ids = asked * ID_BYTES + (SIZE_BYTES + AGREE_BYTES) * others
    fetch = (sum(fetched[t] * (ID_BYTES + inputs.feature_dims[t] * inputs.row_bytes(t)) for t in featured)
             + (2 * SIZE_BYTES + AGREE_BYTES) * others * len(featured))
    assemble = asked * inputs.hidden * FLOAT_BYTES + (ID_BYTES + AGREE_BYTES) * others
    width = (inputs.table_width or inputs.hidden) * FLOAT_BYTES
    tables = sum(fetched[t] for t in inputs.table_types) * (ID_BYTES + width) * 2 + fixed_bytes(inputs, 0)["tables"]
    return {"host": ids + fetch + assemble, "gradient": asked * inputs.hidden * FLOAT_BYTES, "tables": tables,
            "computed": sum(float(c.sum()) for c in computed.values()), "rows": own + sum(fetched.values())}


def neutronorch_bytes(inputs: TypedCostInputs, rank: int) -> dict:
    """An epoch's training bytes of rank ``rank`` in NeutronOrch mode at ``inputs.hot_ratio`` on a typed graph's
    parts, by lane of the run's summary (``LANES``, with the ``total``), and the plan's statistics as
    ``partition_cost_hot.neutronorch_bytes`` gives them (every type's summed)."""
    def cold(mine: TypedSuperBatch, j: int) -> dict:
        walk, plan = mine.walks[j]
        return {**cold_bytes(inputs, walk, {t: g.served[j] for t, g in mine.groups.items()}, mine.split),
                "plan": plan}

    return over_epoch(inputs, rank, lambda r, seeds: TypedSuperBatch(inputs, r, list(seeds)), cold,
                      lambda every: host_bytes(inputs, rank, every), LANES)
