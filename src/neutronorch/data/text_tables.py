"""The text tables of ``load_tables`` (tabular.py): CSV, TSV or whitespace-separated, gzip-compressed too, with
'#' comment lines. The delimiter and header are detected from the first lines and the columns read by numpy's
``loadtxt``. Every problem is a ``DataError`` naming the file and the line, numbered from 1 as an editor
numbers them (header and comments counted)."""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from neutronorch.data.files import read_error
from neutronorch.errors import DataError

TEXT_SUFFIXES = (".csv", ".tsv", ".txt", ".edges")
# First-line words that name columns: such a line is a header even where the column holds names too.
_COLUMN_WORDS = {"id", "node", "node_id", "nid", "vertex", "vertex_id", "src", "dst", "source", "target",
                 "from", "to", "u", "v", "label", "labels", "class", "y", "split", "set", "name", "user", "item"}
_DELIMITERS = ("\t", ",", ";", "|")
_SAMPLE = 50  # lines read to detect a text table's delimiter and header


@dataclass
class Column:
    """A table's vertex ids (``ids``; None: its rows are vertices 0..rows-1 in order) and the values given
    for them (``values``: one row each), as read from ``path``."""

    path: Path
    ids: np.ndarray | None
    values: np.ndarray | None
    said: str  # how it was read, for the notes


def from_text(path: Path, role: str, header: str) -> Column:
    """``path`` read as a text table of ``role`` (``_read`` of tabular.py says what each holds)."""
    first, sample = _sample(path)
    if not sample:
        raise DataError(f"{path}: holds no rows (only blank lines or '#' comments).")
    delimiter = next((d for d in _DELIMITERS if d in sample[0]), None)
    rows = [line.split(delimiter) if delimiter else line.split() for line in sample]
    widths = {len(row) for row in rows}
    if len(widths) > 1:
        raise DataError(f"{path}: " + (_first_bad_line(path, delimiter, first, [], None, len(rows[0])) or
                                       f"its first lines hold {', '.join(map(str, sorted(widths)))} columns; every "
                                       f"line of a table holds as many as the first."))
    named = header == "yes" or (header == "auto" and _is_header(rows))
    if named and len(rows) == 1:
        raise DataError(f"{path}: holds a header ({','.join(rows[0])}) and no rows below it; give the table's rows.")
    width = widths.pop()
    start = first + 1 if named else first
    shown = {"\t": "tab", None: "spaces"}.get(delimiter, repr(delimiter))
    said = (f"{role} {path.name} ({shown}-separated, " + (f"header {','.join(rows[0])}" if named else "no header")
            + ")")
    if role in ("edges", "features", "split") and width < 2:
        raise DataError(f"{path}: holds one column; {_LAYOUT[role]}")
    if role == "edges":
        if width > 2:
            said = said[:-1] + f"; columns 3-{width} not used)"
        return Column(path, None, _load(path, delimiter, start, [0, 1], None, width), said)
    if role == "labels" and width == 1:  # a label per line, in id order
        return Column(path, None, _load(path, delimiter, start, [0], None, width), said)
    ids = _load(path, delimiter, start, [0], None, width)[:, 0]
    return Column(path, ids, _load(path, delimiter, start, list(range(1, width)),
                                   np.float32 if role == "features" else None, width), said)


_LAYOUT = {"edges": "an edge table's lines hold a source id and a destination id.",
           "features": "a feature table's lines hold a vertex id, then its features.",
           "split": "a split table's lines hold a vertex id and its set (train, val or test)."}


def _sample(path: Path) -> tuple[int, list[str]]:
    """(the first row's line index, the first rows' text), blank lines and '#' comments left out."""
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    lines, first = [], None
    try:
        with opener(path, "rt", encoding="utf-8", newline="") as text:
            for number, line in enumerate(text):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                first = number if first is None else first
                lines.append(line)
                if len(lines) == _SAMPLE:
                    break
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise read_error(path, exc, f"{path}: cannot be read as text ({exc}).") from None
    return first or 0, lines


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _is_header(rows: list[list[str]]) -> bool:
    """A first row is a header where it names its columns (known words), or where a column holds numbers
    in every row but the first."""
    head, rest = rows[0], rows[1:]
    if all(field.strip().strip('"').lower() in _COLUMN_WORDS for field in head):
        return True
    return bool(rest) and any(not _is_number(field) and all(_is_number(row[j]) for row in rest)
                              for j, field in enumerate(head))


def _load(path: Path, delimiter: str | None, skip: int, columns: list[int], kind, width: int) -> np.ndarray:
    """``columns`` of the rows from line ``skip`` on: as ``kind``, else whole numbers where every value is one,
    else text. A table numpy refuses is refused naming its first bad line as an editor numbers it."""
    for dtype in ([kind] if kind is not None else [np.int64, str]):
        try:
            return np.loadtxt(path, delimiter=delimiter, skiprows=skip, usecols=columns, dtype=dtype, ndmin=2,
                              comments="#", quotechar='"', encoding="utf-8")
        except ValueError as exc:
            problem = str(exc)
    raise DataError(f"{path}: {_first_bad_line(path, delimiter, skip, columns, kind, width) or problem}")


def _first_bad_line(path: Path, delimiter: str | None, skip: int, columns: list[int], kind, width: int) -> str:
    """Where a table goes wrong, by line number from 1 (numpy counts rows after the header, and not alike in
    its messages): a line of another width than the first's, or a value that is no number where numbers are
    read. Empty when none is found (numpy's message stands)."""
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", newline="") as text:
            for number, line in enumerate(text, 1):
                line = line.partition("#")[0].strip()
                if number <= skip or not line:
                    continue
                fields = [f.strip().strip('"') for f in (line.split(delimiter) if delimiter else line.split())]
                if len(fields) != width:
                    return (f"line {number} holds {len(fields)} column(s), and the lines before it {width}; every "
                            f"line of a table holds as many as the first.")
                bad = next((c for c in columns if kind is not None and not _is_number(fields[c])), None)
                if bad is not None:
                    return f"line {number}, column {bad + 1}: {fields[bad]!r} is not a number."
    except (OSError, UnicodeDecodeError, EOFError):
        pass
    return ""
