"""Seeded mutation fuzzing of the loaders: every damaged input ends in a clear error or a correct load.

Each case starts from a valid small dataset (a native directory, an OGB folder in its CSV layout or a SNAP
edge list), damages it in one random way (truncation, flipped bytes, a header rewritten, another dtype or
shape, ids out of range or repeated, meta.json broken or holding values its fields cannot mean, an OGB count
or table line changed, dropped, merged or repeated, junk lines) and loads it. A ``DataError``/``ConfigError`` passes, so does a load
that returns a graph passing ``Graph.validate``; any other exception is a failure, listed with its case.
"""

import gzip
import json
import traceback

import numpy as np
import pytest

from neutronorch.data import load_dataset
from neutronorch.data.graph import Graph
from neutronorch.data.native import ARRAYS, save_native
from neutronorch.errors import NeutronorchError

CASES = 2400


def base_graph() -> Graph:
    rng = np.random.default_rng(0)
    n = 40
    src = rng.integers(0, n, 160)
    dst = rng.integers(0, n, 160)
    from neutronorch.data.csc import edges_to_csc

    indptr, indices = edges_to_csc(src, dst, n)
    order = rng.permutation(n)
    return Graph(name="fuzz", indptr=indptr, indices=indices,
                 features=rng.standard_normal((n, 5)).astype(np.float32),
                 labels=rng.integers(0, 3, n).astype(np.int64), train_idx=np.sort(order[:20]),
                 val_idx=np.sort(order[20:30]), test_idx=np.sort(order[30:]), num_classes=3)


def mutate_native(directory, rng) -> str:
    kind = rng.integers(0, 9)
    name = ARRAYS[rng.integers(0, len(ARRAYS))]
    path = directory / f"{name}.npy"
    data = path.read_bytes()
    if kind == 0:
        cut = int(rng.integers(0, len(data)))
        path.write_bytes(data[:cut])
        return f"{name}.npy truncated to {cut} bytes"
    if kind == 1:
        at = int(rng.integers(0, min(len(data), 128)))
        flipped = bytearray(data)
        flipped[at] ^= 1 << int(rng.integers(0, 8))
        path.write_bytes(bytes(flipped))
        return f"{name}.npy header byte {at} flipped"
    if kind == 2:
        at = int(rng.integers(128, max(129, len(data))))
        flipped = bytearray(data)
        if at < len(flipped):
            flipped[at] = int(rng.integers(0, 256))
        path.write_bytes(bytes(flipped))
        return f"{name}.npy payload byte {at} replaced"
    array = np.load(path)
    if kind == 3:
        dtype = [np.float64, np.int8, np.int16, np.uint8, np.uint64, np.float16, np.bool_, np.complex64][
            int(rng.integers(0, 8))]
        np.save(path, array.astype(dtype))
        return f"{name}.npy as {np.dtype(dtype).name}"
    if kind == 4:
        shape = [(array.size,), (1, array.size), (array.size, 1), (0,), (2,) + array.shape][int(rng.integers(0, 5))]
        np.save(path, np.resize(array, shape))
        return f"{name}.npy reshaped to {shape}"
    if kind == 5:
        if array.size:
            flat = array.reshape(-1).copy()
            if flat.dtype.kind in "iu":
                value = [-1, 40, 10**9, int(np.iinfo(flat.dtype).min)][int(rng.integers(0, 4))]
            else:
                value = [np.nan, np.inf, -np.inf, 1e38][int(rng.integers(0, 4))]
            flat[int(rng.integers(0, flat.size))] = value
            np.save(path, flat.reshape(array.shape))
        return f"{name}.npy one value out of range"
    if kind == 6:
        if array.ndim == 1 and array.size > 1:
            array = array.copy()
            array[int(rng.integers(1, array.size))] = array[0]
            np.save(path, array)
        return f"{name}.npy one id repeated"
    meta_path = directory / "meta.json"
    meta = json.loads(meta_path.read_text())
    if kind == 7:
        key = list(meta)[int(rng.integers(0, len(meta)))]
        value = [None, "x", -1, 10**12, [1], {"a": 1}, 2.5, True, 10**9, "auroc", 4.0, 2**63][int(rng.integers(0, 12))]
        if rng.integers(0, 4) == 0:  # a key of its own: a misspelt one, or an optional one with a bad value
            key = ["metric", "feature_dtype", "notes", "metrc"][int(rng.integers(0, 4))]
        meta[key] = value
        meta_path.write_text(json.dumps(meta))
        return f"meta.json {key}={value!r}"
    text = meta_path.read_text()
    cut = int(rng.integers(0, len(text)))
    meta_path.write_text(text[:cut])
    return f"meta.json truncated to {cut} characters"


def ogb_directory(root) -> None:
    """A small dataset in OGB's CSV layout, from ``base_graph``'s arrays."""
    graph = base_graph()
    raw, split = root / "raw", root / "split" / "random"
    raw.mkdir(parents=True)
    split.mkdir(parents=True)
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    tables = {raw / "edge.csv.gz": np.stack([np.asarray(graph.indices), dst], 1), raw / "node-feat.csv.gz": graph.features,
              raw / "node-label.csv.gz": graph.labels[:, None], raw / "num-node-list.csv.gz": [[graph.num_nodes]],
              raw / "num-edge-list.csv.gz": [[graph.num_edges]], split / "train.csv.gz": graph.train_idx[:, None],
              split / "valid.csv.gz": graph.val_idx[:, None], split / "test.csv.gz": graph.test_idx[:, None]}
    for path, rows in tables.items():
        with gzip.open(path, "wt", compresslevel=1) as f:
            f.write("".join(",".join(str(v) for v in row) + "\n" for row in rows))


OGB_FILES = ("raw/edge.csv.gz", "raw/node-feat.csv.gz", "raw/node-label.csv.gz", "raw/num-node-list.csv.gz",
             "raw/num-edge-list.csv.gz", "split/random/train.csv.gz", "split/random/valid.csv.gz",
             "split/random/test.csv.gz")


def mutate_ogb(root, rng) -> str:
    """One OGB file damaged: a count changed, lines dropped, merged or repeated, a value replaced by one the
    file cannot mean, the compressed bytes cut."""
    name = OGB_FILES[int(rng.integers(0, len(OGB_FILES)))]
    path = root / name
    kind = int(rng.integers(0, 6))
    if kind == 5:
        data = path.read_bytes()
        path.write_bytes(data[:int(rng.integers(0, len(data)))])
        return f"{name} cut"
    with gzip.open(path, "rt") as f:
        lines = f.read().splitlines()
    at = int(rng.integers(0, len(lines)))
    if kind == 0:
        lines[at] = str([-1, 0, 41, 10**12, 2**63, 39][int(rng.integers(0, 6))])
    elif kind == 1:
        del lines[at:at + int(rng.integers(1, 4))]
    elif kind == 2 and at + 1 < len(lines):
        lines[at:at + 2] = [lines[at] + "," + lines[at + 1]]
    elif kind == 3:
        lines.insert(at, lines[at])
    else:
        values = lines[at].split(",")
        values[int(rng.integers(0, len(values)))] = ["1.5", "nan", "x", "1e400", "-0", "99999999999999999999", "",
                                                     "1,2"][int(rng.integers(0, 8))]
        lines[at] = ",".join(values)
    with gzip.open(path, "wt", compresslevel=1) as f:
        f.write("\n".join(lines) + "\n")
    return f"{name} damage {kind} at line {at + 1}"


def mutate_edge_list(rng) -> str:
    lines = [f"{int(rng.integers(0, 30))} {int(rng.integers(0, 30))}" for _ in range(60)]
    junk = ["", "   ", "# comment", "1", "1 2 3 4", "a b", "1 -2", "-1 2", "1.5 2", "1 2 0.5", "1e3 2",
            "99999999999999999999 1", "1\t2", "1,2", "\x00\x01", "1 2 nan", "0x10 3", "１ ２"]
    for _ in range(int(rng.integers(1, 4))):
        lines.insert(int(rng.integers(0, len(lines) + 1)), junk[int(rng.integers(0, len(junk)))])
    return "\n".join(lines) + ("\n" if rng.integers(0, 2) else "")


@pytest.mark.slow
def test_damaged_inputs_end_in_a_clear_error_or_a_correct_load(tmp_path):
    rng = np.random.default_rng(20261130)
    failures = []
    for case in range(CASES):
        if case % 3 == 2:
            path = tmp_path / f"e{case}.txt"
            text = mutate_edge_list(rng)
            path.write_text(text)
            what = f"edge list {text[:60]!r}..."
        elif case % 6 == 1:
            path = tmp_path / f"ogbn_o{case}"
            ogb_directory(path)
            what = mutate_ogb(path, rng)
        else:
            path = tmp_path / f"n{case}"
            save_native(base_graph(), path)
            what = mutate_native(path, rng)
        try:
            graph = load_dataset(str(path))
            graph.validate(str(path))
        except NeutronorchError:
            continue
        except Exception:  # noqa: BLE001 - the failure this test looks for
            failures.append(f"case {case} ({what}): {traceback.format_exc(limit=-2)}")
    assert not failures, f"{len(failures)} of {CASES} cases ended in a traceback:\n" + "\n".join(failures[:8])
