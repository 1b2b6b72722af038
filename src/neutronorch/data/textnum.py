"""Numbers from gzip-compressed CSV text, streamed: read in blocks, parsed by numba into a preallocated
array, so a file is never held whole in memory (OGB ships its arrays this way).

``read_numbers(path, out)`` fills ``out`` (1-D, any numeric dtype) with the file's comma- or
newline-separated numbers in order and returns how many it read; ``first_line_width(path)`` is the number
of values on the first line (a table's column count). Floats are parsed as decimal mantissa and exponent
in float64 and rounded once to ``out``'s type; ``nan`` (any case) reads as NaN.
"""

from __future__ import annotations

import gzip
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np
from numba import njit

BLOCK = 1 << 24  # bytes of text parsed at a time
_POW10 = 10.0 ** np.arange(23)


@njit(cache=True, nogil=True)
def _parse(buf, out, start, pow10):
    """Parse the numbers of ``buf`` (bytes) into ``out[start:]``; return the index after the last one, or
    -1 if ``out`` has no room for them all."""
    n = buf.shape[0]
    i = 0
    k = start
    while i < n:
        if k >= out.shape[0]:
            while i < n and (buf[i] == 44 or buf[i] == 10 or buf[i] == 13 or buf[i] == 32 or buf[i] == 9):
                i += 1
            if i < n:
                return -1
            break
        c = buf[i]
        if c == 44 or c == 10 or c == 13 or c == 32 or c == 9:  # , \n \r space tab
            i += 1
            continue
        if c == 110 or c == 78:  # nan / NaN
            out[k] = np.nan
            k += 1
            while i < n and buf[i] != 44 and buf[i] != 10 and buf[i] != 13:
                i += 1
            continue
        negative = False
        if c == 45 or c == 43:
            negative = c == 45
            i += 1
        mantissa = 0
        digits = 0
        scale = 0  # decimal places after the point
        while i < n and 48 <= buf[i] <= 57:
            if digits < 18:
                mantissa = mantissa * 10 + (buf[i] - 48)
                digits += 1
            else:
                scale -= 1  # beyond int64: drop the digit, keep the magnitude
            i += 1
        if i < n and buf[i] == 46:  # .
            i += 1
            while i < n and 48 <= buf[i] <= 57:
                if digits < 18:
                    mantissa = mantissa * 10 + (buf[i] - 48)
                    digits += 1
                    scale += 1
                i += 1
        exponent = 0
        if i < n and (buf[i] == 101 or buf[i] == 69):  # e E
            i += 1
            exp_negative = False
            if i < n and (buf[i] == 45 or buf[i] == 43):
                exp_negative = buf[i] == 45
                i += 1
            while i < n and 48 <= buf[i] <= 57:
                exponent = exponent * 10 + (buf[i] - 48)
                i += 1
            if exp_negative:
                exponent = -exponent
        power = exponent - scale
        value = float(mantissa)
        if 0 <= power <= 22:
            value = value * pow10[power]
        elif -22 <= power < 0:
            value = value / pow10[-power]  # exact operands: one correctly rounded division
        else:
            value = value * 10.0 ** power
        out[k] = -value if negative else value
        k += 1
    return k


def read_numbers(path: str | os.PathLike, out: np.ndarray, progress: Callable[[int], None] | None = None) -> int:
    """Stream the numbers of the (gzip-compressed) text file ``path`` into ``out``; return their count.
    ``progress(compressed bytes read so far)`` is called after every block. A thread decompresses the next
    block while this one is parsed (both release the GIL). Raises ``ValueError`` if the file holds more
    numbers than ``out`` has room for."""
    count = 0
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
            count = _parse_into(block[:cut + 1], out, count, path)
            if progress is not None:
                progress(position)
        if tail.strip():
            count = _parse_into(tail, out, count, path)
    return count


def _read_block(text, raw) -> tuple[bytes, int]:
    return text.read(BLOCK), raw.tell()


def _parse_into(text: bytes, out: np.ndarray, start: int, path) -> int:
    end = _parse(np.frombuffer(text, dtype=np.uint8), out, start, _POW10)
    if end < 0:
        raise ValueError(f"{path}: holds more values than expected (over {out.shape[0]})")
    return end


def first_line_width(path: str | os.PathLike) -> int:
    """How many comma-separated values the first line of ``path`` holds."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as text:
        line = text.readline()
    return line.count(b",") + 1 if line.strip() else 0
