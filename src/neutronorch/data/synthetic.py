"""Synthetic power-law graphs whose labels a GNN can learn and a feature-only model cannot fully: a
degree-weighted block model (vertex weights ``rank ** -power``, an edge's far end drawn from its own class
with probability ``homophily``), features the class centroid plus heavy noise, so the neighbourhood's mean is
the strong evidence."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, fields

import numpy as np

from neutronorch.data.csc import edges_to_csc
from neutronorch.data.graph import Graph
from neutronorch.data.splits import make_split
from neutronorch.errors import ConfigError
from neutronorch.limits import SEED_MAX, check_seed


@dataclass
class SyntheticSpec:
    nodes: int = 50_000
    degree: float = 16.0  # average in-degree after symmetrising
    features: int = 64
    classes: int = 8
    power: float = 0.6  # Zipf exponent of vertex weights: larger means heavier hubs
    homophily: float = 0.7
    noise: float = 0.5  # feature noise standard deviation per dimension; class centroids have unit norm
    train: float = 0.1
    val: float = 0.05
    seed: int = 0

    @property
    def name(self) -> str:
        return (f"synthetic-n{self.nodes}-d{self.degree:g}-f{self.features}-c{self.classes}-p{self.power:g}"
                f"-h{self.homophily:g}-x{self.noise:g}-s{self.seed}")

    @classmethod
    def parse(cls, text: str) -> "SyntheticSpec":
        """``synthetic`` or ``synthetic:nodes=1000000,degree=20,features=100``."""
        _, _, rest = text.partition(":")
        spec = cls()
        known = {f.name: f.type for f in fields(cls)}
        for item in filter(None, (part.strip() for part in rest.split(","))):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or key not in known:
                raise ConfigError(f"dataset spec {text!r}: {item!r} is not KEY=VALUE with KEY one of "
                                  f"{', '.join(known)}.")
            setattr(spec, key, _number(text, key, value.strip(), whole=isinstance(getattr(spec, key), int)))
        spec.check(text)
        return spec

    def check(self, text: str, where: str | None = None) -> None:
        """Refuse what no graph can be drawn from; errors start with ``where``, else the spec ``text``."""
        where = where or f"dataset spec {text!r}"
        rates = rate_problems(where, self.degree, self.power, self.homophily, self.noise, self.train,
                              self.val)
        problems = []
        if self.nodes < 2 * self.classes:
            problems.append(f"nodes must be at least 2*classes ({2 * self.classes})")
        if self.degree <= 0 or self.features < 1 or self.classes < 2:
            problems.append("degree must be > 0, features >= 1 and classes >= 2")
        elif self.degree > max(self.nodes - 1, 1):
            problems.append(f"degree must be at most nodes - 1 ({self.nodes - 1}), the most neighbours a vertex has")
        elif round(self.nodes * self.degree / 2) < 1:
            problems.append(f"nodes * degree / 2 must give at least one edge (degree={self.degree:g} gives none)")
        problems += rates
        if not 0 <= self.seed <= SEED_MAX:
            problems.append(f"seed must be a whole number from 0 to {SEED_MAX} (2**64 - 1)")
        if problems:
            raise ConfigError(f"{where}: " + "; ".join(problems) + ".")


def rate_problems(where: str, degree, power, homophily, noise, train, val) -> list[str]:
    """What is wrong with the rates both generators take. A NaN or infinite one is refused at once: NaN
    passes every range check (each comparison is false) and would draw a graph without edges, or NaN features.
    """
    rates = dict(degree=degree, power=power, homophily=homophily, noise=noise, train=train, val=val)
    bad = [f"{name}={value}" for name, value in rates.items() if not math.isfinite(value)]
    if bad:
        raise ConfigError(f"{where}: {', '.join(bad)} is not a finite number.")
    problems = []
    if not 0 <= homophily <= 1 or power < 0 or noise < 0:
        problems.append("homophily must be in [0, 1], power and noise >= 0")
    if not (0 < train < 1 and 0 < val < 1 and train + val < 1):
        problems.append("train and val must be fractions in (0, 1) with train + val < 1")
    return problems


def _number(text: str, key: str, value: str, whole: bool) -> int | float:
    """A spec's ``key=value``: a float, or with ``whole`` an exact whole number (``seed=12345678901234567891``
    is never rounded through a float, ``nodes=2.5`` never truncated)."""
    if whole:
        with contextlib.suppress(ValueError):
            return int(value)
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"dataset spec {text!r}: {key}={value!r} is not a number.") from None
    if not math.isfinite(number):
        raise ConfigError(f"dataset spec {text!r}: {key}={value!r} is not a finite number.")
    if not whole:
        return number
    if not (number.is_integer() and abs(number) < 2**53):
        raise ConfigError(f"dataset spec {text!r}: {key}={value!r} is not a whole number; write it with digits "
                          f"only (such as {key}=1000).")
    return int(number)


def generate(spec: SyntheticSpec, split: str | None = None, split_seed: int | None = None) -> Graph:
    """The graph ``spec`` describes. Its own split (``train``, ``val`` of the spec) is drawn with the spec's
    seed; a ``split`` given instead is drawn with ``split_seed`` (the run's seed), as for any other data."""
    spec.check(spec.name)
    try:
        check_seed(spec.seed)
        rng = np.random.default_rng(spec.seed)
        n, c = spec.nodes, spec.classes
        weights = (rng.permutation(n) + 1.0) ** -spec.power
        labels = rng.integers(0, c, n, dtype=np.int64)
        pool = Pool(weights, labels, c)
        num_pairs = int(round(n * spec.degree / 2))
        first = pool.by_class[_draw(rng, pool.cumulative, np.zeros(num_pairs),
                                    np.full(num_pairs, pool.cumulative[-1]))]
        second = pool.draw(rng, labels[first], spec.homophily)
        indptr, indices = edges_to_csc(first, second, n, symmetric=True)
        if indices.shape[0] == 0:  # every draw fell on one vertex: only self loops, which are dropped
            raise ConfigError(f"dataset spec {spec.name}: power={spec.power:g} draws every edge's two ends "
                              f"at the same vertex, leaving no edges; give a smaller power (the default is "
                              f"0.6).")

        centroids = class_centroids(rng, c, spec.features)
        features = noise_rows(rng, n, spec.features, spec.noise)
        features += centroids[labels]

        spec_split = f"ratio:{spec.train},{spec.val}" if split is None else split
        seed = spec.seed if split is None or split_seed is None else split_seed
        train_idx, val_idx, test_idx = make_split(labels, c, spec_split, seed)
        return Graph(name=spec.name, indptr=indptr, indices=indices, features=features, labels=labels,
                     train_idx=train_idx, val_idx=val_idx, test_idx=test_idx, num_classes=c,
                     notes=["synthetic graph: degree-weighted block model, features = class centroid + "
                            "noise"])
    except MemoryError:  # numpy's refusal to allocate, named with what asked for it
        raise ConfigError(too_large(f"dataset spec {spec.name}", spec.nodes, spec.features,
                                    round(spec.nodes * spec.degree))) from None


def too_large(what: str, nodes: int, features: int, edges: int) -> str:
    """The error of a generator whose arrays do not fit in memory."""
    return (f"{what}: its arrays do not fit in memory (the features alone {nodes * features * 4 / 2**30:,.1f} GiB "
            f"for {nodes:,} vertices x {features:,}, beside some {edges:,} edges); give fewer nodes, a smaller "
            f"degree or fewer features.")


def class_centroids(rng: np.random.Generator, count: int, width: int) -> np.ndarray:
    """``count`` random directions of unit norm in expectation (so ``noise`` means the same at any width)."""
    return rng.standard_normal((count, width), dtype=np.float32) / np.float32(np.sqrt(width))


def noise_rows(rng: np.random.Generator, rows: int, width: int, noise: float) -> np.ndarray:
    out = rng.standard_normal((rows, width), dtype=np.float32)
    out *= np.float32(noise)
    return out


class Pool:
    """Vertices with a class and a weight each, ordered by class beside a cumulative weight table, so that a
    weighted draw inside one class is a uniform draw in that class's slice of the table."""

    def __init__(self, weights: np.ndarray, classes: np.ndarray, num_classes: int):
        self.by_class = np.argsort(classes, kind="stable")
        self.cumulative = np.cumsum(weights[self.by_class])
        end = np.searchsorted(classes[self.by_class], np.arange(num_classes), side="right")
        self.class_hi = self.cumulative[end - 1]
        self.class_lo = np.concatenate(([0.0], self.class_hi[:-1]))

    def draw(self, rng: np.random.Generator, wanted: np.ndarray, homophily: float) -> np.ndarray:
        """One vertex per entry of ``wanted``, by weight: of that class with probability ``homophily``, else
        any."""
        same = rng.random(wanted.shape[0]) < homophily
        lo = np.where(same, self.class_lo[wanted], 0.0)
        hi = np.where(same, self.class_hi[wanted], self.cumulative[-1])
        return self.by_class[_draw(rng, self.cumulative, lo, hi)]


def _draw(rng: np.random.Generator, cumulative: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Positions in ``cumulative`` drawn with probability proportional to weight within [lo, hi)."""
    u = lo + rng.random(lo.shape[0]) * (hi - lo)
    return np.minimum(np.searchsorted(cumulative, u, side="right"), cumulative.shape[0] - 1)
