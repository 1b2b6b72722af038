"""A typed graph's link task on its parts: `neutronorch partition TYPED --split edges:T,V --link-relation REL`
writes the message-passing graph and split a full-copy typed link run makes, with its input statistics; one part
in one process trains, evaluates and resumes as the full copy bit for bit; a full-copy run deals its seed edges by the
owners of their sources (`deal_by`); two gloo ranks give the step losses of that full-copy run bit for bit and
its metrics; what cannot match is refused with the reason."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import neutronorch
from neutronorch.cli import main
from neutronorch.data import synthetic_typed, write_typed
from neutronorch.data.links import row_statistics
from neutronorch.data.partition_files import load_partition, read_manifest
from neutronorch.data.partition_typed import assign_typed, write_typed_partition
from neutronorch.data.typed_parts import split_typed
from neutronorch.errors import ConfigError, Interrupted
from neutronorch.orchestration.factory import build_mode
from neutronorch.train.link_task import split_typed_relation, typed_link_graph
from test_partitioned_training import _env, _step_losses, spawned

SPLIT, RELATION, SEED = "edges:0.8,0.1", "writes", 5
HOT = dict(mode="neutronorch", hot_ratio=0.5, snapshot_lead=1, super_batch=2, host_threads=1)
SETTINGS = dict(task="link", link_relation=RELATION, model="rgcn", hidden=16, fanouts=[4, 3], batch_size=96,
                threads=1, sampler_threads=1, device="cpu", eval_negatives=20, dropout=0.2, seed=SEED, log_every=1,
                eval_batch_size=100)


def typed_graph():
    return synthetic_typed(1500, features=8, seed=3)


def _partition(folder: Path, parts: int, method: str = "random") -> Path:
    whole = split_typed_relation(typed_graph(), RELATION, SPLIT, SEED)
    write_typed_partition(whole, assign_typed(whole, parts, method, SEED), parts, folder, method, SEED, "synthetic")
    return folder


def test_the_command_line_writes_the_graph_and_split_a_typed_link_run_makes(tmp_path, capsys):
    source, out = tmp_path / "typed", tmp_path / "parts"
    write_typed(typed_graph(), source)
    assert main(["partition", str(source), "--parts", "2", "--out", str(out), "--method", "metis", "--seed",
                 str(SEED), "--split", SPLIT, "--link-relation", RELATION]) == 0
    run_graph = typed_link_graph(typed_graph(), neutronorch.TrainConfig(**{**SETTINGS, "split": SPLIT}).validate())
    parts = [load_partition(out, k) for k in range(2)]
    expected = split_typed(run_graph, parts[0].part_of, 2)
    for got, want in zip(parts, expected):
        for name in ("train", "val", "test"):
            np.testing.assert_array_equal(getattr(got.links, name), getattr(run_graph.links, name))
        assert got.links.ends == run_graph.links.ends and got.links.undirected == run_graph.links.undirected
        assert list(got.relations) == list(run_graph.relations)  # the held-out edges out, the reverses remade
        for r, relation in want.relations.items():
            np.testing.assert_array_equal(got.relations[r].indptr, relation.indptr)
            np.testing.assert_array_equal(got.relations[r].indices, relation.indices)
    links = read_manifest(out)["links"]
    for t, rows in run_graph.features.items():  # the whole graph's rows' statistics, which no part holds
        norm, mean = row_statistics(rows)
        assert links["input_norm"][t] == norm and np.array_equal(np.float32(links["input_mean"][t]), mean)
    # METIS weighs a vertex by the training edges whose source it is: the ranks' positives come out even
    sources = np.asarray(run_graph.links.train[0]) - run_graph.links.ends.offsets["author"]
    counts = np.bincount(np.asarray(parts[0].part_of["author"])[sources], minlength=2)
    assert counts.max() / counts.mean() < 1.1, counts
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["checksums"]["state"] == "ok" and info["links"]["relation"] == ["author", "writes", "paper"]
    assert [p["train_links"] for p in info["per_part"]] == counts.tolist()
    assert info["balance_max_over_mean"]["train_links"] == round(counts.max() / counts.mean(), 4)
    plain = tmp_path / "plain"
    assert main(["partition", "synthetic:nodes=300", "--parts", "2", "--out", str(plain), "--link-relation",
                 RELATION]) == 2
    assert "names a typed graph's relation" in capsys.readouterr().err and not plain.exists()


def test_one_part_in_one_process_trains_as_the_full_copy_in_neutronorch_mode(tmp_path):
    folder = _partition(tmp_path / "p1", 1)
    settings = dict(SETTINGS, **HOT, epochs=1)
    whole = neutronorch.train(neutronorch.TrainConfig(split=SPLIT, log_jsonl=str(tmp_path / "a.jsonl"), **settings),
                              graph=typed_graph())
    parted = neutronorch.train(neutronorch.TrainConfig(partitions=str(folder), log_jsonl=str(tmp_path / "b.jsonl"),
                                                       **settings))
    losses = _step_losses(tmp_path / "a.jsonl")
    assert len(losses) > 4 and _step_losses(tmp_path / "b.jsonl") == losses  # bit for bit
    _same_metrics(parted, whole)
    assert parted["hot"]["reuse_rate"] > 0.3 and "tables" in parted["exchange"]["training"]["lanes"]


def test_one_part_in_one_process_trains_scores_and_resumes_as_the_full_copy(tmp_path):
    folder = _partition(tmp_path / "p1", 1)
    settings = dict(SETTINGS, epochs=2)
    whole = neutronorch.train(neutronorch.TrainConfig(split=SPLIT, log_jsonl=str(tmp_path / "a.jsonl"), **settings),
                              graph=typed_graph())
    parted = lambda resume=False, **given: neutronorch.train(neutronorch.TrainConfig(  # noqa: E731
        partitions=str(folder), log_jsonl=str(tmp_path / "b.jsonl"), checkpoint_dir=str(tmp_path / "ck"),
        resume=resume, **settings), **given)
    stop = threading.Event()
    with pytest.raises(Interrupted):  # stopped in epoch 1 after its step 3, then resumed
        parted(progress=lambda epoch, done, total: epoch == 1 and done == 3 and stop.set(), stop=stop)
    resumed = parted(resume=True)
    losses = _step_losses(tmp_path / "a.jsonl")
    assert len(losses) > 4 and _step_losses(tmp_path / "b.jsonl") == losses  # bit for bit
    assert resumed["epochs"][-1]["resumed_at_step"] == 3
    _same_metrics({"epochs": resumed["epochs"][-1:]}, {"epochs": whole["epochs"][-1:]})
    assert resumed["model"]["parameters"] == whole["model"]["parameters"]


def _same_metrics(got: dict, expected: dict) -> None:
    """Every metric of every evaluation (MRR, Hits@K, ROC-AUC of both sets) within 1e-6."""
    for a, b in zip(got["epochs"], expected["epochs"], strict=True):
        keys = [k for k in b if k.startswith(("val_", "test_")) and isinstance(b[k], float)]
        assert len(keys) >= 8 and [k for k in a if k in keys] == keys
        for key in keys:
            assert a[key] == pytest.approx(b[key], abs=1e-6), key


def test_a_full_copy_run_deals_each_positive_to_the_owner_of_its_source(tmp_path):
    folder = _partition(tmp_path / "p2", 2)
    config = neutronorch.TrainConfig(**{**SETTINGS, "split": SPLIT, "deal_by": str(folder)}).validate()
    graph = typed_link_graph(typed_graph(), config)
    owners = np.asarray(load_partition(folder, 0).part_of["author"])
    cpu, first = torch.device("cpu"), graph.links.ends.offsets["author"]
    by_rank = [build_mode(config, graph, cpu, shard=(r, 2)).seeds for r in range(2)]
    dealt = []
    for rank, seeds in enumerate(by_rank):
        for batch in seeds.epoch(0):
            sources = batch.seeds[batch.targets[:, 0]].numpy() - first
            assert (owners[sources] == rank).all()
            dealt.append(sources.shape[0])
    assert sum(dealt) == graph.links.train.shape[1]  # every positive, once
    assert np.allclose(by_rank[0].rank_shares(0) + by_rank[1].rank_shares(0), 2.0)


def test_what_a_typed_link_folder_cannot_honour_is_refused_with_the_reason(tmp_path):
    folder = _partition(tmp_path / "p1", 1)
    run = lambda **given: neutronorch.train(neutronorch.TrainConfig(  # noqa: E731
        partitions=str(given.pop("folder", folder)), **{**SETTINGS, "epochs": 1, **given}))
    node_settings = {k: v for k, v in SETTINGS.items() if k not in ("task", "link_relation", "eval_negatives")}
    with pytest.raises(ConfigError, match="`link_relation` cites: .* holds a link split of author/writes/paper"):
        run(link_relation="cites")
    with pytest.raises(ConfigError, match="`task` node: .* is a partition of a link split"):
        neutronorch.train(neutronorch.TrainConfig(partitions=str(folder), epochs=1, **node_settings))
    node_folder = tmp_path / "node"
    whole = typed_graph().with_reverse()
    write_typed_partition(whole, assign_typed(whole, 1, "random", 0), 1, node_folder, "random", 0, "synthetic")
    with pytest.raises(ConfigError, match="holds no link split; partition the graph with `--split edges:TRAIN,VAL "
                                          "--link-relation REL`"):
        run(folder=node_folder)
    with pytest.raises(ConfigError, match="for a node task, no link split; deal a typed link task"):
        neutronorch.train(neutronorch.TrainConfig(**{**SETTINGS, "split": SPLIT, "deal_by": str(node_folder),
                                                     "epochs": 1}), graph=typed_graph())


def _ranks(rank: int, directory: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=rank,
                                         world_size=2)
    d = Path(directory)
    for name in ("full", "parts", "full-hot", "parts-hot"):
        where = ({"partitions": str(d / "parts")} if name.startswith("parts")
                 else {"deal_by": str(d / "parts"), "split": SPLIT})
        hot = name.endswith("hot")
        neutronorch.train(neutronorch.TrainConfig(**SETTINGS, **where, epochs=1 if hot else 2, eval_fanouts=[3, 3],
                                                  dist_timeout=60, log_jsonl=str(d / f"{name}.jsonl"),
                                                  summary_json=str(d / f"{name}.json"), **(HOT if hot else {})),
                          **({"graph": typed_graph()} if name.startswith("full") else {}))
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_on_typed_link_parts_reproduce_the_full_copy_run(tmp_path, monkeypatch):
    for name, value in _env().items():  # before the children start: numba reads its thread count at import
        monkeypatch.setenv(name, value)
    _partition(tmp_path / "parts", 2, "metis")
    spawned(_ranks, (str(tmp_path),), 240)
    full, parts = (_step_losses(tmp_path / f"{name}.jsonl") for name in ("full", "parts"))
    assert len(full) > 4 and parts == full  # bit for bit
    a, b = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("full", "parts"))
    _same_metrics(b, a)
    traffic = b["epochs"][0]["exchange"]
    assert len(traffic) == 2 and all(t["sent_bytes"] > 0 and t["received_bytes"] > 0 for t in traffic)
    # NeutronOrch mode: the owner sums its holders' dL/dY of a hot row (float-sum order), the tables split by owner.
    full, parts = (_step_losses(tmp_path / f"{name}.jsonl") for name in ("full-hot", "parts-hot"))
    assert len(full) == len(parts) > 4 and parts == pytest.approx(full, rel=1e-5)
    a, b = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("full-hot", "parts-hot"))
    assert b["test_mrr"] == pytest.approx(a["test_mrr"], abs=0.01) and b["hot_rows_exchanged"]["received"] > 0
