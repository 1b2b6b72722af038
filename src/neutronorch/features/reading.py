"""How a run reads its memory-mapped feature rows: in file order or in batch order (``read_orders``), through a
host cache of which size (``host_cache_size``, ``auto_size``), decided once when the run starts, for a
homogeneous graph's features and for each featured type of a typed graph (``typed_stores``) alike.

The rows themselves are read by ``store.FeatureStore`` (one per feature array) and cached by
``host_cache.HostCache``; this module decides, builds and logs, and never reads a row."""

from __future__ import annotations

import functools
import logging
import os
from typing import Callable

import numpy as np

from neutronorch.config import TrainConfig
from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.features.cache import hotness_order
from neutronorch.features.host_cache import GiB, HostCache
from neutronorch.features.memory import AutoSize
from neutronorch.features.placement import typed_workspace
from neutronorch.features.store import FeatureStore, beyond_memory

logger = logging.getLogger("neutronorch")


def read_orders(setting: str, features: list[np.ndarray], topology: list[np.ndarray], workspace: int
                ) -> tuple[bool, bool]:
    """Whether the feature arrays and the topology arrays are read in file order (``TrainConfig.read_order``):
    with ``auto``, the memory-mapped ones, when together they are larger than half the memory left beside the
    run's estimated working memory (``workspace`` bytes)."""
    if setting != "auto":
        return setting == "file", setting == "file"
    if not beyond_memory([*features, *topology], reserve=workspace):
        return False, False
    mapped = [any(isinstance(a, np.memmap) for a in arrays) for arrays in (features, topology)]
    logger.info(f"memory-mapped {' and '.join(n for n, m in zip(('features', 'topology'), mapped) if m)} larger than "
                f"half the memory left beside the run's working memory: read in file order (--read-order)")
    return mapped[0], mapped[1]


def host_cache_size(setting: str | float, features: np.ndarray, file_order: bool,
                    ranked: Callable[[], np.ndarray]) -> tuple[int, str, np.ndarray | None]:
    """Rows of the host feature cache of ``features`` (``setting``: ``TrainConfig.host_cache_gb`` in GiB; see
    ``host_cache.py``), why, and the vertices hottest first (``ranked()``) where they were ranked for it. Only
    memory-mapped features are cached (rows in memory need no second copy). ``auto``, where they do not fit
    (read in file order): 0 rows and the ranking, the cache then sizing itself from the memory the first
    mini-batches use (``auto_size``); estimates of the working memory missed by up to 0.6 GiB on the
    1M-vertex benchmark graph."""
    if setting == 0:
        return 0, "host_cache_gb 0", None
    if not isinstance(features, np.memmap):
        return 0, "features in memory", None
    if setting != "auto":
        rows = min(features.shape[0], int(float(setting) * GiB) // max(1, features.strides[0]))
        return rows, "host_cache_gb", None
    if not file_order:
        return 0, "memory-mapped features fit in memory", None
    return 0, "sized after the first mini-batches", ranked()


def auto_size(features: list[np.ndarray], topology: list[np.ndarray], distributed: bool = False,
              caches: int = 1) -> AutoSize:
    """How a cache sized by measurement keeps room for the page cache: the memory-mapped topology is read all
    through training; ``distributed``: each of the node's ranks (``LOCAL_WORLD_SIZE``) takes its share, and of
    that each of the run's ``caches`` (a typed graph's cached types) its own."""
    mapped = [a for a in topology if isinstance(a, np.memmap)]
    paths = [getattr(a, "filename", None) for a in mapped + list(features)]
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if distributed else 1
    return AutoSize(files=sum(a.nbytes for a in mapped), exclude=tuple(str(p) for p in paths if p),
                    ranks=max(1, ranks) * max(1, caches))


def typed_stores(config: TrainConfig, graph: TypedGraph, fanouts: dict[RelationType, list[int]],
                 distributed: bool = False, on_host: bool = True) -> dict[str, FeatureStore]:
    """One ``FeatureStore`` per featured type of the typed ``graph`` (two-way, as trained), read in file order
    and through a host cache as ``config`` (validated) says (docs/memory.md, "Typed graphs' features");
    ``fanouts``: the training fanouts per relation, whose batches rank the hot rows. ``on_host``: whether the
    mode reads its rows through host caches (device mode reads its device caches' misses in place)."""
    features = dict(graph.features)
    topology = [a for relation in graph.relations.values() for a in (relation.indptr, relation.indices)]
    in_file_order, _ = read_orders(config.read_order, list(features.values()), topology,
                                   typed_workspace(graph, fanouts, config.hidden, config.batch_size))
    stores = {t: FeatureStore(rows, ordered=in_file_order and (config.read_order == "file"
                                                                or isinstance(rows, np.memmap)))
              for t, rows in features.items()}
    setting = config.host_cache_gb
    mapped = {t: rows for t, rows in features.items() if isinstance(rows, np.memmap)}
    if setting == 0 or not mapped:
        return stores
    if not on_host:
        logger.info("no host feature cache: device mode reads the rows its device caches miss in place")
        return stores
    total = sum(rows.nbytes for rows in mapped.values())

    @functools.cache
    def ranking() -> dict[str, np.ndarray]:  # one presample of the training batches' draws ranks every type
        return hotness_order(graph, fanouts, config.batch_size, config.seed, config.cache_policy)

    for t, rows in mapped.items():
        share = setting if setting == "auto" else float(setting) * rows.nbytes / max(1, total)
        attach_host_cache(stores[t], share, lambda t=t: ranking()[t], config.host_cache_dir,
                          lambda: auto_size(list(features.values()), topology, distributed, len(mapped)), name=t)
    return stores


def attach_host_cache(store: FeatureStore, setting: str | float, ranked: Callable[[], np.ndarray],
                      directory: str | None, auto: Callable[[], AutoSize], skip: int = 0, name: str = "") -> None:
    """Give ``store`` the host cache ``setting`` asks for (``host_cache_size``; a typed graph's type ``name``: its
    share of ``host_cache_gb``), of the hottest rows (``ranked()``) below the ``skip`` a device cache holds: sized
    by measurement (``auto()``) or of a fixed size; and log what was decided."""
    count, why, order = host_cache_size(setting, store.features, store.ordered, ranked)
    of, left = f" of {name}" if name else "", store.features.shape[0] - skip
    if order is not None:
        if left > 0:
            store.host_cache = HostCache(store.features, order[skip:], directory, auto())
            logger.info(f"host feature cache{of}: sized once the first mini-batches have shown the memory they use "
                        f"(until then rows are read from the features in place)")
    elif min(count, left) > 0:
        store.host_cache = HostCache(store.features, ranked()[skip:skip + count], directory)
        logger.info(f"host feature cache{of} ({why}): {store.host_cache.describe()}")
    elif setting not in (0, "auto"):
        why = "the device cache holds every row" if count else why + (" holds no row" if why == "host_cache_gb" else "")
        logger.info(f"no host feature cache{of}: {why}")
