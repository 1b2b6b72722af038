"""What a resumed run may not change, either kind's (``check_resumable``): its settings, ranks and data
(comparing the fingerprints of the graph the checkpoint was written for and of the one given now:
``dataset_fingerprint``, a typed graph's per type and relation). ``Run.resume`` restores the rest.
"""

from __future__ import annotations

import zlib

import numpy as np

from neutronorch.config import TrainConfig
from neutronorch.data.graph import Graph
from neutronorch.data.typed import TypedGraph, relation_label
from neutronorch.errors import CheckpointError


def sample_crc(array) -> int:
    """The CRC-32 of a strided sample of ``array``'s rows, about 4,096 of them: a strided view reads only
    its rows, so a memory-mapped array larger than memory is never read whole."""
    step = max(1, array.shape[0] // 4096)
    return zlib.crc32(np.ascontiguousarray(array[::step]).tobytes())


def dataset_fingerprint(graph) -> dict:
    """What identifies a graph cheaply: its sizes and checksums of strided samples of its arrays
    (``sample_crc``); a typed graph's per type and relation where there are several, and its target."""
    splits = {"labels_crc": sample_crc(graph.labels), "split_crc": sample_crc(graph.train_idx),
              "val_crc": sample_crc(graph.val_idx), "test_crc": sample_crc(graph.test_idx)}
    if not isinstance(graph, TypedGraph):
        return {"name": graph.name, "nodes": graph.num_nodes, "edges": graph.num_edges,
                "feature_dim": graph.feature_dim, "classes": graph.num_classes,
                "topology_crc": sample_crc(graph.indices), "features_crc": sample_crc(graph.features), **splits}
    relations = {relation_label(r): relation for r, relation in graph.relations.items()}
    return {"name": graph.name, "num_nodes": {t: int(n) for t, n in graph.num_nodes.items()},
            "edges": {label: int(relation.num_edges) for label, relation in relations.items()},
            "feature_dims": {t: graph.feature_dim(t) for t in graph.num_nodes}, "target": graph.target,
            "classes": int(graph.num_classes),
            "topology_crc": {label: sample_crc(relation.indices) for label, relation in relations.items()},
            "features_crc": {t: sample_crc(rows) for t, rows in graph.features.items()},
            "edge_features_crc": {label: sample_crc(relation.edge_features) for label, relation in relations.items()
                                  if relation.edge_features is not None}, **splits}


# What each fingerprint key stands for, in the message that says what changed (a typed graph's per type and
# relation: a dict).
FINGERPRINT_NAMES = {"name": "the name", "nodes": "the vertex count", "edges": "the edge count",
                     "feature_dim": "the feature width", "classes": "the class count",
                     "topology_crc": "the topology", "split_crc": "the training split", "features_crc": "the features",
                     "labels_crc": "the labels", "val_crc": "the validation split", "test_crc": "the test split",
                     "num_nodes": "the vertex counts", "feature_dims": "the feature widths",
                     "target": "the target type", "edge_features_crc": "the edge features"}


def fingerprint_changes(saved: dict, now: dict) -> list[str]:
    """What differs between two fingerprints, naming a typed graph's types and relations: ``the vertex counts
    (author 1500 then, 1499 now)``, ``the features of paper``. A key an older checkpoint lacks (its
    neutronorch did not fingerprint that array yet) is no difference, so older checkpoints keep resuming."""
    changes = []
    for key, value in now.items():
        before = saved.get(key, value)
        if before == value:
            continue
        name = FINGERPRINT_NAMES.get(key, key)
        if not (isinstance(value, dict) and isinstance(before, dict)):
            changes.append(name)
            continue
        parts = [part for part in {**before, **value} if before.get(part) != value.get(part)]
        if key.endswith("_crc"):
            changes.append(f"{name} of {', '.join(parts)}")
        else:
            changes.append(f"{name} ({'; '.join(f'{p} {before.get(p)} then, {value.get(p)} now' for p in parts)})")
    return changes


# Settings a resumed run may change (each declared so where it is defined, ``config.may_change``); any other
# difference changes the model or the training and is refused.
RESUME_MAY_CHANGE = TrainConfig.resume_may_change()


def check_resumable(state: dict, config: TrainConfig, graph: Graph | TypedGraph, source: str, world_size: int = 1,
                    fingerprint: dict | None = None) -> None:
    """A run may continue from ``state`` only on the same data (``fingerprint``: the graph's, when known) with
    the same model and training settings. The settings are compared first: one that shapes the data a run
    trains on (`task` link removes the validation and test edges, `split`) is named, not reported as changed
    data."""
    # A setting added after the checkpoint was written had its default then.
    saved, now, defaults = state["config"], config.to_dict(), TrainConfig().to_dict()
    differ = [f"`{k}` {saved.get(k, defaults[k])!r} then, {now[k]!r} now" for k in sorted(now)
              if k not in RESUME_MAY_CHANGE and saved.get(k, defaults[k]) != now[k]]
    if differ:
        raise CheckpointError(f"{source}: the run it continues had other settings: {'; '.join(differ)}. Resume "
                              f"with the same settings (only outputs, epochs, evaluation, threads, device and precision may "
                              f"change), or start a new run in another `checkpoint_dir`.")
    if state.get("rng") is None:
        raise CheckpointError(f"{source}: holds no random state to resume from.")
    if int(state.get("world_size", 1)) != world_size:
        raise CheckpointError(f"{source}: written by a run of {state.get('world_size', 1)} data-parallel rank(s); "
                              f"resume with the same number (now {world_size}): torchrun --nproc-per-node and "
                              f"--nnodes as before.")
    found = fingerprint or dataset_fingerprint(graph)
    changed = fingerprint_changes(state["dataset"], found)
    if changed:
        what = "typed graph" if isinstance(graph, TypedGraph) else "dataset"
        raise CheckpointError(f"{source}: written for another {what}, or the data changed since: {', '.join(changed)} "
                              f"differ ({state['dataset']['name']} then, {found['name']} now). Resume on the data the "
                              f"run started with, or start a new run in another `checkpoint_dir`.")
