"""The cost model's NeutronOrch term (docs/distributed.md, "Cost model"): per epoch and rank, the bytes of
``train --partitions DIR --mode neutronorch --hot-ratio R`` by lane, as ``TrafficRecord`` counts them.

Per super-batch of P mini-batches a rank's planner samples the upper hops of each (lane ``plan``, as exact mode
does) and ranks the distinct bottom-layer destinations by how many of the P reach them, not counting a
mini-batch's own seeds; the top R share of the distinct ones are hot. In the model a vertex of a degree class
is reached by one mini-batch with the chance ``partition_cost.Walk`` gives (this rank's part and the others'
apart), by the P mini-batches independently, so the number of mini-batches reaching it is a sum of P such
draws; the hot set takes the classes' vertices from the most reached down. Per mini-batch the cold sampler
(lane ``cold``) draws the bottom hop of the cold destinations only and fetches the rows of their input
frontier: the hot destinations' draws thin the last hop, and a hot destination's own row is fetched only
where a cold one drew it. Per super-batch the host (lane ``host``) sends each remote hot vertex's id to its
owner; the owner computes the union of every rank's asks of its vertices (a vertex hot on several ranks
once: in the model the ranks' hot sets are independent), draws their bottom hop from its own part and
fetches the feature rows of the remote neighbours, exchanges a version and sends each rank its rows; the
trainer (lane ``gradient``) sends dL/dY of each remote hot row back. Each unit of the three lanes' collectives
begins with one byte to every other rank (``sampling/exchange.py``, ``Lane``), and each lane ends with one
more. As in exact mode a rank's bytes are those of its own asks both ways, which it also serves in
expectation."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from neutronorch.orchestration.partition_cost import (COUNT_BYTES, FLOAT_BYTES, ID_BYTES, CostInputs, Walk,
                                                      landing_weights, rank_batches)
from neutronorch.sampling.exchange import SIZE_BYTES

LANES = ("plan", "cold", "host", "gradient")
AGREE_BYTES = 1  # a Lane's agreement to begin a unit: one byte to each other rank


def epoch_batches(inputs: CostInputs, rank: int) -> list[float]:
    """Rank ``rank``'s seeds in each mini-batch of the epoch, in order."""
    return [seeds for seeds, count in rank_batches(inputs, rank) for _ in range(max(0, int(count)))]


def super_batches(inputs: CostInputs, rank: int) -> list[list[float]]:
    """The epoch's mini-batches in super-batches of ``super_batch`` (the last may be shorter)."""
    seeds, p = epoch_batches(inputs, rank), inputs.super_batch
    return [seeds[i:i + p] for i in range(0, len(seeds), p)]


def super_batch_kinds(inputs, rank: int) -> dict[tuple, int]:
    """The epoch's super-batches of rank ``rank``, each as every rank's seeds per mini-batch of it (a rank with
    fewer super-batches taking ``rank``'s): the same ones computed once, with how many of each."""
    plans = [super_batches(inputs, r) for r in range(inputs.ranks)]
    kinds: dict = {}
    for s in range(len(plans[rank])):
        key = tuple(tuple(plans[r][s]) if s < len(plans[r]) else tuple(plans[rank][s]) for r in range(inputs.ranks))
        kinds[key] = kinds.get(key, 0) + 1
    return kinds


def made_once(made: dict, key: tuple, make) -> list:
    """Every rank's super-batch of ``key`` (``super_batch_kinds``'), each made by ``make(rank, seeds)`` once and
    kept in ``made``."""
    for r, seeds in enumerate(key):
        if (r, seeds) not in made:
            made[r, seeds] = make(r, seeds)
    return [made[r, seeds] for r, seeds in enumerate(key)]


def bottom_walk(inputs: CostInputs, rank: int, seeds: float) -> tuple[Walk, list[dict]]:
    """A mini-batch's walk up to its bottom-layer destinations, and the upper hops' summaries (``frontier``'s)."""
    walk, hops = Walk(inputs, rank, seeds), []
    for fanout in inputs.fanouts[:-1]:
        draws = walk.draws(fanout)
        hops.append(walk.summary(draws))
        walk.advance(draws)
    return walk, hops


def counts(reach: list[np.ndarray], classes: int) -> np.ndarray:
    """Per class, the chance that k of the mini-batches reach a vertex (row k), each with its ``reach``."""
    dist = np.zeros((len(reach) + 1, classes))
    dist[0] = 1.0
    for q in reach:
        dist[1:] = dist[1:] * (1 - q) + dist[:-1] * q
        dist[0] *= 1 - q
    return dist


@dataclass
class HotGroups:
    """The hot set of one kind of destination (a typed graph's type) in a super-batch: per class the chance a
    vertex is hot (``hot``), per mini-batch the chance a destination it reaches (not as a seed) is hot there
    (``served``), and the distinct destinations reached, their appearances and those served hot."""

    hot: np.ndarray
    served: list[np.ndarray]
    reached: float
    appearances: float
    hot_appearances: float


def hot_groups(pool: np.ndarray, reach: list[np.ndarray], every: list[np.ndarray], ratio: float) -> HotGroups:
    """The planner's choice among the destinations of one kind (``pool``: the vertices per class), mini-batch j
    reaching a vertex of a class with the chance ``reach[j]`` other than as a seed, ``every[j]`` in all.

    The planner ranks the destinations by their count of mini-batches, a tie by first appearance (its sort is
    stable, the destinations in the order the mini-batches reach them): so the hot set takes the vertices
    group by group, by count (most first) and within a count by the mini-batch first reaching them (earliest
    first), and the last group it reaches in part. Where few vertices are reached twice, the early
    mini-batches of a super-batch thus get most of its hot rows and the late ones few."""
    c, m = pool.shape[0], len(reach)
    reached = float((pool * (1 - np.prod([1 - p for p in every], axis=0))).sum())
    unreached = np.cumprod([np.ones(c)] + [1 - q for q in reach], axis=0)  # row f: none of 0..f-1
    # group[k, f]: per class the chance of count k, first reached by mini-batch f (not as a seed)
    group = np.zeros((m + 1, m, c))
    for f in range(m):
        group[1:m - f + 1, f] = unreached[f] * reach[f] * counts(reach[f + 1:], c)
    left = min(float((pool * (1 - unreached[m])).sum()), ratio * reached)
    share = np.zeros((m + 1, m))  # per group, the share of its vertices hot
    for k in range(m, 0, -1):
        for f in range(m):
            there = float((pool * group[k, f]).sum())
            share[k, f] = min(1.0, left / there) if there > 0 else 0.0
            left -= share[k, f] * there
    served_by = []
    for b in range(m):  # reached in b: first reached at f <= b, and its count one more than the others'
        served = np.zeros(c)
        for f in range(b + 1):
            rest = counts(reach[f + 1:b] + reach[b + 1:], c)
            lead = unreached[f] * (reach[f] if f < b else 1.0)
            extra = 1 if f < b else 0  # the mini-batches f and b both count
            for j in range(rest.shape[0]):
                served += share[j + 1 + extra, f] * lead * rest[j]
        served_by.append(served)
    return HotGroups((group * share[:, :, None]).sum(axis=(0, 1)), served_by, reached,
                     sum(float((pool * p).sum()) for p in every),
                     sum(float((pool * q * h).sum()) for q, h in zip(reach, served_by)))


class SuperBatch:
    """One super-batch of rank ``rank`` (``seeds`` per mini-batch): its walks, and the hot set of its
    destinations (``hot_groups``; per class of this part's vertices then of the others')."""

    def __init__(self, inputs: CostInputs, rank: int, seeds: list[float]):
        self.walks = [bottom_walk(inputs, rank, s) for s in seeds]
        first = self.walks[0][0]
        self.split, self.pool = first.own_pool.shape[0], np.concatenate([first.own_pool, first.remote_pool])
        reach = [np.concatenate([sum(w.own[1:], np.zeros_like(w.own[0])),
                                 sum(w.remote[1:], np.zeros_like(w.remote[0]))]) for w, _ in self.walks]
        every = [np.concatenate([sum(w.own), sum(w.remote)]) for w, _ in self.walks]
        groups = hot_groups(self.pool, reach, every, inputs.hot_ratio)
        self.hot, self.served = groups.hot, groups.served
        self.reached, self.appearances, self.hot_appearances = (groups.reached, groups.appearances,
                                                                groups.hot_appearances)

    def hot_count(self, pool: str) -> float:
        """Expected hot vertices of this rank's part (``own``) or of the others' (``remote``)."""
        part = slice(None, self.split) if pool == "own" else slice(self.split, None)
        return float((self.pool[part] * self.hot[part]).sum())


def redrawn(walk: Walk, draws: np.ndarray, keep_own: list, keep_remote: list) -> tuple[list, list]:
    """Per cohort, the chance that a vertex of it is drawn again at the bottom hop by a cold destination that
    drew it at an earlier hop (its parent, one cohort up) or was reached from it (its child, one cohort down);
    of this rank's part and of the others'. In exact mode such draws add nothing (their vertex is in the
    frontier); with the vertex hot they bring its row back. A cohort's drawn share of its in-edges is its
    parent's (1 / in-degree) and its children's (the rest). A parent draws again each edge it drew with the
    chance (its draws again) / (the edges it drew): a child reached by m such edges (more the higher its
    out-degree) is drawn again unless none of them is. A child's draw of its parent lands among the parents'
    cohort by out-degree."""
    parent = np.minimum(1.0, 1 / walk.in_deg)
    n, out_deg = len(walk.own), walk.deg.out_deg
    pools, cohorts = (walk.own_pool, walk.remote_pool), (walk.own, walk.remote)
    again = [[np.zeros_like(out_deg) for _ in range(n)] for _ in pools]
    for i in range(n):
        shares = ((i + 1, np.maximum(walk.covered[i] - (parent if i else 0.0), 0.0)), (i - 1, parent if i else None))
        for target, share in shares:
            if share is None or not 0 <= target < n:
                continue
            d_own = float((walk.own[i] * keep_own[i] * walk.own_pool * draws * share).sum())
            d_remote = float((walk.remote[i] * keep_remote[i] * walk.remote_pool * draws * share).sum())
            mass = (d_own * (1 - walk.cut_here) + d_remote * walk.cut_in,
                    d_own * walk.cut_here + d_remote * (1 - walk.cut_in))
            for side, (pool, cohort) in enumerate(zip(pools, cohorts)):
                members = pool * cohort[target]
                if target < i:  # children drawing their parents: by out-degree among them
                    hit = -np.expm1(-mass[side] * landing_weights(out_deg, members))
                else:  # parents drawing again the edges that reached their children
                    rate = walk.draws_into[target - 1][side] * landing_weights(out_deg, pool)
                    edges = np.where(rate > 1e-12, rate / -np.expm1(-np.maximum(rate, 1e-12)), 1.0)
                    total = float((members * edges).sum())
                    chance = min(1.0, mass[side] / total) if total > 0 else 0.0
                    hit = 1 - (1 - chance) ** edges
                again[side][target] = 1 - (1 - again[side][target]) * (1 - hit)
    return again[0], again[1]


def cold_bytes(inputs: CostInputs, walk: Walk, upper: list[dict], served: np.ndarray, split: int) -> dict:
    """One mini-batch's bytes of lanes ``plan`` (the upper hops) and ``cold`` (the bottom hop of its cold
    destinations and the rows of their input frontier), each unit with its agreement."""
    others = inputs.ranks - 1
    plan = sum(h["remote"] * (ID_BYTES + COUNT_BYTES) + h["remote_draws"] * inputs.neighbour_bytes
               + (SIZE_BYTES + AGREE_BYTES) * others for h in upper)
    cold_own, cold_remote = 1 - served[:split], 1 - served[split:]
    keep_own = [1.0] + [cold_own] * (len(walk.own) - 1)  # a mini-batch's seeds are never hot in it
    keep_remote = [1.0] + [cold_remote] * (len(walk.remote) - 1)
    draws = walk.draws(inputs.fanouts[-1])
    remote_cold = sum(z * s for z, s in zip(walk.remote, keep_remote)) * walk.remote_pool
    own_cold = sum(a * s for a, s in zip(walk.own, keep_own)) * walk.own_pool
    sampling = (float(remote_cold.sum()) * (ID_BYTES + COUNT_BYTES)
                + float((remote_cold * draws).sum()) * inputs.neighbour_bytes + (SIZE_BYTES + AGREE_BYTES) * others)
    hit_own, hit_remote = walk.landing(draws, keep_own, keep_remote)
    again_own, again_remote = redrawn(walk, draws, keep_own, keep_remote)
    # The input frontier: the cold destinations, and the vertices their draws hit: outside the frontier (its
    # fresh draws), or hot destinations (fresh draws, or again the neighbours it drew at an earlier hop).
    own_in = own_cold + walk.own_pool * (1 - sum(walk.own)) * hit_own
    remote_in = remote_cold + walk.remote_pool * (1 - sum(walk.remote)) * hit_remote
    for j, (a, z) in enumerate(zip(walk.own, walk.remote)):
        own_in = own_in + walk.own_pool * a * (1 - keep_own[j]) * (1 - (1 - hit_own) * (1 - again_own[j]))
        remote_in = remote_in + walk.remote_pool * z * (1 - keep_remote[j]) * (
            1 - (1 - hit_remote) * (1 - again_remote[j]))
    remote_rows = float(remote_in.sum())
    remote_seeds = float((walk.remote[0] * walk.remote_pool).sum())
    rows = (remote_rows * (ID_BYTES + inputs.feature_dim * inputs.feature_bytes) + remote_seeds * inputs.label_bytes
            + (2 * SIZE_BYTES + AGREE_BYTES) * others)
    return {"plan": plan, "cold": sampling + rows, "input_rows": float(own_in.sum()) + remote_rows,
            "remote_input_rows": remote_rows}


def host_bytes(inputs: CostInputs, rank: int, batches: list[SuperBatch]) -> dict:
    """One super-batch's bytes of lanes ``host`` and ``gradient`` on rank ``rank`` (``batches``: every rank's
    same super-batch), with the vertices it computes as owner (``computed``: the union of the ranks' asks of
    its part's vertices) and the remote rows it fetches for them (``fetched``)."""
    others, mine = inputs.ranks - 1, batches[rank]
    asked = mine.hot_count("remote")
    split = mine.split
    missing = 1 - mine.hot[:split]  # per class of this part: the chance no rank asks for a vertex
    for r, other in enumerate(batches):
        if r != rank:
            missing = missing * (1 - other.hot[other.split:])
    walk = mine.walks[0][0]
    computed = walk.own_pool * (1 - missing)
    draws = float((computed * walk.draws(inputs.fanouts[-1])).sum())
    out_deg = walk.deg.out_deg
    fetched = float((walk.remote_pool * -np.expm1(-draws * walk.cut_here
                                                  * landing_weights(out_deg, walk.remote_pool))).sum())
    # The rows it reads: the computed vertices', and their neighbours' of its own part (fetched: the others').
    missed = np.exp(-draws * (1 - walk.cut_here) * landing_weights(out_deg, walk.own_pool))
    own = walk.own_pool - (walk.own_pool - computed) * missed
    ids = asked * ID_BYTES + (SIZE_BYTES + AGREE_BYTES) * others
    fetch = fetched * (ID_BYTES + inputs.feature_dim * inputs.feature_bytes) + (ID_BYTES + SIZE_BYTES + AGREE_BYTES
                                                                                 ) * others
    assemble = asked * inputs.hidden * inputs.hot_row_bytes + (ID_BYTES + AGREE_BYTES) * others
    return {"host": ids + fetch + assemble, "gradient": asked * inputs.hidden * FLOAT_BYTES,
            "computed": float(computed.sum()), "fetched": fetched, "rows": float(own.sum()) + fetched}


def neutronorch_bytes(inputs: CostInputs, rank: int) -> dict:
    """An epoch's training bytes of rank ``rank`` in NeutronOrch mode at ``inputs.hot_ratio``, by lane (with
    the ``total``); the feature rows its batches and its hot rows read (``input_rows``, its own and remote);
    and what checks each part of the model: per super-batch the mean ``hot`` (of them ``remote_hot`` another
    part's), ``computed`` (by this rank, as owner), ``reached``, and ``reuse_rate`` (the share of bottom-layer
    destination rows served hot)."""
    def cold(mine: SuperBatch, j: int) -> dict:
        walk, upper = mine.walks[j]
        return cold_bytes(inputs, walk, upper, mine.served[j], mine.split)

    return over_epoch(inputs, rank, lambda r, seeds: SuperBatch(inputs, r, list(seeds)), cold,
                      lambda every: host_bytes(inputs, rank, every), LANES)


def over_epoch(inputs, rank: int, make, cold, host, lanes: tuple) -> dict:
    """An epoch's bytes of rank ``rank`` by lane (``lanes``, and their ``total``), and its plan statistics (as
    ``neutronorch_bytes`` gives them): per kind of super-batch (``super_batch_kinds``; every rank's made by
    ``make(rank, seeds)``) the bytes of its mini-batches (``cold(super_batch, j)``) and of its hot rows
    (``host(every rank's super-batch)``, with the vertices ``computed`` and the ``rows`` they read); each of the
    lanes plan, cold and host ending with its thread's agreement to leave."""
    out = dict.fromkeys((*lanes, "input_rows"), 0.0)
    stats = dict.fromkeys(("hot", "remote_hot", "computed", "reached", "appearances", "hot_appearances"), 0.0)
    kinds, made = super_batch_kinds(inputs, rank), {}
    for key, times in kinds.items():
        every = made_once(made, key, make)
        mine = every[rank]
        got = [cold(mine, j) for j in range(len(mine.walks))] + [host(every)]
        for lane in out:
            out[lane] += sum(g.get(lane, 0.0) for g in got) * times
        out["input_rows"] += got[-1]["rows"] * times
        stats["hot"] += (mine.hot_count("own") + mine.hot_count("remote")) * times
        stats["remote_hot"] += mine.hot_count("remote") * times
        stats["computed"] += got[-1]["computed"] * times
        for name in ("reached", "appearances", "hot_appearances"):
            stats[name] += getattr(mine, name) * times
    for lane in ("plan", "cold", "host"):
        out[lane] += AGREE_BYTES * (inputs.ranks - 1)  # each lane's thread says it leaves
    out["total"] = sum(out[lane] for lane in lanes)
    n = max(1, sum(kinds.values()))
    out.update({name: stats[name] / n for name in ("hot", "remote_hot", "computed", "reached")})
    out["reuse_rate"] = stats["hot_appearances"] / max(1.0, stats["appearances"])
    return out
