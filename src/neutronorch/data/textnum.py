"""Numbers from (gzip-compressed) CSV text, streamed in blocks and parsed by numba into a preallocated array
(OGB ships its arrays so). Floats are parsed as decimal mantissa and exponent and rounded once; ``nan`` reads
as NaN. Text that is not a number, and for integer arrays a number that is not whole or does not fit, raises
``TextError`` saying where, never read as something else."""

from __future__ import annotations

import gzip
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np
from numba import njit

from neutronorch.errors import DataError

BLOCK = 1 << 24  # bytes of text parsed at a time
_POW10 = 10.0 ** np.arange(23)


@njit(cache=True, nogil=True)
def _is_separator(c):
    return c == 44 or c == 10 or c == 13 or c == 32 or c == 9  # , \n \r space tab


@njit(cache=True, nogil=True)
def _parse(buf, out, start, pow10, width, in_line):
    """Parse the numbers of ``buf`` into ``out[start:]``. Returns (index after the last one, byte offset of a
    problem or -1, values on the unfinished last line, problem): 0 all read, 1 ``out`` full, 2 text that is
    not a number, 3 a line of other than ``width`` values (``width`` > 0)."""
    n = buf.shape[0]
    i = 0
    k = start
    while i < n:
        c = buf[i]
        if _is_separator(c):
            if c == 10:
                if width > 0 and in_line != 0 and in_line != width:
                    return k, i, in_line, 3
                in_line = 0
            i += 1
            continue
        if k >= out.shape[0]:
            return -1, i, in_line, 1
        in_line += 1
        at = i
        if (c == 110 or c == 78) and i + 2 < n and (buf[i + 1] == 97 or buf[i + 1] == 65) \
                and (buf[i + 2] == 110 or buf[i + 2] == 78):  # nan, NaN, NAN
            i += 3
            if i < n and not _is_separator(buf[i]):
                return k, at, in_line, 2
            out[k] = np.nan
            k += 1
            continue
        negative = False
        if c == 45 or c == 43:
            negative = c == 45
            i += 1
        mantissa = 0
        digits = 0
        seen = 0  # digits seen, kept or not: none means this is no number
        scale = 0  # decimal places after the point
        while i < n and 48 <= buf[i] <= 57:
            seen += 1
            if digits < 18:
                mantissa = mantissa * 10 + (buf[i] - 48)
                digits += 1
            else:
                scale -= 1  # beyond int64: drop the digit, keep the magnitude
            i += 1
        if i < n and buf[i] == 46:  # .
            i += 1
            while i < n and 48 <= buf[i] <= 57:
                seen += 1
                if digits < 18:
                    mantissa = mantissa * 10 + (buf[i] - 48)
                    digits += 1
                    scale += 1
                i += 1
        if seen == 0:
            return k, at, in_line, 2
        exponent = 0
        if i < n and (buf[i] == 101 or buf[i] == 69):  # e E
            i += 1
            exp_negative = False
            if i < n and (buf[i] == 45 or buf[i] == 43):
                exp_negative = buf[i] == 45
                i += 1
            exp_digits = 0
            while i < n and 48 <= buf[i] <= 57:
                if exponent < 100000:  # any larger exponent overflows or underflows a float64 alike
                    exponent = exponent * 10 + (buf[i] - 48)
                exp_digits += 1
                i += 1
            if exp_digits == 0:
                return k, at, in_line, 2
            if exp_negative:
                exponent = -exponent
        if i < n and not _is_separator(buf[i]):
            return k, at, in_line, 2
        power = exponent - scale
        value = float(mantissa)
        if 0 <= power <= 22:
            value = value * pow10[power]
        elif -22 <= power < 0:
            value = value / pow10[-power]  # exact operands: one correctly rounded division
        elif power > 400:
            value = np.inf if mantissa else 0.0
        elif power < -400:
            value = 0.0
        else:
            value = value * 10.0 ** power
        out[k] = -value if negative else value
        k += 1
    return k, -1, in_line, 0


class TextError(DataError, ValueError):
    """A text file that does not hold what its reader expects; the message names the file and the place."""


def read_numbers(path: str | os.PathLike, out: np.ndarray, progress: Callable[[int], None] | None = None,
                 width: int = 0) -> int:
    """Stream the numbers of ``path`` into ``out``; return their count. ``progress(compressed bytes read)``
    after every block; a thread decompresses the next block meanwhile. ``TextError``: more numbers than
    ``out`` holds, text that is not a number, a line of other than ``width`` values, or for an integer ``out``
    a number that is not whole or out of range."""
    state = {"count": 0, "lines": 0, "in_line": 0}  # lines before the block parsed, to say where
    with open(path, "rb") as raw, ThreadPoolExecutor(max_workers=1) as reader:
        text = gzip.GzipFile(fileobj=raw) if str(path).endswith(".gz") else raw
        tail = b""
        pending = reader.submit(_read_block, text, raw)
        while True:
            block, position = pending.result()
            if not block:
                break
            pending = reader.submit(_read_block, text, raw)
            block = tail + block
            cut = max(block.rfind(b"\n"), block.rfind(b","))
            if cut < 0:
                tail = block
                continue
            tail = block[cut + 1:]
            _parse_into(block[:cut + 1], out, state, path, width)
            if progress is not None:
                progress(position)
        _parse_into(tail + b"\n", out, state, path, width)  # a last line without its newline
    return state["count"]


def _read_block(text, raw) -> tuple[bytes, int]:
    return text.read(BLOCK), raw.tell()


def _parse_into(text: bytes, out: np.ndarray, state: dict, path, width: int) -> None:
    buf = np.frombuffer(text, dtype=np.uint8)
    start = state["count"]
    integers = out.dtype.kind in "iu"
    # Integers are parsed as float64 and checked before they are stored: a cast would truncate 1.5, wrap a
    # value beyond the type's range and turn NaN into an arbitrary id, silently.
    target = np.empty((buf.shape[0] + 1) // 2, np.float64) if integers else out
    end, bad, state["in_line"], problem = _parse(buf, target, 0 if integers else start, _POW10, width,
                                                 state["in_line"])
    if problem:
        line = state["lines"] + text.count(b"\n", 0, max(bad, 0)) + 1
        if problem == 1:
            raise TextError(f"{path}: holds more values than expected (over {out.shape[0]})")
        if problem == 3:
            raise TextError(f"{path}: line {line} holds {state['in_line']} values, where every line holds {width} "
                            f"(as the first does)")
        snippet = text[bad:bad + 24].split(b"\n")[0].decode("utf-8", "replace")
        raise TextError(f"{path}: line {line} holds {snippet!r}, which is not a number")
    state["lines"] += text.count(b"\n")
    if not integers:
        state["count"] = end
        return
    values = target[:end]
    # Beyond 2**53 a float64 no longer holds every whole number, so such a value was not read exactly.
    low, high = max(float(np.iinfo(out.dtype).min), -2.0 ** 53), min(float(np.iinfo(out.dtype).max), 2.0 ** 53)
    bad_values = ~np.isfinite(values) | (values != np.floor(values)) | (values < low) | (values > high)
    if bad_values.any():
        at = int(np.flatnonzero(bad_values)[0])
        raise TextError(f"{path}: value number {start + at + 1} is {float(values[at])!r}, not a whole number "
                        f"between {low:.0f} and {high:.0f}")
    if start + end > out.shape[0]:
        raise TextError(f"{path}: holds more values than expected (over {out.shape[0]})")
    out[start:start + end] = values
    state["count"] = start + end
