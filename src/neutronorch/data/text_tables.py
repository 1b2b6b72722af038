"""The text tables of ``load_tables`` (tabular.py): CSV, TSV or whitespace-separated, gzip-compressed too, with
'#' comment lines. The delimiter and header are detected from the first lines and the columns read by numpy's
``loadtxt``. Every problem is a ``DataError`` naming the file and the line, numbered from 1 as an editor
numbers them (header and comments counted); a header is quoted by a few of its names and their count."""

from __future__ import annotations

import csv
import gzip
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from neutronorch.data.files import read_error
from neutronorch.errors import DataError

TEXT_SUFFIXES = (".csv", ".tsv", ".txt", ".edges")
# First-line words that name columns: such a line is a header even where the column holds names too.
_COLUMN_WORDS = {"id", "node", "node_id", "nid", "vertex", "vertex_id", "src", "dst", "source", "target",
                 "from", "to", "u", "v", "label", "labels", "class", "y", "split", "set", "name", "user", "item"}
_DELIMITERS = ("\t", ",", ";", "|")
_SAMPLE = 50  # lines read to detect a text table's delimiter and header
_SHOWN = 6  # names of a header quoted in full up to this many; a longer one by its first and last and its count
_LAYOUT = {"edges": "an edge table's lines hold a source id and a destination id.",
           "features": "a feature table's lines hold a vertex id, then its features.",
           "split": "a split table's lines hold a vertex id and its set (train, val or test)."}


@dataclass
class Column:
    """A table's vertex ids (``ids``; None: its rows are vertices 0..rows-1 in order) and the values given
    for them (``values``: one row each), as read from ``path``; ``unit`` names its rows in messages (a text
    table's ``line``, whose first row is line ``start`` counted from 0)."""

    path: Path
    ids: np.ndarray | None
    values: np.ndarray | None
    said: str  # how it was read, for the notes
    unit: str = "row"
    start: int = 0
    ignored: str = ""  # the columns not read, for the notes


def shown_names(names: Sequence[str]) -> str:
    """A header as notes and messages quote it: whole when short, else ``id, f0, f1, ..., f2878 (2,880 columns)``."""
    names = [name if len(name) <= 40 else name[:37] + "..." for name in names]
    if len(names) <= _SHOWN:
        return ",".join(names)
    return f"{', '.join(names[:3])}, ..., {names[-1]} ({len(names):,} columns)"


def places(table: Column, rows: Sequence[int]) -> str:
    """Where rows of ``table`` are: ``line 12``, ``lines 12, 40`` (a text table's, as an editor numbers them),
    ``rows 3, 7 (from 0)`` (an array's or a JSON file's). At most 5 are named."""
    rows = sorted(int(row) for row in rows)
    shown = rows[:5]
    numbers = _line_numbers(table, shown) if table.unit == "line" else shown
    text = f"{table.unit}{'s' if len(rows) > 1 else ''} {', '.join(map(str, numbers))}"
    text += f" and {len(rows) - len(shown):,} more" if len(rows) > len(shown) else ""
    return text if table.unit == "line" else f"{text} (from 0)"


def _line_numbers(table: Column, rows: list[int]) -> list[int]:
    """The line numbers (from 1) of a text table's ``rows`` (from 0, as numpy reads them: blank and comment
    lines skipped)."""
    wanted, found, row = set(rows), {}, 0
    for number, line in _lines(table.path):
        if number <= table.start or not line.partition("#")[0].strip():
            continue
        if row in wanted:
            found[row] = number
            if len(found) == len(wanted):
                break
        row += 1
    return [found.get(row, row + table.start + 1) for row in rows]


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8-sig", newline="") as text:
        yield from enumerate(text, 1)


def _fields(line: str, delimiter: str | None) -> list[str]:
    """A line's fields, quotes as numpy reads them: a quoted field may hold the delimiter."""
    if delimiter is None:
        return [field.strip('"') for field in line.split()]
    parts = next(csv.reader([line], delimiter=delimiter)) if '"' in line else line.split(delimiter)
    return [field.strip().strip('"') for field in parts]


def from_text(path: Path, role: str, header: str, label_column: str | int | None = None) -> Column:
    """``path`` read as a text table of ``role``: edges (ids in each row's first two columns), features (a
    row's id, then its values), labels (a row's id and label, or one label per row in id order; a wider table
    with ``label_column`` naming the labels' column), split (a row's id and its set's name)."""
    first, sample = _sample(path)
    if not sample:
        raise DataError(f"{path}: holds no rows (only blank lines or '#' comments).")
    delimiter = next((d for d in _DELIMITERS if d in sample[0]), None)
    rows = [_fields(line, delimiter) for line in sample]
    widths = {len(row) for row in rows}
    if len(widths) > 1:
        raise DataError(f"{path}: " + (_first_bad_line(path, delimiter, first, [], None, len(rows[0])) or
                                       f"its first lines hold {', '.join(map(str, sorted(widths)))} columns; every "
                                       f"line of a table holds as many as the first."))
    named = header == "yes" or (header == "auto" and _is_header(rows))
    if named and len(rows) == 1:
        raise DataError(f"{path}: holds a header ({shown_names(rows[0])}) and no rows below it; give the table's "
                        f"rows.")
    width = widths.pop()
    start = first + 1 if named else first
    names = rows[0] if named else None
    shown = {"\t": "tab", None: "whitespace"}.get(delimiter, repr(delimiter))
    said = f"{role} {path.name} ({shown}-separated, " + (f"header {shown_names(names)}" if named else "no header")
    table = Column(path, None, None, said + ")", "line", start)
    if role in ("edges", "features", "split") and width < 2:
        raise DataError(f"{path}: holds one column; {_LAYOUT[role]}")
    if role in ("edges", "split") and width > 2:
        table.ignored = (f"{width - 2} column{'s' if width > 3 else ''} after the first two"
                         + (f" ({shown_names(names[2:])})" if named else ""))
    if role == "edges":
        table.values = _load(path, delimiter, start, [0, 1], None, width)
        return table
    values = list(range(1, width))
    if role == "labels":
        column = pick_label_column(path, names, rows[1:] if named else rows, label_column)
        if width == 1:  # a label per line, in id order
            table.values = _load(path, delimiter, start, [0], None, width)
            return table
        values = [column]
        if width > 2:
            table.said = said + f"; labels: column {column}" + (f", {names[column]})" if named else ")")
    elif role == "split":
        values = [1]
    table.ids = _load(path, delimiter, start, [0], None, width)[:, 0]
    table.values = _load(path, delimiter, start, values, np.float32 if role == "features" else None, width)
    return table


def pick_label_column(path: Path, names: list[str] | None, rows: list[list[str]], pick: str | int | None) -> int:
    """The column of a label table (header ``names``, first ``rows``) that holds the labels: the one after the
    id (or the only one), or the one ``pick`` names by header name or index from 0. A table of several
    columns after the id needs ``pick``; a ``pick`` that is no column of labels is refused."""
    width = len(rows[0])
    listing = _listing(range(1, width), names, rows[0]) if width > 1 else "(none: its one column is 0)"
    if pick is None:
        if width <= 2:
            return width - 1
        fewest = min(range(1, width), key=lambda j: (len({row[j] for row in rows}), -j))  # the likeliest labels
        raise DataError(f"{path}: holds {width - 1:,} columns after the id {listing}; a label table gives one label "
                        f"per vertex. Name the labels' column with `label_column` (a header name, or an index from "
                        f"0; 0 is the ids), such as `label_column`={names[fewest] if names else fewest}, or give "
                        f"'id,label' lines.")
    index = _column_index(pick, names)
    if index is None or not 0 <= index < width:
        what = (f"names no column of the header {shown_names(names)}" if names and index is None else
                f"is not one of its {width:,} columns (0..{width - 1})" if index is not None else
                "is no index, and the table has no header naming its columns")
        raise DataError(f"{path}: `label_column` {pick!r} {what}; give the header name or the index from 0 of "
                        f"one of the columns after the id {listing}.")
    if index == 0 and width > 1:
        raise DataError(f"{path}: `label_column` {pick!r} is column 0, the vertex ids; give the labels' column, "
                        f"one of those after the id {listing}.")
    return index


def _column_index(pick: str | int, names: list[str] | None) -> int | None:
    if isinstance(pick, (int, np.integer)) and not isinstance(pick, bool):
        return int(pick)
    text = str(pick).strip()
    if names and text in names:
        return names.index(text)
    return int(text) if text.lstrip("-").isdigit() else None


def _listing(columns: range, names: list[str] | None, row: list[str]) -> str:
    """Columns as messages name them: by index and header name (``(1 facebook_id, 2 page_name)``), or without
    a header by index and first value (``(index and first value: 1 '0.5', 2 'abc')``); over 6 of them the
    first 3 and the last."""
    said = [f"{j} {names[j][:40]}" if names else f"{j} {row[j][:40]!r}" for j in columns]
    if len(said) > _SHOWN:
        said = [*said[:3], "...", said[-1]]
    return f"({'' if names else 'index and first value: '}{', '.join(said)})"


def _sample(path: Path) -> tuple[int, list[str]]:
    """(the first row's line index, the first rows' text), blank lines and '#' comments left out."""
    lines, first = [], None
    try:
        for number, line in _lines(path):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            first = number - 1 if first is None else first
            lines.append(line)
            if len(lines) == _SAMPLE:
                break
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise read_error(path, exc, f"{path}: cannot be read as text ({exc}).") from None
    return first or 0, lines


def is_number(text: str) -> bool:
    """Whether ``text`` reads as a number (as ``float`` reads it)."""
    try:
        float(text)
        return True
    except ValueError:
        return False


def _is_header(rows: list[list[str]]) -> bool:
    """A first row is a header where it names its columns (known words), or where a column holds numbers
    in every row but the first; or, in a table of words, where some column's first cell stands apart from the
    cells below it (``_apart``) and no first cell is a number or a value the rows below hold again."""
    head, rest = rows[0], rows[1:]
    if all(field.lower() in _COLUMN_WORDS for field in head):
        return True
    if not rest:
        return False
    columns = [[row[j] for row in rest] for j in range(len(head))]
    if any(not is_number(field) and all(map(is_number, column)) for field, column in zip(head, columns)):
        return True
    below = {cell for row in rest for cell in row}
    if any(is_number(field) or field in below for field in head):
        return False  # a first row of data: a number, or a value the rows below hold again
    return any(_apart(field, column) for field, column in zip(head, columns))


def _kind(text: str) -> frozenset:
    """The kinds of characters ``text`` holds: letters, digits, others (``cs.AI`` letters and others)."""
    return frozenset("letter" if c.isalpha() else "digit" if c.isdigit() else "other" for c in text)


def _apart(field: str, column: list[str]) -> bool:
    """Whether ``field`` (a first row's cell, neither a number nor below it) stands apart from the cells
    below it: its kind of characters is none of theirs (``category`` over ``cs.AI``, ``node`` over ``p17``),
    or the column repeats its values (classes: at most 1 in 20 of its cells seen once, so a value of the column
    would be seen again) and ``field`` is not one of them (``subject`` over ``physics``, ``math``, ...)."""
    if _kind(field) not in {_kind(cell) for cell in column}:
        return True
    _, counts = np.unique(np.asarray(column), return_counts=True)
    return int((counts == 1).sum()) * 20 <= len(column)


def _load(path: Path, delimiter: str | None, skip: int, columns: list[int], kind, width: int) -> np.ndarray:
    """``columns`` of the rows from line ``skip`` on: as ``kind``, else whole numbers where every value is one,
    else text. A table numpy refuses is refused naming its first bad line as an editor numbers it."""
    for dtype in ([kind] if kind is not None else [np.int64, str]):
        try:
            with warnings.catch_warnings():  # numpy's word on blank lines, which are allowed
                warnings.simplefilter("ignore", UserWarning)
                return np.loadtxt(path, delimiter=delimiter, skiprows=skip, usecols=columns, dtype=dtype, ndmin=2,
                                  comments="#", quotechar='"', encoding="utf-8-sig")
        except ValueError as exc:
            problem = str(exc)
    raise DataError(f"{path}: {_first_bad_line(path, delimiter, skip, columns, kind, width) or problem}")


def _first_bad_line(path: Path, delimiter: str | None, skip: int, columns: list[int], kind, width: int) -> str:
    """Where a table goes wrong, by line number from 1 (numpy counts rows after the header, and not alike in
    its messages): a line of another width than the first's, or a value that is no number where numbers are
    read. Empty when none is found (numpy's message stands)."""
    try:
        for number, line in _lines(path):
            line = line.partition("#")[0].strip()
            if number <= skip or not line:
                continue
            fields = _fields(line, delimiter)
            if len(fields) != width:
                return (f"line {number} holds {len(fields)} column(s), and the lines before it {width}; every "
                        f"line of a table holds as many as the first.")
            bad = next((c for c in columns if kind is not None and not is_number(fields[c])), None)
            if bad is not None:
                return f"line {number}, column {bad + 1}: {fields[bad]!r} is not a number."
    except (OSError, UnicodeDecodeError, EOFError):
        pass
    return ""
