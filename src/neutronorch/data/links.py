"""Supervision edges for link prediction: the ``LinkSplit`` a graph carries and the checks a split from
outside must pass (a seeded split of a graph's edges is ``edge_split.py``'s). A link graph's own topology is
its message-passing graph, without the validation and test edges; negatives for training are the trainer's,
drawn per mini-batch, never here."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from neutronorch.errors import ConfigError, DataError

# What ``LinkSplit.val_neg`` and ``test_neg`` hold, and so how evaluation scores a set:
SAMPLED = "sampled"  # none: the trainer draws negatives (score by sampled MRR, Hits@K or ROC-AUC)
SHARED = "shared"  # (2, K) pairs, one list for all positives (ogbl-collab, -ppa: Hits@K)
PER_SOURCE = "per-source"  # (P, K) targets per positive, paired with its source (ogbl-citation2: MRR)
NEGATIVE_KINDS = (SAMPLED, SHARED, PER_SOURCE)
_CHUNK = 1 << 22  # elements compared at a time when counting negatives that are positives


@dataclass
class LinkSplit:
    """Positive edges per set, each an int64 (2, E) array: row 0 the sources, row 1 the targets.

    ``undirected``: an edge and its reverse are one link (stored once, source < target). ``val_neg`` and
    ``test_neg`` are the evaluation's fixed negatives, of the form ``negative_kind`` names: ``SAMPLED`` (None,
    drawn by the trainer), ``SHARED`` ((2, K) pairs for every positive: Hits@K) or ``PER_SOURCE`` ((P, K): row
    i the negative targets of positive i: MRR). ``negatives`` names the form where the shapes cannot (None:
    read from them). ``metric``: the benchmark's own; ``direction``: how ``undirected`` was decided;
    ``issues``: what ``link_checks.check_stored_links`` found and kept, None until checked."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    val_neg: np.ndarray | None = None
    test_neg: np.ndarray | None = None
    undirected: bool = False
    negatives: str | None = None
    metric: str | None = None
    direction: str = ""
    issues: dict | None = field(default=None, compare=False)
    # What ``issues`` was counted for: the ids of the three sets and of the topology's indices (``checked_for``).
    checked: tuple | None = field(default=None, compare=False, repr=False)
    ends: LinkEnds | None = None  # a typed graph's: the relation and the stacked ids the sets hold
    # A chronological split's (``data/time_split.py``): each set's link times, aligned with its pairs.
    train_time: np.ndarray | None = None
    val_time: np.ndarray | None = None
    test_time: np.ndarray | None = None

    @property
    def timed(self) -> bool:
        """Whether the links carry times (a temporal link task: sampled and scored as of each link's time)."""
        return self.train_time is not None

    def checked_for(self, indices) -> tuple:
        """The identity of this split's sets and of ``indices``: a set replaced since is checked again."""
        return id(self.train), id(self.val), id(self.test), id(indices)

    @property
    def negative_kind(self) -> str | None:
        """``SAMPLED``, ``SHARED`` or ``PER_SOURCE``: how evaluation scores the sets (None: the shapes do
        not say, and ``negatives`` does not either; ``check_link_split`` refuses such a split)."""
        return self.negatives if self.negatives is not None else _inferred_kind(self)

    def describe(self) -> str:
        negatives = {SAMPLED: "negatives drawn in training",
                     SHARED: f"{_width(self.val_neg):,}/{_width(self.test_neg):,} shared negatives",
                     PER_SOURCE: f"{_width(self.val_neg):,} negatives per positive"}.get(self.negative_kind, "")
        if self.timed:
            negatives = {SHARED: f"{negatives}, each set's scored at its links' one time",
                         PER_SOURCE: negatives}.get(self.negative_kind, "negatives drawn as of each link's time")
            negatives += ", split by time"
        return (f"links {_width(self.train):,}/{_width(self.val):,}/{_width(self.test):,} "
                f"{'undirected' if self.undirected else 'directed'}, {negatives}")


def _width(array) -> int:
    return int(array.shape[1]) if getattr(array, "ndim", 0) == 2 else 0


def _inferred_kind(split: LinkSplit) -> str | None:
    if split.val_neg is None and split.test_neg is None:
        return SAMPLED
    kinds = set()
    for positives, negatives in ((split.val, split.val_neg), (split.test, split.test_neg)):
        rows, count = getattr(negatives, "shape", (0,))[0], _width(positives)
        if rows == 2 and count != 2:
            kinds.add(SHARED)
        elif rows == count and count != 2:
            kinds.add(PER_SOURCE)
        else:
            return None  # missing, malformed or ambiguous: check_link_split says which
    return kinds.pop() if len(kinds) == 1 else None


def check_negatives_fit(name: str, count: int, num_nodes: int) -> None:
    """``count`` negative destinations per positive, drawn over ``num_nodes`` vertices, must not outnumber them:
    ``ConfigError`` naming the setting ``name`` and both numbers."""
    if count > num_nodes:
        raise ConfigError(f"`{name}` {count:,}: more negative destinations per positive than the {num_nodes:,} "
                          f"vertices they are drawn from; give at most {num_nodes:,}.")


def check_link_split(split: LinkSplit, num_nodes: int, source: str = "link split") -> None:
    """Raise ``DataError`` naming ``source`` for a split that cannot be trained or scored: arrays of the
    wrong shape or dtype, an empty set, a vertex outside 0..num_nodes-1, negatives of an unknown or
    inconsistent form. Negatives that are positives of their own set are scored as given (a benchmark's)."""
    def fail(what: str, fix: str) -> None:
        raise DataError(f"{source}: {what}. {fix}")

    for name in ("train", "val", "test"):
        edges = getattr(split, name)
        _check_array(edges, name, 2, fail)
        if edges.shape[1] == 0:
            fail(f"the {name} set holds no edges", "Every set needs at least one; give larger shares of the edges.")
        _check_range(edges, name, num_nodes, fail)
    kind = split.negative_kind
    if kind not in NEGATIVE_KINDS:
        fail(f"the form of the negatives is {kind!r}: " + (f"negatives must be one of {NEGATIVE_KINDS}"
             if split.negatives is not None else f"the shapes of val_neg {_shape(split.val_neg)} and test_neg "
             f"{_shape(split.test_neg)} say neither form"),
             f"Give val_neg and test_neg as (2, K) negative pairs shared by all positives (negatives="
             f"\"{SHARED}\") or as (P, K) negative targets per positive (negatives=\"{PER_SOURCE}\"), or neither.")
    for part in ("val", "test"):
        negatives, name = getattr(split, f"{part}_neg"), f"{part}_neg"
        if kind == SAMPLED:
            if negatives is not None:
                fail(f"{name} is given but negatives is \"{SAMPLED}\"",
                     f"Say negatives=\"{SHARED}\" or \"{PER_SOURCE}\", or leave {name} out.")
            continue
        if negatives is None:
            fail(f"{name} is missing although the negatives are {kind!r}", "Give fixed negatives for both sets.")
        rows = 2 if kind == SHARED else getattr(split, part).shape[1]
        _check_array(negatives, name, rows, fail)
        if negatives.shape[1] == 0:
            fail(f"{name} holds no negatives", f"Give at least one, or leave {name} out to have them drawn.")
        _check_range(negatives, name, num_nodes, fail)


def _shape(array) -> str:
    return str(getattr(array, "shape", None))


def _check_array(array, name: str, rows: int, fail) -> None:
    what = "(2, E) source and target rows" if name in ("train", "val", "test") else (
        "(2, K) negative pairs" if rows == 2 else f"({rows}, K) negative targets, a row per positive")
    if not isinstance(array, np.ndarray) or array.ndim != 2 or array.shape[0] != rows:
        fail(f"{name} has shape {_shape(array)}, expected {what}",
             "Transpose an (E, 2) edge list with .T, or fix the array.")
    if array.dtype != np.int64:
        fail(f"{name} has dtype {array.dtype}, expected int64 vertex ids", "Convert it with .astype(np.int64).")


def _check_range(array: np.ndarray, name: str, num_nodes: int, fail) -> None:
    bad, first = 0, None
    columns = max(1, _CHUNK // array.shape[0])
    for start in range(0, array.shape[1], columns):
        chunk = array[:, start:start + columns]
        outside = (chunk < 0) | (chunk >= num_nodes)
        if outside.any():
            bad += int(outside.sum())
            first = int(chunk[outside][0]) if first is None else first
    if bad:
        fail(f"{name} names vertex {first}, outside 0..{num_nodes - 1}, and {bad:,} entries in all lie outside",
             "The split belongs to another graph or the vertex count is wrong.")


def count_positive_negatives(split: LinkSplit, part: str, num_nodes: int) -> int:
    """How many of set ``part``'s ("val" or "test") fixed negatives are positives of that set (either
    direction for an undirected split); read in chunks."""
    positives, negatives = getattr(split, part), getattr(split, f"{part}_neg")
    if negatives is None:
        return 0
    if split.negative_kind not in (SHARED, PER_SOURCE):
        raise ValueError(f"{part}_neg is given, but in no form known; check the split with check_link_split first")
    known = positives[1] * num_nodes + positives[0]
    if split.undirected:
        known = np.concatenate([known, positives[0] * num_nodes + positives[1]])
    known = np.unique(known)
    count = 0
    if split.negative_kind == SHARED:
        for start in range(0, negatives.shape[1], _CHUNK):
            chunk = negatives[:, start:start + _CHUNK]
            count += int(member_mask(chunk[1] * num_nodes + chunk[0], known).sum())
        return count
    rows = max(1, _CHUNK // max(1, negatives.shape[1]))
    for start in range(0, negatives.shape[0], rows):
        sources = positives[0, start:start + rows, None]
        count += int(member_mask(negatives[start:start + rows] * num_nodes + sources, known).sum())
    return count


def member_mask(keys: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Which of ``keys`` are in the sorted array ``known`` (a binary search each)."""
    if known.size == 0:
        return np.zeros(keys.shape, bool)
    return known[np.minimum(np.searchsorted(known, keys), known.size - 1)] == keys


@dataclass(frozen=True)
class LinkEnds:
    """Where a typed graph's link task on ``relation`` keeps its pairs: its end types' local ids stacked in
    the graph's type order (``offsets[t] + i``), so that the homogeneous split, seeds, negatives and metrics
    serve it. ``reverse``: the relation stored as its reverse, whose edges a batch drops too."""

    relation: tuple[str, str, str]
    offsets: dict[str, int]
    counts: dict[str, int]
    reverse: tuple[str, str, str] | None = None

    @classmethod
    def of(cls, num_nodes: dict[str, int], relation: tuple[str, str, str], reverse=None) -> "LinkEnds":
        types = [t for t in num_nodes if t in (relation[0], relation[2])]
        starts = np.cumsum([0] + [num_nodes[t] for t in types]).tolist()
        return cls(relation, dict(zip(types, starts)), {t: num_nodes[t] for t in types}, reverse)

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(self.offsets)

    @property
    def num_nodes(self) -> int:
        return sum(self.counts.values())

    @property
    def destinations(self) -> tuple[int, int]:
        """(first stacked id, count) of the destination type: where negative destinations are drawn."""
        return self.offsets[self.relation[2]], self.counts[self.relation[2]]

    def split(self, ids) -> dict:
        """Sorted stacked ids (a numpy array or tensor) as each end type's local ids."""
        if len(self.offsets) == 1:
            return {self.types[0]: ids}
        second = self.offsets[self.types[1]]
        cut = int((ids < second).sum())
        return {self.types[0]: ids[:cut], self.types[1]: ids[cut:] - second}


def row_statistics(features, rows: int = 4096) -> tuple[float, np.ndarray | None]:
    """The root mean square of the L2 norms of up to ``rows`` evenly spaced feature rows (memory-mapped arrays
    read at those rows only), and their mean row (None without rows): ``LinkModel``'s ``input_norm`` and
    ``input_mean``."""
    count = int(features.shape[0])
    if count == 0:
        return 1.0, None
    sample = np.asarray(features[np.linspace(0, count - 1, min(rows, count)).astype(np.int64)], dtype=np.float64)
    return float(np.sqrt((sample * sample).sum(axis=1).mean())), sample.mean(axis=0).astype(np.float32)
