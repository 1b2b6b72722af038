"""The one rule for an array of vertex pairs, wherever one is given (``predict --pairs``, ``score_pairs``,
``LinkNeighborLoader(edges=...)``): (2, P) is a pair per column (PyG's ``edge_index``), (P, 2) a pair per
row, 2 x 2 refused unless ``layout`` says which; a text file of ``u v`` lines is pairs as rows."""

from __future__ import annotations

import numpy as np

from neutronorch.errors import ConfigError

__all__ = ["PAIR_LAYOUTS", "pair_columns"]

PAIR_LAYOUTS = ("columns", "rows")  # (2, P): a pair per column; (P, 2): a pair per row


def pair_columns(array: np.ndarray, what: str, layout: str | None = None) -> np.ndarray:
    """``array`` of vertex pairs as (2, P), a view where it can be: (2, P) as given, (P, 2) transposed.
    ``layout``: ``"columns"`` or ``"rows"`` to say which (required for a 2 x 2 array); None reads the shape.
    Anything else is a ``ConfigError`` naming ``what``."""
    if layout not in (None, *PAIR_LAYOUTS):
        raise ConfigError(f"`layout` {layout!r}: give \"columns\" (a (2, P) array, a pair per column) or \"rows\" "
                          f"(a (P, 2) array, a pair per row), or leave it out to read the shape.")
    if array.ndim != 2 or 2 not in array.shape:
        raise ConfigError(f"{what}: expected a (P, 2) or (2, P) array of vertex pairs (a pair per row, or per "
                          f"column as PyG's edge_index), got shape {tuple(array.shape)}.")
    if layout is not None:
        columns = layout == "columns"
        if array.shape[0 if columns else 1] != 2:
            raise ConfigError(f"{what}: `layout` {layout} says a pair per {'column' if columns else 'row'}, but "
                              f"the shape is {tuple(array.shape)}; give layout=\"{PAIR_LAYOUTS[columns]}\".")
        return array if columns else array.T
    if array.shape == (2, 2):
        raise ConfigError(f"{what}: a 2 x 2 array is ambiguous: two (u, v) rows, or a row of first vertices over "
                          f"a row of second ones? Say which with layout=\"columns\" (a pair per column, as PyG's "
                          f"edge_index) or layout=\"rows\" (a pair per row); on the command line give a text file "
                          f"of 'u v' lines.")
    return array if array.shape[0] == 2 else array.T
