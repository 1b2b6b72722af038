"""A synthetic temporal graph whose links a time-aware model can predict and a static one only partly
(docs/temporal.md, "A synthetic temporal graph"): interactions that close triangles among recent partners.

Events arrive one per time step (event ``i`` at time ``i``, int64, so no two share a time). Event ``u -- v``:
``u`` is drawn by activity (Zipf weights ``rank ** -power``, so there are hubs); with probability ``closing``
``v`` is two hops from ``u`` through recent interactions (``w``, one of ``u``'s last ``recent`` partners,
uniformly, then ``v``, one of ``w``'s last ``recent`` partners other than ``u``): a triangle closed among
recent neighbours; otherwise (and when ``u`` has no such partner yet) ``v`` is drawn by popularity (Zipf
weights of their own, never ``u``). Each interaction is stored in both directions at its time (an undirected
interaction): the samplers draw a vertex's in-edges, so a hop from a vertex reaches its partners, and the
``recent`` newest in-edges of a vertex before ``t`` (``temporal_strategy="last"``) are exactly the partners
the generator chose among at ``t``. A static snapshot of the same edges holds every older 2-hop path too: the
triangle that closes depends on recency. Features are noise and labels are random (two classes that mean
nothing): the structure and the times carry the signal."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

import neutronorch.jit  # noqa: F401 - says when the kernel is compiled (a cold cache)
from neutronorch.data.graph import Graph
from neutronorch.data.synthetic import noise_rows, too_large
from neutronorch.errors import ConfigError
from neutronorch.limits import check_seed

WHAT = "synthetic temporal graph"
REDRAWS = 8  # popularity draws that fell on the event's own source drawn again; those left: any other vertex


def synthetic_temporal(nodes: int = 20_000, events: int = 200_000, features: int = 16, recent: int = 4,
                       closing: float = 0.7, power: float = 0.6, seed: int = 0) -> Graph:
    """A homogeneous ``Graph`` of ``nodes`` vertices and ``2 * events`` edges (each event both ways) with int64
    ``edge_time`` (the event's index); the same arguments give the same graph. ``recent``: how many of a
    vertex's newest partners a triangle may close through; ``closing``: the chance an event closes one;
    ``power``: the Zipf exponent of the activity and popularity weights (larger, heavier hubs). The split
    is drawn over the meaningless labels, as for any graph; a link task splits the edges by time."""
    check_arguments(nodes, events, features, recent, closing, power, seed)
    try:
        rng = np.random.default_rng(seed)
        src, dst, closed = _draw_events(rng, nodes, events, recent, closing, power)
        rows = noise_rows(rng, nodes, features, 1.0)
        labels = rng.integers(0, 2, nodes, dtype=np.int64)
        name = (f"synthetic-temporal-n{nodes}-e{events}-f{features}-r{recent}-c{closing:g}-p{power:g}"
                f"-s{seed}")
        graph = Graph.from_arrays(src, dst, rows, labels, name=name, seed=seed, undirected=True,
                                  edge_time=np.arange(events, dtype=np.int64))
    except MemoryError:  # numpy's refusal to allocate, named with what asked for it
        raise ConfigError(too_large(WHAT, nodes, features, 2 * events)) from None
    graph.notes.append(f"synthetic temporal graph: {events:,} interactions, one per time step, each stored both "
                       f"ways; {closed.mean():.1%} closed a triangle among the {recent} newest partners (closing "
                       f"{closing:g}; a source without partners yet cannot); features are noise, labels random "
                       f"(2 classes that mean nothing)")
    return graph


def temporal_events(nodes: int = 20_000, events: int = 200_000, recent: int = 4, closing: float = 0.7,
                    power: float = 0.6, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The interactions ``synthetic_temporal`` draws with the same arguments, in time order: ``(src, dst,
    closed)``, event ``i`` (at time ``i``) from ``src[i]`` (drawn by activity) to ``dst[i]``, ``closed[i]``
    whether it closed a triangle among recent partners."""
    check_arguments(nodes, events, 1, recent, closing, power, seed)
    return _draw_events(np.random.default_rng(seed), nodes, events, recent, closing, power)


def check_arguments(nodes, events, features, recent, closing, power, seed) -> None:
    """Refuse what no graph can be drawn from, every problem at once, each with its fix."""
    whole = dict(nodes=nodes, events=events, features=features, recent=recent)
    problems = [f"{name}={value!r} is not a whole number" for name, value in whole.items()
                if isinstance(value, bool) or not isinstance(value, (int, np.integer))]
    rates = dict(closing=closing, power=power)
    problems += [f"{name}={value!r} is not a finite number" for name, value in rates.items()
                 if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating))
                 or not math.isfinite(value)]
    if problems:
        raise ConfigError(f"{WHAT}: " + "; ".join(problems) + ".")
    if nodes < 3:
        problems.append(f"nodes must be at least 3 (a triangle), got {nodes}")
    if events < 1:
        problems.append(f"events must be at least 1, got {events}")
    if features < 1:
        problems.append(f"features must be at least 1, got {features}")
    if recent < 1:
        problems.append(f"recent must be at least 1 (the newest partners a triangle may close through), got "
                        f"{recent}")
    if not 0 <= closing <= 1:
        problems.append(f"closing must be a share in [0, 1], got {closing}")
    if power < 0:
        problems.append(f"power must be >= 0 (0: every vertex alike), got {power}")
    if problems:
        raise ConfigError(f"{WHAT}: " + "; ".join(problems) + ".")
    check_seed(seed)


def _zipf(rng: np.random.Generator, nodes: int, power: float):
    """A sampler of ``count`` vertices by Zipf weights over a random ranking of the vertices."""
    cumulative = np.cumsum((rng.permutation(nodes) + 1.0) ** -power)

    def draw(count: int) -> np.ndarray:
        u = rng.random(count) * cumulative[-1]
        return np.minimum(np.searchsorted(cumulative, u, side="right"), nodes - 1)
    return draw


def _draw_events(rng: np.random.Generator, nodes: int, events: int, recent: int, closing: float,
                 power: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    active, popular = _zipf(rng, nodes, power), _zipf(rng, nodes, power)
    src = active(events)
    fallback = popular(events)
    for _ in range(REDRAWS):  # never a self loop (the graph would drop it): draw a clash again
        clash = np.flatnonzero(fallback == src)
        if clash.size == 0:
            break
        fallback[clash] = popular(clash.size)
    clash = np.flatnonzero(fallback == src)  # heavy hubs on both sides: any other vertex, uniformly
    fallback[clash] = (src[clash] + 1 + rng.integers(0, nodes - 1, clash.size)) % nodes
    coins, pick_w, pick_v = rng.random(events), rng.random(events), rng.random(events)
    # a vertex has at most ``events`` partners: a ring no wider holds the same (and a huge ``recent`` allocates
    # nothing it cannot use)
    dst, closed = _close_triangles(src, fallback, coins < closing, pick_w, pick_v, nodes, min(recent, events))
    return src, dst, closed


@njit(cache=True, nogil=True)
def _close_triangles(src, fallback, wants, pick_w, pick_v, nodes, recent):
    """Each event's far end, in time order: a partner of a recent partner of ``src[i]`` (not ``src[i]``) where
    ``wants[i]`` and one exists, else ``fallback[i]``. Each vertex's last ``recent`` partners are a ring."""
    events = src.shape[0]
    dst = np.empty(events, np.int64)
    closed = np.zeros(events, np.bool_)
    ring = np.empty((nodes, recent), np.int64)
    seen = np.zeros(nodes, np.int64)  # interactions so far; the newest partner sits at (seen - 1) % recent
    for i in range(events):
        u = src[i]
        v = -1
        if wants[i] and seen[u] > 0:
            count_u = min(seen[u], recent)
            w = ring[u, (seen[u] - 1 - int(pick_w[i] * count_u)) % recent]
            count_w = min(seen[w], recent)  # at least 1: w met u
            start = int(pick_v[i] * count_w)
            for j in range(count_w):  # the drawn partner of w, or the next one that is not u
                candidate = ring[w, (seen[w] - 1 - (start + j) % count_w) % recent]
                if candidate != u:
                    v = candidate
                    break
        if v >= 0:
            closed[i] = True
        else:
            v = fallback[i]
        dst[i] = v
        ring[u, seen[u] % recent] = v
        seen[u] += 1
        ring[v, seen[v] % recent] = u
        seen[v] += 1
    return dst, closed
