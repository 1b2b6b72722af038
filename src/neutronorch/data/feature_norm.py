"""Feature rows as a run reads them (``--normalize-features``): ``none``, the rows as given; ``row``, each row
divided by its sum where that sum is above 1, as PyG's ``NormalizeFeatures`` does to non-negative rows (its
sum clamped at 1: a row of zeros, or of a smaller sum, stays as it is). Applied once to the graph a run or a
checkpoint's reader is handed (``normalized``), before anything reads a row, so that training in every mode,
the host cache, the device's copy, evaluation, ``predict``, ``embed`` and ``score_pairs`` all read the same
rows. A typed graph's rows are normalised per featured type. The log says what was done, in one line: how many
rows were divided and their sums before."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from neutronorch.errors import ConfigError

logger = logging.getLogger("neutronorch")

FEATURE_NORMS = ("none", "row")
# Memory-mapped rows up to this size are read and normalised in memory (a converted dataset's, say); larger
# ones are refused: the run keeps them mapped because they may not fit.
MAPPED_LIMIT = 2 * 2**30


def normalized(graph, how: str):
    """``graph`` with its feature rows normalised as ``how`` says (``FEATURE_NORMS``): a new graph holding new
    float32 arrays, or ``graph`` itself for ``none``. Refused, saying why: rows with a negative value (a row sum
    is then no measure of the row), and memory-mapped rows over ``MAPPED_LIMIT`` (normalising them would read
    every row into memory; normalise the file beforehand)."""
    if how not in FEATURE_NORMS:
        raise ConfigError(f"`normalize_features` {how!r}: choose one of {', '.join(FEATURE_NORMS)}.")
    if how == "none" or graph.features is None:
        return graph
    if isinstance(graph.features, dict):  # a typed graph: each featured type's rows
        done = {t: _row_normalized(x, f"{graph.name}'s {t} rows") for t, x in graph.features.items()}
        logger.info("`normalize_features` row: " + "; ".join(f"{t}: {said}" for t, (_, said) in done.items()))
        return dataclasses.replace(graph, features={t: rows for t, (rows, _) in done.items()})
    rows, said = _row_normalized(graph.features, f"{graph.name}'s rows")
    logger.info(f"`normalize_features` row: {graph.name}: {said}")
    return dataclasses.replace(graph, features=rows)


def row_normalized(features, what: str) -> np.ndarray:
    """``features`` (N, F) as float32 rows, each divided by its sum (summed in float64) where that is above 1."""
    return _row_normalized(features, what)[0]


def _row_normalized(features, what: str) -> tuple[np.ndarray, str]:
    """``row_normalized``, and what it did in words: the rows divided by their sum, the range and median of those
    sums, and the rows kept as they were."""
    if isinstance(features, np.memmap) and features.nbytes > MAPPED_LIMIT:
        raise ConfigError(f"`normalize_features` row: {what} are memory-mapped ({features.nbytes / 2**30:,.2f} GiB, "
                          f"over the {MAPPED_LIMIT / 2**30:.0f} GiB normalised in memory); normalising them here "
                          f"would read every row into memory. Divide each row by its sum in the file beforehand, or "
                          f"leave `normalize_features` at none.")
    x = np.asarray(features)
    if x.dtype.kind not in "biuf":  # bfloat16 (ml_dtypes), which numpy's reductions and comparisons do not know
        x = x.astype(np.float32)
    if x.size and x.min() < 0:
        raise ConfigError(f"`normalize_features` row divides each row by its sum, which needs non-negative "
                          f"features (counts, bag-of-words); {what} hold negative values (the least "
                          f"{float(x.min()):.4g}). Leave `normalize_features` at none.")
    sums = x.sum(axis=1, dtype=np.float64, keepdims=True)
    divided = sums[sums > 1]
    said = f"{divided.size:,} of {x.shape[0]:,} rows divided by their sum" + (
        f" (sums {divided.min():,.4g} to {divided.max():,.4g}, median {np.median(divided):,.4g})" if divided.size
        else "") + (f", {x.shape[0] - divided.size:,} summing to at most 1 kept as they were"
                     if divided.size < x.shape[0] else "")
    return (x / np.maximum(sums, 1.0)).astype(np.float32), said
