"""The native format: a saved graph reads back memory-mapped, and every kind of damage gives a DataError
that names the file and the problem."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from neutronorch.data.graph import Graph
from neutronorch.data.native import load_native, save_native
from neutronorch.errors import DataError, OutputError


def small_graph(**overrides) -> Graph:
    """A 5-vertex ring (both directions) with 3 features and 2 classes."""
    fields = dict(
        name="ring",
        indptr=np.array([0, 2, 4, 6, 8, 10], dtype=np.int64),
        indices=np.array([1, 4, 0, 2, 1, 3, 2, 4, 3, 0], dtype=np.int32),
        features=np.arange(15, dtype=np.float32).reshape(5, 3),
        labels=np.array([0, 1, 0, 1, 0], dtype=np.int64),
        train_idx=np.array([0, 1], dtype=np.int64),
        val_idx=np.array([2], dtype=np.int64),
        test_idx=np.array([3, 4], dtype=np.int64),
        num_classes=2,
        notes=["hand-made"],
    )
    fields.update(overrides)
    return Graph(**fields)


def test_round_trip_is_memory_mapped(tmp_path):
    graph = small_graph()
    save_native(graph, tmp_path / "ring")
    loaded = load_native(tmp_path / "ring")
    for name in ("indptr", "indices", "features", "labels", "train_idx", "val_idx", "test_idx"):
        array = getattr(loaded, name)
        assert isinstance(array, np.memmap), name
        np.testing.assert_array_equal(array, getattr(graph, name))
        assert array.dtype == getattr(graph, name).dtype
    assert (loaded.name, loaded.num_classes, loaded.notes) == ("ring", 2, ["hand-made"])
    assert loaded.describe() == graph.describe()


def test_round_trip_without_mmap_keeps_float16(tmp_path):
    graph = small_graph(features=np.ones((5, 3), dtype=np.float16))
    save_native(graph, tmp_path)
    loaded = load_native(tmp_path, mmap=False)
    assert not isinstance(loaded.features, np.memmap)
    assert loaded.features.dtype == np.float16


def test_missing_directory(tmp_path):
    with pytest.raises(DataError, match=r"meta\.json: file is missing"):
        load_native(tmp_path / "nowhere")


def test_missing_array_file(tmp_path):
    save_native(small_graph(), tmp_path)
    (tmp_path / "features.npy").unlink()
    with pytest.raises(DataError, match=r"features\.npy: file is missing"):
        load_native(tmp_path)


@pytest.mark.parametrize("mmap", [True, False])
@pytest.mark.parametrize("keep_bytes", [0, 60, -8])
def test_truncated_npy(tmp_path, mmap, keep_bytes):
    save_native(small_graph(), tmp_path)
    path = tmp_path / "indices.npy"
    data = path.read_bytes()
    path.write_bytes(data[:keep_bytes])
    with pytest.raises(DataError, match=r"indices\.npy: cannot be read as a \.npy array.*truncated"):
        load_native(tmp_path, mmap=mmap)


def test_invalid_meta_json(tmp_path):
    save_native(small_graph(), tmp_path)
    (tmp_path / "meta.json").write_text("{not json")
    with pytest.raises(DataError, match=r"meta\.json: not valid JSON"):
        load_native(tmp_path)


def rewrite_meta(directory, **changes) -> None:
    meta_path = directory / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta.update(changes)
    meta_path.write_text(json.dumps(meta))


def test_meta_missing_key(tmp_path):
    save_native(small_graph(), tmp_path)
    meta = json.loads((tmp_path / "meta.json").read_text())
    del meta["num_classes"]
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=r"meta\.json: missing keys \['num_classes'\]"):
        load_native(tmp_path)


def test_meta_wrong_format_version(tmp_path):
    save_native(small_graph(), tmp_path)
    rewrite_meta(tmp_path, format_version=99)
    with pytest.raises(DataError, match="format_version 99 is not supported"):
        load_native(tmp_path)


@pytest.mark.parametrize("key, value", [("num_edges", 11), ("num_nodes", 4), ("feature_dim", 7)])
def test_meta_disagrees_with_arrays(tmp_path, key, value):
    save_native(small_graph(), tmp_path)
    rewrite_meta(tmp_path, **{key: value})
    with pytest.raises(DataError, match=r"\.npy: holds shape .*, but meta\.json says"):
        load_native(tmp_path)


@pytest.mark.parametrize("name, array, message", [
    ("indices", np.array([1, 4, 0, 2, 1, 3, 2, 4, 3, 0], dtype=np.float64),
     "indices must be a 1-D int32 or int64 array, got float64"),
    ("indptr", np.array([0, 2, 4, 6, 8, 10], dtype=np.uint8), "indptr must be a 1-D int32 or int64 array, got uint8"),
    ("features", np.zeros((5, 3), dtype=np.float64), "features have dtype float64"),
    ("labels", np.zeros(5, dtype=np.float32), "labels have dtype float32"),
    ("train_idx", np.array([0.0, 1.0]), "train_idx must be a 1-D integer array"),
])
def test_wrong_dtype(tmp_path, name, array, message):
    save_native(small_graph(), tmp_path)
    np.save(tmp_path / f"{name}.npy", array)
    with pytest.raises(DataError, match=message):
        load_native(tmp_path)


def test_object_array_is_refused(tmp_path):
    save_native(small_graph(), tmp_path)
    np.save(tmp_path / "labels.npy", np.array([0, 1, 0, 1, None], dtype=object))
    with pytest.raises(DataError, match=r"labels\.npy: holds pickled Python objects, not numbers"):
        load_native(tmp_path)  # memory-mapped, as by default: numpy's refusal is worded apart


@pytest.mark.parametrize("bad_id", [5, -1])
def test_vertex_id_out_of_range(tmp_path, bad_id):
    save_native(small_graph(indices=np.array([1, 4, 0, 2, 1, 3, 2, bad_id, 3, 0], dtype=np.int32)), tmp_path)
    with pytest.raises(DataError, match=rf"indices\.npy: indices hold vertex id {bad_id}, out of range for 5 nodes"):
        load_native(tmp_path)


def test_indptr_inconsistent(tmp_path):
    save_native(small_graph(indptr=np.array([0, 2, 1, 6, 8, 10], dtype=np.int64)), tmp_path)
    with pytest.raises(DataError, match=r"indptr\.npy: indptr is not non-decreasing"):
        load_native(tmp_path)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_features(tmp_path, value):
    features = np.zeros((5, 3), dtype=np.float32)
    features[2, 1] = value
    save_native(small_graph(features=features), tmp_path)
    with pytest.raises(DataError, match=r"features\.npy: features contain NaN or inf \(first at vertex 2\)"):
        load_native(tmp_path)


@pytest.mark.parametrize("labels", [[0, 1, 0, 2, 0], [0, -2, 0, 1, 0]])  # -1 is "no label"
def test_labels_out_of_range(tmp_path, labels):
    save_native(small_graph(labels=np.array(labels, dtype=np.int64)), tmp_path)
    with pytest.raises(DataError, match=r"labels\.npy: labels range over .* outside 0\.\.1"):
        load_native(tmp_path)


@pytest.mark.parametrize("split", ["train_idx", "val_idx", "test_idx"])
def test_empty_split(tmp_path, split):
    save_native(small_graph(**{split: np.empty(0, dtype=np.int64)}), tmp_path)
    with pytest.raises(DataError, match=f"{split} is empty"):
        load_native(tmp_path)


def test_split_out_of_range(tmp_path):
    save_native(small_graph(test_idx=np.array([3, 9], dtype=np.int64)), tmp_path)
    with pytest.raises(DataError, match=r"test_idx\.npy: test_idx holds vertex id 9, outside 0\.\.4"):
        load_native(tmp_path)


def test_error_names_the_directory(tmp_path):
    save_native(small_graph(labels=np.array([0, 1, 0, 7, 0], dtype=np.int64)), tmp_path / "bad")
    with pytest.raises(DataError) as caught:
        load_native(tmp_path / "bad")
    assert str(tmp_path / "bad") in str(caught.value)


def test_validate_can_be_skipped(tmp_path):
    save_native(small_graph(labels=np.array([0, 1, 0, 7, 0], dtype=np.int64)), tmp_path)
    assert load_native(tmp_path, validate=False).labels[3] == 7


def test_convert_never_destroys_its_source_and_refuses_unclear_targets(tmp_path, capsys):
    from neutronorch.cli import main

    source = tmp_path / "g"
    assert main(["generate", "synthetic", "--nodes", "300", "--features", "4", "--out", str(source)]) == 0
    before = load_native(source)
    features = np.array(before.features)
    # Onto itself: refused, the dataset intact.
    assert main(["convert", str(source), str(source)]) == 2
    assert "not empty" in capsys.readouterr().err
    np.testing.assert_array_equal(load_native(source).features, features)
    # Onto a file: a clear error, no traceback.
    (tmp_path / "file").write_text("x")
    assert main(["convert", str(source), str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err
    assert "is a file" in err and "Traceback" not in err
    # Onto a folder of other files: refused even with --overwrite.
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("keep me")
    assert main(["convert", str(source), str(tmp_path / "other"), "--overwrite"]) == 2
    assert (tmp_path / "other" / "notes.txt").read_text() == "keep me"
    # In place with --overwrite: rewritten from its own memory maps, correctly.
    assert main(["convert", str(source), str(source), "--float16", "--overwrite"]) == 0
    after = load_native(source)
    assert after.features.dtype == np.float16
    np.testing.assert_allclose(after.features.astype(np.float32), features, rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(after.indices, before.indices)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no partial or old folders left


def test_convert_refuses_features_beyond_the_narrower_range_before_writing(tmp_path, capsys):
    from neutronorch.cli import main

    features = np.arange(15, dtype=np.float32).reshape(5, 3)
    features[1, 2], features[3, 0] = 1e5, -7e4  # beyond float16's 65504
    source = tmp_path / "source"
    save_native(small_graph(features=features), source)
    for out, extra in ((tmp_path / "half", []), (source, ["--overwrite"])):
        assert main(["convert", str(source), str(out), "--float16", *extra]) == 2
        err = capsys.readouterr().err
        assert (f"{source}: 2 feature values lie beyond float16's range (largest finite 65504), the largest of "
                f"magnitude 100000; float16 would store them as infinity. Convert with --bfloat16") in err, err
        assert "Traceback" not in err and "RuntimeWarning" not in err
    assert not (tmp_path / "half").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    np.testing.assert_array_equal(load_native(source).features, features)  # the source untouched
    assert main(["convert", str(source), str(tmp_path / "bf16"), "--bfloat16"]) == 0  # bfloat16 holds them
    assert np.isfinite(np.asarray(load_native(tmp_path / "bf16").features, np.float32)).all()


@pytest.mark.parametrize("value, message", [
    (np.nan, "the features hold NaN or infinity (first at row 2)"),
    (np.inf, "the features hold NaN or infinity (first at row 2)"),
    (3.4e38, "1 feature values lie beyond bfloat16's range"),
])
def test_narrowing_names_what_it_cannot_store(value, message):
    from neutronorch.data.dtypes import narrowed

    rows = np.ones((4, 2), np.float32)
    rows[2, 1] = value
    with pytest.raises(DataError, match=re.escape(f"src: {message}")):
        narrowed(rows, "bfloat16" if value == 3.4e38 else "float16", "src")
    assert narrowed(np.full((3, 2), 65504, np.float32), "float16", "src").max() == 65504


def test_a_failed_write_leaves_the_previous_dataset(tmp_path, monkeypatch):
    from neutronorch.data import native

    save_native(small_graph(), tmp_path / "d")
    calls = {"n": 0}
    real = native.save_array

    def failing(path, arr):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full")
        real(path, arr)

    monkeypatch.setattr(native, "save_array", failing)
    with pytest.raises(OutputError, match="cannot write .*d: disk full; what was there is kept"):
        save_native(small_graph(labels=np.array([1, 1, 1, 1, 1], dtype=np.int64)), tmp_path / "d", overwrite=True)
    assert load_native(tmp_path / "d").labels.tolist() == small_graph().labels.tolist()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


@pytest.mark.parametrize("overrides,message", [
    (dict(train_idx=np.array([0, 1, 1], dtype=np.int64)), "train_idx holds 1 duplicate vertex ids (first: 1)"),
    (dict(test_idx=np.array([3, 4, 3], dtype=np.int64)), "test_idx holds 1 duplicate"),
    (dict(val_idx=np.array([1], dtype=np.int64)), "1 training vertices are also in val_idx (first: 1)"),
    (dict(test_idx=np.array([0, 3], dtype=np.int64)), "also in test_idx (first: 0)"),
    (dict(test_idx=np.array([2, 3, 4], dtype=np.int64)), "test_idx.npy: 1 validation vertices are also in test_idx "
                                                         "(first: 2), of 1 validation and 3 test vertices"),
])
def test_overlapping_or_repeated_splits_are_refused(tmp_path, overrides, message):
    save_native(small_graph(**overrides), tmp_path / "d")
    with pytest.raises(DataError, match=re.escape(message)):
        load_native(tmp_path / "d")


def test_a_test_set_that_is_the_validation_set_is_allowed_and_said(tmp_path):
    """Data without labelled test vertices may score its validation set twice (MAG240M's loader does): the
    whole set, never part of it, and a note says so."""
    save_native(small_graph(test_idx=np.array([2], dtype=np.int64)), tmp_path / "d")
    graph = load_native(tmp_path / "d")
    assert sum("the test split is the validation split (1 vertices)" in note for note in graph.notes) == 1
    graph.validate("again")
    assert sum("the test split is the validation split" in note for note in graph.notes) == 1
    from neutronorch.data.splits import split_overlap

    notes = []
    assert split_overlap([0, 1], [], [], notes) is None and notes == []  # no node split (a link task): no note


def test_a_split_given_for_data_with_its_own_split_is_said_to_be_ignored(tmp_path):
    from neutronorch.data import load_dataset

    save_native(small_graph(), tmp_path / "d")
    graph = load_dataset(str(tmp_path / "d"), split="ratio:0.5,0.2")
    assert graph.train_idx.tolist() == [0, 1]
    assert any("`split` ratio:0.5,0.2 ignored" in note for note in graph.notes)
    assert not any("ignored" in note for note in load_dataset(str(tmp_path / "d")).notes)


def test_a_split_given_for_a_synthetic_graph_follows_the_run_seed():
    from neutronorch.data import load_dataset

    spec = "synthetic:nodes=600,degree=6,features=4,classes=3"
    a, b = (load_dataset(spec, split="ratio:0.5,0.2", seed=s).train_idx for s in (1, 2))
    assert not np.array_equal(a, b)
    assert np.array_equal(a, load_dataset(spec, split="ratio:0.5,0.2", seed=1).train_idx)
    # The graph's own split is part of the graph: the run seed does not change it.
    assert np.array_equal(load_dataset(spec, seed=1).train_idx, load_dataset(spec, seed=2).train_idx)


def test_info_counts_self_loops_repeats_and_one_way_edges_of_a_native_graph(tmp_path, capsys):
    from neutronorch.cli import main

    clean = small_graph()
    save_native(clean, tmp_path / "clean")
    # Vertex 0's in-neighbours 1, 4 become 0 (a self loop), 4, 4 (a repeat); 1 -> 0 loses its reverse.
    dirty = small_graph(indptr=np.array([0, 3, 5, 7, 9, 11], dtype=np.int64),
                        indices=np.array([0, 4, 4, 0, 2, 1, 3, 2, 4, 3, 0], dtype=np.int32))
    save_native(dirty, tmp_path / "dirty")
    counts = {}
    for name in ("clean", "dirty"):
        assert main(["info", str(tmp_path / name)]) == 0
        info = json.loads(capsys.readouterr().out)
        counts[name] = (info["self_loops"], info["duplicate_edges"], info["edges_without_reverse"])
    assert counts["clean"] == (0, 0, 0)
    # 0 -> 1 (in vertex 1's column) lacks its reverse: 1 is no longer among vertex 0's in-neighbours.
    assert counts["dirty"] == (1, 1, 1)


def test_bfloat16_features_are_stored_as_bits_and_read_back_as_bfloat16(tmp_path):
    import torch

    from neutronorch.data.dtypes import bfloat16

    values = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32) * 1e5  # beyond float16
    save_native(small_graph(features=values.astype(bfloat16())), tmp_path / "ring")
    assert json.loads((tmp_path / "ring" / "meta.json").read_text())["feature_dtype"] == "bfloat16"
    assert np.load(tmp_path / "ring" / "features.npy").dtype == np.uint16
    loaded = load_native(tmp_path / "ring")
    assert loaded.features.dtype.name == "bfloat16" and isinstance(loaded.features, np.memmap)
    rounded = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(loaded.features.view(np.uint16), rounded)  # torch's rounding, bit for bit
    assert np.isfinite(np.asarray(loaded.features, dtype=np.float32)).all()


@pytest.mark.parametrize("damage, message", [
    (lambda d: _set_meta(d, feature_dtype="float8"), "feature_dtype is 'float8'"),
    (lambda d: np.save(d / "features.npy", np.zeros((5, 3), np.float32)), "holds float32"),
])
def test_a_bfloat16_dataset_with_mismatched_files_is_refused(tmp_path, damage, message):
    from neutronorch.data.dtypes import bfloat16

    save_native(small_graph(features=np.ones((5, 3), bfloat16())), tmp_path / "ring")
    damage(tmp_path / "ring")
    with pytest.raises(DataError, match=message):
        load_native(tmp_path / "ring")


def _set_meta(directory, **values):
    meta = json.loads((directory / "meta.json").read_text())
    meta.update(values)
    (directory / "meta.json").write_text(json.dumps(meta))


@pytest.mark.slow
def test_convert_to_bfloat16_and_train_on_it_in_either_precision(tmp_path):
    from neutronorch import TrainConfig, train
    from neutronorch.cli import main

    source, out = tmp_path / "source", tmp_path / "bf16"
    assert main(["generate", "synthetic", "--nodes", "600", "--features", "8", "--classes", "4",
                 "--out", str(source)]) == 0
    assert main(["convert", str(source), str(out), "--bfloat16"]) == 0
    with pytest.raises(SystemExit):  # one or the other
        main(["convert", str(source), str(tmp_path / "x"), "--bfloat16", "--float16"])
    original, halved = load_native(source), load_native(out)
    assert halved.features.dtype.name == "bfloat16"
    assert np.abs(np.asarray(halved.features, np.float32) - original.features).max() <= \
        np.abs(original.features).max() * 2 ** -8
    for precision, mode in (("fp32", "exact"), ("bf16", "exact"), ("fp32", "device")):
        runs = [train(TrainConfig(dataset=str(data), fanouts=[4, 4], hidden=16, batch_size=16, epochs=6, lr=0.01,
                                  dropout=0.2, precision=precision, mode=mode, threads=1, sampler_threads=1,
                                  progress=False))
                for data in (source, out)]
        # Features rounded to bfloat16 train as the float32 ones do (the same seed, the same batches).
        losses = [[e["train_loss"] for e in run["epochs"]] for run in runs]
        assert losses[1][-1] < 0.8 * losses[1][0], (precision, mode)
        np.testing.assert_allclose(losses[1], losses[0], rtol=0.03, err_msg=f"{precision} {mode}")
        assert abs(runs[1]["test_acc"] - runs[0]["test_acc"]) < 0.05, (precision, mode)


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_a_saved_dataset_folder_gets_the_permissions_mkdir_gives_and_a_replaced_one_keeps_its_own(tmp_path, umask):
    import os
    import stat

    def mode(path):
        return stat.S_IMODE(path.stat().st_mode)

    previous = os.umask(umask)
    try:
        save_native(small_graph(), tmp_path / "new")
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty").chmod(0o711)
        save_native(small_graph(), tmp_path / "empty")
        save_native(small_graph(), tmp_path / "shared")
        (tmp_path / "shared").chmod(0o775)
        save_native(small_graph(), tmp_path / "shared", overwrite=True)
    finally:
        os.umask(previous)
    assert mode(tmp_path / "new") == 0o777 & ~umask  # not mkdtemp's 0700
    assert {mode(p) for p in (tmp_path / "new").iterdir()} == {0o666 & ~umask}
    assert mode(tmp_path / "empty") == 0o711 and mode(tmp_path / "shared") == 0o775
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "new", "shared"]


@pytest.mark.parametrize("changes, message", [
    (dict(num_classes=10 ** 9), r"meta\.json: num_classes is 1000000000, more than the 5 labels can carry \(they use "
                                r"classes 0\.\.1\)\. Set it to 2"),
    (dict(metric="auroc"), r"meta\.json: metric is 'auroc', which names no metric; use one of accuracy, rocauc"),
    (dict(metric=3), r"meta\.json: metric is 3, which names no metric"),
    (dict(name=["ring"]), r"meta\.json: name is \['ring'\], expected a name"),
    (dict(metrc="rocauc"), r"meta\.json: unknown keys \['metrc'\]"),
    (dict(num_nodes=5.0), r"meta\.json: num_nodes is 5\.0, expected a whole number"),
])
def test_meta_values_a_field_cannot_mean_are_refused(tmp_path, changes, message):
    save_native(small_graph(), tmp_path)
    rewrite_meta(tmp_path, **changes)
    with pytest.raises(DataError, match=message):
        load_native(tmp_path)


def test_a_key_given_twice_in_meta_json_is_refused(tmp_path):
    save_native(small_graph(), tmp_path)
    text = (tmp_path / "meta.json").read_text()
    (tmp_path / "meta.json").write_text(text.replace('"num_classes": 2', '"num_classes": 2, "num_classes": 9'))
    with pytest.raises(DataError, match=r"meta\.json: gives num_classes more than once"):
        load_native(tmp_path)


@pytest.mark.parametrize("mmap, message", [(False, "holds pickled Python objects"), (True, "holds pickled Python")])
def test_a_pickled_array_is_refused_without_suggesting_allow_pickle(tmp_path, mmap, message):
    save_native(small_graph(), tmp_path)
    np.save(tmp_path / "labels.npy", np.array([0, 1, 0, 1, None], dtype=object))
    with pytest.raises(DataError, match=rf"labels\.npy: {message}") as error:
        load_native(tmp_path, mmap=mmap)
    assert "allow_pickle" not in str(error.value)


@pytest.mark.parametrize("refused", ["meta.json", "features.npy", "train_idx.npy"])
def test_an_unreadable_file_says_permission_denied(tmp_path, monkeypatch, refused):
    import builtins
    import io

    save_native(small_graph(), tmp_path)
    original = builtins.open

    def guarded(file, *args, **kwargs):
        if str(file) == str(tmp_path / refused):
            raise PermissionError(13, "Permission denied", str(file))
        return original(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded)
    monkeypatch.setattr(io, "open", guarded)
    with pytest.raises(DataError, match=rf"cannot read {tmp_path / refused}: permission denied; give the user"):
        load_native(tmp_path, mmap=refused != "features.npy")


def test_an_unreadable_folder_says_permission_denied(tmp_path, monkeypatch):
    import pathlib

    from neutronorch.data import load_dataset

    save_native(small_graph(), tmp_path / "d")

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(pathlib.Path, "is_file", refuse)
    with pytest.raises(DataError, match=r"cannot read .*d(/meta\.json)?: permission denied"):
        load_dataset(str(tmp_path / "d"))


def test_a_loaded_graph_given_in_python_is_not_validated_again(tmp_path, monkeypatch):
    from neutronorch.data import SyntheticSpec, generate, load_dataset

    graph = generate(SyntheticSpec(nodes=200, degree=4, features=4, classes=3))
    graph.labels[graph.train_idx[0]] = -1  # left out of the splits as the graph loads
    save_native(graph, tmp_path / "g")
    loaded = load_dataset(str(tmp_path / "g"))
    calls = []
    monkeypatch.setattr(Graph, "validate", lambda self, *args, **kwargs: calls.append(args))
    loaded.check_given()
    assert calls == []
    loaded.features = np.asarray(loaded.features) * 2  # changed by hand: checked
    loaded.check_given()
    assert len(calls) == 1
