"""Synthetic typed graphs shaped like ogbn-mag, whose labels depend on typed paths (docs/heterogeneous.md, "A
synthetic typed graph"): a paper's label is the ordered pair of its fields' topic and its authors'
institutions' topic, and its features show both topics but not their order. ``edge_weights`` weights every
``cites`` edge with a generator of its own, so the graph is otherwise the one drawn without it."""

from __future__ import annotations

import numpy as np

from neutronorch.data.splits import make_split
from neutronorch.data.synthetic import Pool, class_centroids, noise_rows, rate_problems, too_large
from neutronorch.data.typed import Relation, TypedGraph
from neutronorch.errors import ConfigError
from neutronorch.limits import check_seed

# Each type's share of the vertices and each relation's share of the edges (the edges' near ogbn-mag's).
TYPE_SHARES = {"paper": 0.40, "author": 0.50, "institution": 0.02, "field": 0.08}
EDGE_SHARES = {"writes": 0.36, "cites": 0.26, "affiliated_with": 0.06, "has_topic": 0.32}


def _pool(rng: np.random.Generator, classes: np.ndarray, num_classes: int, power: float) -> Pool:
    """The vertices of one type, each with its class and a Zipf weight (drawn after the classes)."""
    return Pool((rng.permutation(classes.shape[0]) + 1.0) ** -power, classes, num_classes)


def synthetic_typed(nodes: int = 20_000, degree: float = 10.0, features: int = 64, field_features: int = 0,
                    topics: int = 4, power: float = 0.6, homophily: float = 0.8, noise: float = 0.5,
                    train: float = 0.1, val: float = 0.05, seed: int = 0, edge_weights: bool = False) -> TypedGraph:
    """A MAG-like typed graph of about ``nodes`` vertices and ``degree * nodes`` edges with ``topics ** 2``
    classes; the same arguments give the same graph. ``noise``: the feature noise's standard deviation
    (unit-norm centroids); ``homophily``: the chance an edge's far end is of the class the label asks for."""
    rates = rate_problems("synthetic typed graph", degree, power, homophily, noise, train, val)
    problems = []
    if nodes < 100 or degree <= 0:
        problems.append("nodes must be at least 100 and degree > 0")
    elif degree > nodes - 1:
        problems.append(f"degree must be at most nodes - 1 ({nodes - 1}), the most neighbours a vertex has")
    if features < 1 or field_features < 0:
        problems.append("features must be >= 1 and field_features >= 0")
    if topics < 2:
        problems.append("topics must be >= 2")
    problems += rates
    if problems:
        raise ConfigError("synthetic typed graph: " + "; ".join(problems) + ".")
    check_seed(seed)
    try:
        return _draw_typed(nodes, degree, features, field_features, topics, power, homophily, noise, train, val,
                           seed, edge_weights)
    except MemoryError:  # numpy's refusal to allocate, named with what asked for it
        raise ConfigError(too_large("synthetic typed graph", nodes, features, round(nodes * degree))) from None


def _draw_typed(nodes, degree, features, field_features, topics, power, homophily, noise, train, val, seed,
                edge_weights) -> TypedGraph:
    rng = np.random.default_rng(seed)
    num_classes = topics * topics
    counts = {t: max(round(share * nodes), 2 * num_classes) for t, share in TYPE_SHARES.items()}
    labels = _balanced(rng, counts["paper"], num_classes)
    field_topic, institution_topic = labels // topics, labels % topics
    author_topic = _balanced(rng, counts["author"], topics)
    field_topics = _balanced(rng, counts["field"], topics)
    pools = {"paper": _pool(rng, labels, num_classes, power),  # every class has a member (``_balanced``)
             "author": _pool(rng, author_topic, topics, power),
             "institution": _pool(rng, _balanced(rng, counts["institution"], topics), topics, power),
             "field": _pool(rng, field_topics, topics, power)}
    # Each relation: (source, name, destination), the type whose vertices draw its edges, the type drawn
    # and the class asked of it per drawing vertex. Papers draw authors, cited papers and fields; authors
    # draw institutions.
    plan = ((("author", "writes", "paper"), "paper", "author", institution_topic, 1),
            (("paper", "cites", "paper"), "paper", "paper", labels, 0),
            (("author", "affiliated_with", "institution"), "author", "institution", author_topic, 1),
            (("paper", "has_topic", "field"), "paper", "field", field_topic, 1))
    relations = {}
    for key, drawer, drawn_type, wanted, minimum in plan:
        mean = EDGE_SHARES[key[1]] * degree * nodes / counts[drawer]
        out = minimum + rng.poisson(rng.gamma(1.0, max(mean - minimum, 1e-9), counts[drawer]))
        drawing = np.repeat(np.arange(counts[drawer], dtype=np.int64), out)
        drawn = pools[drawn_type].draw(rng, wanted[drawing], homophily)
        src, dst = (drawing, drawn) if drawer == key[0] else (drawn, drawing)
        if key[0] == key[2]:  # no paper cites itself
            keep = src != dst
            src, dst = src[keep], dst[keep]
        relations[key] = Relation.from_edges(src, dst, counts[key[0]], counts[key[2]], deduplicate=True,
                                             source=f"synthetic {key[1]}")
        del drawing, drawn, src, dst
    if edge_weights:
        relations[("paper", "cites", "paper")] = _weighted(relations[("paper", "cites", "paper")], labels, seed)

    topic_centroids = class_centroids(rng, topics, features)
    paper = noise_rows(rng, counts["paper"], features, noise)
    paper += (topic_centroids[field_topic] + topic_centroids[institution_topic]) / np.float32(np.sqrt(2))
    node_features = {"paper": paper}
    if field_features:
        node_features["field"] = noise_rows(rng, counts["field"], field_features, noise)
        node_features["field"] += class_centroids(rng, topics, field_features)[field_topics]
    train_idx, val_idx, test_idx = make_split(labels, num_classes, f"ratio:{train},{val}", seed)
    name = (f"synthetic-typed-n{nodes}-d{degree:g}-f{features}-ff{field_features}-t{topics}-p{power:g}"
            f"-h{homophily:g}-x{noise:g}-s{seed}" + ("-w" if edge_weights else ""))
    return TypedGraph(name=name, num_nodes=counts, relations=relations, features=node_features, target="paper",
                      labels=labels, train_idx=train_idx, val_idx=val_idx, test_idx=test_idx,
                      num_classes=num_classes,
                      notes=["synthetic typed graph: a paper's label is the ordered pair (its fields' topic, its "
                             "authors' institutions' topic); its features show both topics but not their order"])


def _weighted(cites: Relation, labels: np.ndarray, seed: int) -> Relation:
    """``cites`` with a weight per edge (one edge feature column): 0.75 to 1.25 between papers of one label,
    0.15 to 0.25 between others, drawn by a generator of its own (keyed by ``seed``)."""
    src, dst = cites.edges()
    rng = np.random.default_rng([seed, 1])
    weights = np.where(labels[src] == labels[dst], np.float32(1.0), np.float32(0.2))
    weights *= rng.uniform(0.75, 1.25, src.shape[0]).astype(np.float32)
    return Relation(cites.indptr, cites.indices, weights.reshape(-1, 1))


def _balanced(rng: np.random.Generator, count: int, num_classes: int) -> np.ndarray:
    """``count`` classes in random order, each class as often as the others (so none is empty)."""
    return rng.permutation(np.arange(count, dtype=np.int64) % num_classes)
