"""A link task: its loss over a mini-batch's pairs, and its exact evaluation (docs/link-prediction.md).

Training (``LinkTask.loss``): the step's outputs are the embeddings of the batch's seeds, its targets
(``orchestration/link_seeds.py``) the positions of each positive's ends and its negatives' destinations among
them. Evaluation (``evaluate_links``) holds the named vertices' rows and the positives, never the negatives:
they are read or drawn ``SCORE_CHUNK`` pairs at a time (drawn ones from one generator's stream: the same
numbers as one whole draw) and reduced (``PerPositiveScores``) before the next chunk."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from neutronorch.config import TrainConfig
from neutronorch.config_parts import LinkConfig, settings_of
from neutronorch.data.graph import Graph
from neutronorch.data.link_checks import check_graph_links
from neutronorch.data.edge_split import link_relation, parse_link_split, split_edges, split_relation
from neutronorch.data.time_split import split_edges_by_time, split_relation_by_time
from neutronorch.data.links import PER_SOURCE, SHARED, LinkEnds, check_link_split, check_negatives_fit
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import ConfigError
from neutronorch.nn.link import LinkModel
from neutronorch.nn.rows import take_rows
from neutronorch.orchestration.link_seeds import EndsSampler, negative_generator
from neutronorch.sampling.neighbor_sampler import mix_key
from neutronorch.train.distributed import World
from neutronorch.train.evaluate import typed_logits
from neutronorch.train.health import SPLIT_NAMES, EvaluationCheck, link_collapse, nonfinite_rows
from neutronorch.train.layerwise import LayerProgress, last_layer_rows
from neutronorch.train.link_metrics import PerPositiveScores, SharedScores, parse_link_metric
from neutronorch.train.prediction_io import scratch_folder

SCORE_CHUNK = 1 << 16  # pairs scored at a time
REPORTED_HITS = (10, 50, 100)
DEFAULT_LINK_SPLIT = "edges:0.85,0.05"  # a graph without links of its own: 85% training, 5% validation edges


def is_link_split(split: str | None) -> bool:
    return isinstance(split, str) and split.strip().lower().startswith("edges:")


def link_graph(graph: Graph, config: TrainConfig) -> Graph:
    """``graph`` when it carries its own links (an OGB link dataset), else ``graph`` split by ``config.split``
    (default ``DEFAULT_LINK_SPLIT``) seeded by ``config.seed``, its validation and test edges out of its
    topology; the split checked, and the run's settings against it (``check_link_settings``)."""
    if graph.links is None and graph.edge_time is not None:  # a temporal link task: the future is held out
        graph = split_edges_by_time(graph, *_edge_split(config), direction=config.link_direction)
    elif graph.links is None:
        graph = split_edges(graph, *_edge_split(config), seed=config.seed, direction=config.link_direction)
    elif graph.temporal and not graph.links.timed:
        raise ConfigError(f"{graph.name}: has times but its link split has none, so its links would be sampled "
                          f"without them; give the split its links' times (train_time, val_time, test_time) or "
                          f"split a copy without times to use it as a static graph knowingly (docs/temporal.md).")
    elif config.split:
        raise ConfigError(f"`split` {config.split!r}: {graph.name} carries its own link split; leave `split` out.")
    elif config.link_direction != "auto":
        raise ConfigError(f"`link_direction` {config.link_direction}: {graph.name} carries its own link split, "
                          f"{'undirected' if graph.links.undirected else 'directed'}; the option chooses how "
                          f"`split` edges:TRAIN,VAL splits a graph without one. Leave it out.")
    # Stored negatives that are positives of their own set: noted by the loader (OGB's evaluators keep them).
    check_link_split(graph.links, graph.num_nodes, graph.name)
    notes = check_graph_links(graph)  # a split given with the graph, or changed since it was checked
    graph = dataclasses.replace(graph, notes=[*graph.notes, *notes]) if notes else graph
    check_link_settings(graph, config)
    return graph


def _edge_split(config: TrainConfig) -> tuple[float, float]:
    return _edge_shares(config.split)


def _edge_shares(split: str | None) -> tuple[float, float]:
    spec = split or DEFAULT_LINK_SPLIT
    if not is_link_split(spec):
        raise ConfigError(f"`split` {spec!r} splits vertices; a link task splits edges: give `split` "
                          f"edges:TRAIN,VAL (such as {DEFAULT_LINK_SPLIT}), or none for that default.")
    return parse_link_split(spec)


def typed_link_graph(graph: TypedGraph, config: TrainConfig) -> TypedGraph:
    """``graph`` with its relation ``config.link_relation`` split (``split_typed_relation``), the run's
    settings checked."""
    graph = split_typed_relation(graph, config.link_relation, config.split, config.seed, config.link_direction)
    check_link_settings(graph, config)
    return graph


def split_typed_relation(graph: TypedGraph, name: str | None, split: str | None, seed: int,
                         direction: str = "auto") -> TypedGraph:
    """``graph`` with its relation ``name`` (``link_relation``) split by ``split`` (edges:TRAIN,VAL; None:
    ``DEFAULT_LINK_SPLIT``) as ``link_graph`` splits a homogeneous graph's edges (by time on a graph with
    times), the split in ``links``, then every relation's reverse added (a stored reverse of the relation is
    made again from the edges left, so no held-out edge carries a message; by time every edge stays). A
    typed graph's partition (``neutronorch partition --split``) is made of this graph too."""
    relation = link_relation(graph, name)
    reverse = graph.reverse_of(relation)
    shares = _edge_shares(split)
    if graph.temporal:  # split by time; every edge stays, sampled only before each seed's time
        links, notes = split_relation_by_time(graph, LinkEnds.of(graph.num_nodes, relation), *shares,
                                              direction=direction)
        graph = dataclasses.replace(graph, notes=[*graph.notes, *notes]).with_reverse()
    else:
        graph, links = split_relation(graph, LinkEnds.of(graph.num_nodes, relation), *shares, seed=seed,
                                      direction=direction)
        relations = {r: rel for r, rel in graph.relations.items() if r != reverse}
        graph = dataclasses.replace(graph, relations=relations).with_reverse()
    links.ends = LinkEnds.of(graph.num_nodes, relation, graph.reverse_of(relation))
    return dataclasses.replace(graph, links=links)


def check_node_task(graph: Graph, config: TrainConfig) -> None:
    """Refuse what only a link task uses: a link split (the graph's or ``config.split``) and link settings
    given (ignoring them would hide a mistaken task)."""
    if graph.links is not None or is_link_split(config.split):
        raise ConfigError(f"{graph.name if graph.links is not None else config.split}: a link split, for link "
                          f"prediction; give `task` link (or a node split such as ratio:0.6,0.2 for a node task).")
    given = config.settings_given(f.name for f in settings_of(LinkConfig))
    if given:
        which, them = ("a link task's setting", "it") if len(given) == 1 else ("a link task's settings", "them")
        raise ConfigError(f"{', '.join(given)}: {which} (how it scores pairs, draws negatives and splits edges), "
                          f"and `task` is {config.task}; give `task` link, or leave {them} out.")


def check_link_settings(graph: Graph, config: TrainConfig) -> None:
    """Refuse the settings a link run cannot honour on ``graph`` (docs/link-prediction.md, "Evaluation")."""
    links = graph.links
    typed = isinstance(graph, TypedGraph)
    ignored = ([f"`eval_fanouts` {','.join(map(str, config.eval_fanouts))}"]
               if config.eval_fanouts is not None and not typed and not links.timed else []) + (
        [f"`eval_max_nodes` {config.eval_max_nodes}"] if config.eval_max_nodes else [])
    if ignored:
        raise ConfigError(f"{', '.join(ignored)}: a link task evaluates every vertex its validation and test pairs "
                          f"name{'' if typed else ', over complete neighbourhoods'}, so "
                          f"{'it' if len(ignored) == 1 else 'they'} would be ignored; leave "
                          f"{'it' if len(ignored) == 1 else 'them'} out.")
    stored = links.negative_kind in (SHARED, PER_SOURCE)
    destinations = links.ends.destinations[1] if typed else graph.num_nodes
    check_negatives_fit("negatives", config.negatives, destinations)
    if not stored:
        check_negatives_fit("eval_negatives", config.eval_negatives, destinations)
    elif config.eval_negatives != LinkConfig.eval_negatives:  # stored ones are scored: it would be ignored
        raise ConfigError(f"`eval_negatives` {config.eval_negatives}: {graph.name} stores its own evaluation "
                          f"negatives ({links.negative_kind}), which are scored instead; leave `eval_negatives` out.")
    metric = (links.metric or "mrr") if config.metric == "auto" else config.metric
    name, k = parse_link_metric(metric)
    counts = ({part: int(getattr(links, f"{part}_neg").shape[1]) for part in ("val", "test")} if stored
              else {"val": config.eval_negatives, "test": config.eval_negatives})
    fewest = min(counts.values())
    if name == "hits" and fewest < k:
        source = (f"{graph.name}'s stored negatives number {counts['val']:,} (validation) and {counts['test']:,} "
                  f"(test) per positive" if stored else f"`eval_negatives` draws {fewest:,} per positive")
        raise ConfigError(f"`metric` {metric}: {source}, fewer than K = {k}, so every positive would be a hit; "
                          f"choose hits@K with K at most {fewest:,}, mrr or rocauc"
                          + ("." if stored else f", or `eval_negatives` {k} or more."))


@dataclass(frozen=True)
class LinkTask:
    model: LinkModel
    metric: str  # mrr, rocauc or hits@K (resolved: never auto)

    @classmethod
    def of(cls, graph: Graph, model: LinkModel, metric: str = "auto") -> "LinkTask":
        if metric == "auto":
            metric = graph.links.metric or "mrr"
        return cls(model, metric)

    @property
    def key(self) -> str:
        """The metric's name in summary keys (``val_mrr``, ``test_hits_50``)."""
        return self.metric.replace("@", "_")

    def describe(self) -> str:
        return f"link prediction, metric {self.metric}"

    def loss(self, embeddings: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Binary cross-entropy: the mean over the batch's positives (label 1) plus that over its
        negatives."""
        if targets.shape[0] == 0:
            return embeddings.sum() * 0.0
        # Each seed's row is picked many times: take_rows sums their gradients in a fixed order (nn/rows.py).
        rows = take_rows(embeddings, targets)  # (positives, 2 + negatives, width)
        source = rows[:, 0]
        positive = self.model.score(source, rows[:, 1])
        negative = self.model.score(source.unsqueeze(1).expand(-1, targets.shape[1] - 2, -1), rows[:, 2:])
        return (F.binary_cross_entropy_with_logits(positive, torch.ones_like(positive))
                + F.binary_cross_entropy_with_logits(negative, torch.zeros_like(negative)))

    def constant_losses(self, labels=None) -> dict[str, float]:
        """What ``loss`` is at best when every pair gets one score: 2 ln 2 (at score 0; each of its two means
        is at least ln 2 for a constant score), whatever the number of negatives."""
        return {"2 ln 2: one score for every pair": float(2 * np.log(2))}

    def loss_weight(self, targets: torch.Tensor) -> torch.Tensor:
        """The positives a rank's loss averages (its weight in the data-parallel gradient mean)."""
        return torch.full((), float(targets.shape[0]), device=targets.device)  # a fill there, not a copy to it


@torch.no_grad()
def evaluate_links(model: LinkModel, graph: Graph | TypedGraph, inputs, device: torch.device, batch_size: int,
                   seed: int, eval_negatives: int, task: LinkTask, world: World | None = None,
                   progress: LayerProgress | None = None, check: EvaluationCheck | None = None,
                   embedded=None) -> dict[str, float]:
    """``task``'s metric on the validation and test links, as {"val": ..., "test": ...}, and every reported
    metric under ``val_<name>``/``test_<name>`` (mrr, hits_K, rocauc). ``inputs``: a graph's ``FeatureStore``,
    or a typed graph's sampler (the evaluation fanouts), whose named vertices are embedded by ``typed_logits``
    of the encoder in their end types. ``check`` (``health.py``): scores that are not finite are an error,
    every score (or most pairs) tied is noted as a collapse. ``embedded(nodes)``: a context holding the
    encoder's rows of ``nodes`` (default: the whole graph's full-neighbour inference; a partitioned run's
    across its parts, ``part_links.py``)."""
    links, check = graph.links, check or EvaluationCheck()
    if isinstance(graph, TypedGraph):
        sampler = EndsSampler(inputs, links.ends)
        destinations, num_nodes = links.ends.destinations, links.ends.num_nodes
        embedded = lambda nodes: contextlib.nullcontext(  # noqa: E731
            typed_logits(model.encoder, graph, sampler, nodes, device, batch_size, seed))
    elif embedded is not None:
        destinations, num_nodes = (0, graph.num_nodes), graph.num_nodes
    else:
        scratch = scratch_folder(model.encoder, graph, model.num_layers, "auto", None)
        destinations, num_nodes = (0, graph.num_nodes), graph.num_nodes
        embedded = lambda nodes: last_layer_rows(model.encoder, graph, inputs, nodes, device,  # noqa: E731
                                                 batch_size, scratch=scratch, progress=progress, world=world)
    sets = eval_sets(links, seed, eval_negatives, destinations)
    nodes = named_vertices(sets, num_nodes)
    out: dict[str, float] = {}
    with embedded(nodes) as embeddings:
        model.eval()
        if nodes.shape[0] == num_nodes:  # every vertex named (many drawn negatives): ids are positions
            row = lambda ids: embeddings[ids].to(device)  # noqa: E731
        else:
            row = lambda ids: embeddings[torch.searchsorted(nodes, ids)].to(device)  # noqa: E731
        for name, pairs in sets.items():
            scores = _scores(model, row, pairs, lambda bad, total, what: check.nonfinite(
                bad, total, SPLIT_NAMES[name], "scores", what))
            out.update(set_metrics(name, scores, task.metric, check))
    return out


def eval_sets(links, seed: int, eval_negatives: int, destinations: tuple[int, int]) -> dict[str, "_EvalSet"]:
    """The validation and test sets of ``links``, each with its negatives (drawn from ``seed``'s keys)."""
    return {name: _EvalSet(links, name, mix_key(seed, 0x4556_414C + offset), eval_negatives, destinations)
            for offset, name in enumerate(("val", "test"))}


def named_vertices(sets: dict[str, "_EvalSet"], num_nodes: int) -> torch.Tensor:
    """The vertices the sets' pairs name, ascending (read a chunk at a time)."""
    named = torch.zeros(num_nodes, dtype=torch.bool)
    for pairs in sets.values():
        named[pairs.positives.reshape(-1)] = True
        for _, chunk in pairs.negatives(SCORE_CHUNK):
            named[chunk.reshape(-1)] = True
    return named.nonzero().reshape(-1)


def set_metrics(name: str, scores, metric: str, check: EvaluationCheck) -> dict[str, float]:
    """A set's reported metrics from its scores (``SharedScores`` or ``PerPositiveScores``), after the collapse
    check."""
    check.collapsed(link_collapse(scores))
    out = {name: scores.score(metric), f"{name}_mrr": scores.mrr()}
    for k in REPORTED_HITS:  # a positive among fewer negatives than K is always a hit: not reported
        if k < scores.negatives_per_positive:
            out[f"{name}_hits_{k}"] = scores.hits_at_k(k)
    out[f"{name}_rocauc"] = scores.roc_auc()
    return out


class _EvalSet:
    """A validation or test set: its (2, P) positives and its negatives, read or drawn a chunk at a time
    (``negatives``): the pairs the data stores (``SHARED`` (2, N), ``PER_SOURCE`` (P, K)), else
    ``per_positive`` destinations per positive drawn from ``key`` (``draw_negatives``) among ``destinations``
    (first id, count)."""

    def __init__(self, links, name: str, key: int, per_positive: int, destinations: tuple[int, int]):
        self.kind = links.negative_kind if links.negative_kind in (SHARED, PER_SOURCE) else None
        self.positives, self.stored = _ids(getattr(links, name)).reshape(2, -1), getattr(links, f"{name}_neg")
        self.per_positive = int(self.stored.shape[1]) if self.kind == PER_SOURCE else per_positive
        self.key, self.destinations = key, destinations

    def negatives(self, rows: int) -> Iterator[tuple[int, torch.Tensor]]:
        """(start, chunk) in order: shared negative pairs as (rows, 2) from pair ``start``, else the (rows, K)
        negative destinations of positives ``start`` on."""
        if self.kind is not None:
            stored = self.stored.T if self.kind == SHARED else self.stored
            for start in range(0, stored.shape[0], rows):
                yield start, _ids(stored[start:start + rows])
        else:
            positives = self.positives.shape[1]
            yield from drawn_negatives(self.key, positives, self.per_positive, self.destinations, rows)


def drawn_negatives(key: int, count: int, per_positive: int, destinations: tuple[int, int],
                    rows: int) -> Iterator[tuple[int, torch.Tensor]]:
    """``draw_negatives(key, count, per_positive, num_nodes, first)`` (``destinations``: (first, num_nodes))
    ``rows`` positives at a time, as (start, chunk): the same numbers whatever ``rows`` (one generator's
    stream, in row order)."""
    generator, (first, num_nodes) = negative_generator(key), destinations
    for start in range(0, count, rows):
        shape = (min(rows, count - start), per_positive)
        yield start, torch.randint(first, first + num_nodes, shape, generator=generator, dtype=torch.int64)


def _ids(array) -> torch.Tensor:
    """Vertex ids (a tensor, or stored pairs such as a slice of a memory map) as an int64 tensor."""
    if isinstance(array, torch.Tensor):
        return array.to(torch.int64)
    return torch.from_numpy(np.array(array, dtype=np.int64))


def _scores(model: LinkModel, row, pairs: _EvalSet, nonfinite) -> SharedScores | PerPositiveScores:
    """The set's scores, ``row(ids)`` giving the embeddings: positives, and shared negatives, held whole (P
    and N floats); per-positive negatives scored and reduced ``SCORE_CHUNK`` pairs at a time. ``nonfinite(bad,
    total, rows)`` is told how many rows of scores held NaN or infinities (one ``isfinite`` per chunk)."""
    positives = pairs.positives
    positive = pair_scores(model, row, positives)
    nonfinite(nonfinite_rows(positive), positive.shape[0], "positive pairs")
    if pairs.kind == SHARED:
        negative = pair_scores(model, row, pairs.stored)
        nonfinite(nonfinite_rows(negative), negative.shape[0], "negative pairs")
        return SharedScores(positive, negative)
    scores, bad = PerPositiveScores(positive), 0
    for start, destinations in pairs.negatives(max(1, SCORE_CHUNK // max(1, pairs.per_positive))):
        sources = row(positives[0, start:start + destinations.shape[0]]).unsqueeze(1)
        negative = model.score(sources, row(destinations)).float().cpu()
        bad += nonfinite_rows(negative)
        scores.add(start, negative)
    nonfinite(bad, positive.shape[0], "positives' negative pairs")
    return scores


def pair_scores(model: LinkModel, row, pairs) -> torch.Tensor:
    """The (P,) float32 scores of (2, P) pairs, ``SCORE_CHUNK`` at a time."""
    count = pairs.shape[1]
    out = torch.empty(count)
    for start in range(0, count, SCORE_CHUNK):
        chunk = _ids(pairs[:, start:start + SCORE_CHUNK])
        out[start:start + chunk.shape[1]] = model.score(row(chunk[0]), row(chunk[1])).float().cpu()
    return out
