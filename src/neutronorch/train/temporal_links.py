"""A temporal link task in ``train()`` (docs/temporal.md, "Temporal link prediction"): links split by time
(``data/time_split.py``), each training positive, its ends and its negatives sampled at the link's time,
strictly before it (``orchestration/temporal.py``'s request, exact or device mode), negatives drawn as of that
time. A typed graph's task is its link relation's, in its ends' stacked ids (``data.links.LinkEnds``), sampled
by ``TemporalTypedSampler``.

Evaluation scores every validation and test link the same way: its two ends and ``eval_negatives``
destinations drawn as of its time are embedded over neighbourhoods sampled strictly before it (the evaluation
fanouts, default the training ones), so the score of a link never depends on anything at or after it. A
vertex's embedding depends on the time it is asked at, so there is no embedding per vertex to reuse: each
link's entries are sampled and computed, ``eval_batch_size`` entries (a link's two ends and its negatives) at
a time, every batch of a set with the set's one key: a draw depends on its vertex and time only, so the scores
do not depend on the batch size. Reported: MRR against the drawn negatives (as TGB reports it), Hits@K, ROC-AUC
and average precision over all pairs (as the TGN papers report them; not with shared negatives)."""

from __future__ import annotations

import numpy as np
import torch

from neutronorch.config import TrainConfig
from neutronorch.data.graph import Graph
from neutronorch.data.links import PER_SOURCE, SHARED
from neutronorch.data.time_split import Appearance
from neutronorch.data.typed import TypedGraph
from neutronorch.features.store import FeatureStore, TypedInputs
from neutronorch.nn.link import LinkModel
from neutronorch.nn.rows import take_rows
from neutronorch.orchestration.link_seeds import EndsSampler, negative_generator, timed_seed_batch
from neutronorch.orchestration.temporal import TemporalRequest, TimedSampler
from neutronorch.sampling.neighbor_sampler import mix_key
from neutronorch.sampling.temporal_sampler import TemporalNeighborSampler, TemporalTypedSampler
from neutronorch.train.health import SPLIT_NAMES, EvaluationCheck, link_collapse, nonfinite_rows
from neutronorch.train.link_metrics import PerPositiveScores, SharedScores

SET_KEYS = {"val": 0x5456_414C, "test": 0x5454_4553}  # each set's stream of negatives and neighbour draws
DRAW_ROWS = 1 << 12  # positives whose negatives are drawn at a time (the same numbers whatever the batch size)
REPORTED_HITS = (10, 50, 100)


def timed_links(config: TrainConfig, graph) -> TemporalRequest | None:
    """The mode's request to sample a temporal link task by time (None for any other task)."""
    links = getattr(graph, "links", None)
    if config.task != "link" or links is None or not links.timed:
        return None
    return TemporalRequest(np.asarray(links.train_time), config.temporal_strategy, strict=True, link=True,
                           appearance=Appearance(graph))


@torch.no_grad()
def evaluate_timed_links(model: LinkModel, graph: Graph | TypedGraph, store: FeatureStore | None,
                         device: torch.device, config: TrainConfig, metric: str, check: EvaluationCheck | None = None,
                         progress=None, appearance: Appearance | None = None, fanouts=None) -> dict[str, float]:
    """``metric`` on the validation and test links as {"val": ..., "test": ...}, and every reported metric
    under ``val_<name>``/``test_<name>`` (mrr, hits_K, rocauc, ap). ``progress(layer, done, total)`` after
    every batch (layer 0). ``appearance``: the training's (made here where not given). A typed graph's
    (``store`` None) are sampled with ``fanouts`` per relation, in its ends' stacked ids."""
    check, links = check or EvaluationCheck(), graph.links
    sampler, embed = _evaluation(graph, store, device, config, fanouts)
    appearance, out = appearance or Appearance(graph), {}
    model.eval()
    total = sum(getattr(links, name).shape[1] for name in SET_KEYS)
    done = 0
    for name, salt in SET_KEYS.items():
        positives = torch.from_numpy(np.asarray(getattr(links, name), dtype=np.int64))
        times = torch.from_numpy(np.asarray(getattr(links, f"{name}_time")))
        key = mix_key(config.seed, salt)
        shared = links.negative_kind == SHARED  # pairs of no time, scored at the set's one time (check_link_times)
        stored = getattr(links, f"{name}_neg") if links.negative_kind == PER_SOURCE else None
        generator = negative_generator(key)
        positive = torch.empty(positives.shape[1])
        negative_rows = []
        for start in range(0, positives.shape[1], DRAW_ROWS):
            end = min(start + DRAW_ROWS, positives.shape[1])
            negatives = (torch.zeros((end - start, 0), dtype=torch.int64) if shared else
                         torch.from_numpy(np.asarray(stored[start:end], dtype=np.int64)) if stored is not None
                         else appearance.draw(generator, times[start:end], config.eval_negatives))
            per_batch = max(1, config.eval_batch_size // (2 + negatives.shape[1]))  # links whose entries fit
            for lo in range(start, end, per_batch):
                hi = min(lo + per_batch, end)
                pos, neg = _scores(model, sampler, embed, device, positives[:, lo:hi], times[lo:hi],
                                   negatives[lo - start:hi - start], key)
                positive[lo:hi] = pos
                negative_rows.append(neg)
                done += hi - lo
                if progress is not None:
                    progress(0, done, total)
        check.nonfinite(nonfinite_rows(positive), positive.shape[0], SPLIT_NAMES[name], "scores", "positive pairs")
        if shared:
            pairs = torch.from_numpy(np.asarray(getattr(links, f"{name}_neg"), dtype=np.int64))
            negative = _shared_scores(model, sampler, embed, device, pairs, times[:1],
                                      max(1, config.eval_batch_size // 2), key)
            check.nonfinite(nonfinite_rows(negative), negative.shape[0], SPLIT_NAMES[name], "scores",
                            "negative pairs")
            scores = SharedScores(positive, negative)
        else:
            negative = torch.cat(negative_rows) if negative_rows else torch.zeros((0, config.eval_negatives))
            check.nonfinite(nonfinite_rows(negative), positive.shape[0], SPLIT_NAMES[name], "scores",
                            "positives' negative pairs")
            scores = PerPositiveScores(positive, pooled=True)
            scores.add(0, negative)
            out[f"{name}_ap"] = scores.average_precision()
        check.collapsed(link_collapse(scores))
        out.update({name: scores.score(metric), f"{name}_mrr": scores.mrr(), f"{name}_rocauc": scores.roc_auc()})
        for k in REPORTED_HITS:  # a positive among fewer negatives than K is always a hit: not reported
            if k < scores.negatives_per_positive:
                out[f"{name}_hits_{k}"] = scores.hits_at_k(k)
    return out


def _evaluation(graph: Graph | TypedGraph, store: FeatureStore | None, device: torch.device, config: TrainConfig,
                fanouts) -> tuple[TimedSampler, object]:
    """The evaluation's timed sampler (strictly before each seed's time) and ``embed(model, subgraph)``."""
    if isinstance(graph, TypedGraph):
        inputs = TypedInputs(graph)
        sampler = EndsSampler(TimedSampler(TemporalTypedSampler(graph, fanouts, config.temporal_strategy, strict=True),
                                           None), graph.links.ends)
        return sampler, lambda model, subgraph: model(
            [b.to(device) for b in subgraph.blocks], *inputs(subgraph.input_nodes, device))
    sampler = TimedSampler(TemporalNeighborSampler(graph.indptr, graph.indices, graph.edge_time,
                                                   config.eval_fanouts or config.fanouts, config.temporal_strategy,
                                                   strict=True), None)
    return sampler, lambda model, subgraph: model([b.to(device) for b in subgraph.blocks],
                                                  store.gather(subgraph.input_nodes).to(device))


def _shared_scores(model: LinkModel, sampler: TimedSampler, embed, device: torch.device, pairs: torch.Tensor,
                   at: torch.Tensor, batch_size: int, key: int) -> torch.Tensor:
    """The (N,) float32 scores of (2, N) shared negative ``pairs``, both ends sampled at the one time ``at``,
    ``batch_size`` pairs at a time."""
    scores = [torch.zeros(0)]
    for lo in range(0, pairs.shape[1], batch_size):
        chunk = pairs[:, lo:lo + batch_size]
        seeds, where = torch.unique(chunk.reshape(-1), return_inverse=True)
        subgraph = sampler.sample_timed([seeds], [at.expand(seeds.shape[0])], [key])[0]
        rows = take_rows(embed(model, subgraph), where.view(2, -1).T.contiguous().to(device))  # (n, 2, width)
        scores.append(model.score(rows[:, 0], rows[:, 1]).float().cpu())
    return torch.cat(scores)


def _scores(model: LinkModel, sampler: TimedSampler, embed, device: torch.device, positives: torch.Tensor,
            times: torch.Tensor, negatives: torch.Tensor, key: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (P,) positive and (P, K) negative scores of one batch, float32 on the CPU: its entries sampled at
    their times with ``key`` and embedded by the encoder."""
    batch = timed_seed_batch(positives, times, negatives)
    embeddings = embed(model, sampler.sample_timed([batch.seeds], [batch.times], [key])[0])
    rows = take_rows(embeddings, batch.targets.to(device))  # (P, 2 + K, width)
    source = rows[:, 0]
    positive = model.score(source, rows[:, 1])
    negative = model.score(source.unsqueeze(1).expand(-1, negatives.shape[1], -1), rows[:, 2:])
    return positive.float().cpu(), negative.float().cpu()
