"""A link task: its loss over a mini-batch's pairs, and its exact evaluation.

Training (``LinkTask.loss``): a step's model outputs are the embeddings of the batch's seeds; its targets
(``orchestration/link_seeds.py``) say where each positive's ends and its negatives' destinations are among
them. The head scores every positive and every negative pair; the loss is binary cross-entropy, the mean
over positives plus the mean over negatives (PyG's and OGB's link examples).

Evaluation (``evaluate_links``): the encoder's embeddings of every vertex an evaluation pair names, from
full neighbourhoods layer by layer over the message-passing graph (which holds no validation or test
edge; the layers below the last memory-mapped, as ``predict``'s, where they would not fit), then the head's score of each positive and its negatives: those the data stores
(``LinkSplit.val_neg``/``test_neg``), else ``eval_negatives`` destinations per positive drawn once from
the seed (the same at every evaluation). Scores are computed in chunks; the metric is OGB's
(``link_metrics.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from neutronorch.config import TrainConfig
from neutronorch.data.graph import Graph
from neutronorch.data.links import PER_SOURCE, SHARED, check_link_split, parse_link_split, split_edges
from neutronorch.errors import ConfigError
from neutronorch.features.store import FeatureStore
from neutronorch.nn.link import LinkModel
from neutronorch.nn.rows import take_rows
from neutronorch.orchestration.link_seeds import draw_negatives
from neutronorch.sampling.neighbor_sampler import mix_key
from neutronorch.train.distributed import World
from neutronorch.train.layerwise import LayerProgress, layerwise
from neutronorch.train.link_metrics import hits_at_k, link_roc_auc, link_score, mrr
from neutronorch.train.predict import scratch_folder

__all__ = ["LinkTask", "evaluate_links", "link_graph", "DEFAULT_LINK_SPLIT"]

SCORE_CHUNK = 1 << 16  # pairs scored at a time
REPORTED_HITS = (10, 50, 100)
DEFAULT_LINK_SPLIT = "edges:0.85,0.05"  # a graph without links of its own: 85% training, 5% validation edges


def is_link_split(split: str | None) -> bool:
    return isinstance(split, str) and split.strip().lower().startswith("edges:")


def link_graph(graph: Graph, config: TrainConfig) -> Graph:
    """The graph a link task trains on: ``graph`` when it carries its own links (an OGB link dataset), else
    ``graph`` split by ``config.split`` (``edges:TRAIN,VAL``; default ``DEFAULT_LINK_SPLIT``) seeded by
    ``config.seed``, its validation and test edges out of its topology. The split is checked first."""
    if graph.links is None:
        spec = config.split or DEFAULT_LINK_SPLIT
        if not is_link_split(spec):
            raise ConfigError(f"`split` {spec!r} splits vertices; a link task splits edges: give `split` "
                              f"edges:TRAIN,VAL (such as {DEFAULT_LINK_SPLIT}), or none for that default.")
        graph = split_edges(graph, *parse_link_split(spec), seed=config.seed)
    elif config.split:
        raise ConfigError(f"`split` {config.split!r}: {graph.name} carries its own link split; leave `split` out.")
    # Stored negatives that are positives of their own set were counted in a note by the loader (OGB's
    # evaluators score them as given); everything else about the split must hold.
    check_link_split(graph.links, graph.num_nodes, graph.name, negatives_may_be_positive=True)
    return graph


@dataclass(frozen=True)
class LinkTask:
    model: LinkModel
    metric: str  # mrr, rocauc or hits@K (resolved: never auto)
    multilabel: bool = False

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
        """Binary cross-entropy of the batch's positives (label 1) and negatives (label 0)."""
        if targets.shape[0] == 0:
            return embeddings.sum() * 0.0
        # Each seed's row is picked many times: take_rows sums their gradients in a fixed order (nn/rows.py).
        rows = take_rows(embeddings, targets)  # (positives, 2 + negatives, width)
        source = rows[:, 0]
        positive = self.model.score(source, rows[:, 1])
        negative = self.model.score(source.unsqueeze(1).expand(-1, targets.shape[1] - 2, -1), rows[:, 2:])
        return (F.binary_cross_entropy_with_logits(positive, torch.ones_like(positive))
                + F.binary_cross_entropy_with_logits(negative, torch.zeros_like(negative)))

    def loss_weight(self, targets: torch.Tensor) -> torch.Tensor:
        """The positives a rank's loss averages (its weight in the data-parallel gradient mean)."""
        return torch.full((), float(targets.shape[0]), device=targets.device)  # a fill there, not a copy to it


@torch.no_grad()
def evaluate_links(model: LinkModel, graph: Graph, store: FeatureStore, device: torch.device, batch_size: int,
                   seed: int, eval_negatives: int, task: LinkTask, world: World | None = None,
                   progress: LayerProgress | None = None) -> dict[str, float]:
    """``task``'s metric on the validation and test links, as {"val": ..., "test": ...}, and every reported
    metric under ``val_<name>``/``test_<name>`` (mrr, hits_K, rocauc)."""
    links = graph.links
    sets = {"val": (_pairs(links.val), links.val_neg), "test": (_pairs(links.test), links.test_neg)}
    negatives = {}
    for offset, (name, (positives, stored)) in enumerate(sets.items()):
        if links.negative_kind in (SHARED, PER_SOURCE):
            negatives[name] = torch.from_numpy(np.array(stored, dtype=np.int64))
        else:  # drawn once from the seed: the same at every evaluation
            negatives[name] = draw_negatives(mix_key(seed, 0x4556_414C + offset), positives.shape[1], eval_negatives,
                                             graph.num_nodes)
    nodes = torch.unique(torch.cat([t.reshape(-1) for pair in zip(sets.values(), negatives.values())
                                    for t in (pair[0][0], pair[1])]))
    # The layers below the last over every vertex: memory-mapped in a scratch folder where they would not fit.
    scratch = scratch_folder(model.encoder, graph, model.num_layers, "auto", None)
    embeddings = layerwise(model.encoder, graph, store, nodes, device, batch_size, scratch=scratch, world=world,
                           progress=progress)
    model.eval()
    out: dict[str, float] = {}
    for name, (positives, _) in sets.items():
        positive, negative = _scores(model, embeddings, nodes, positives, negatives[name],
                                     links.negative_kind == SHARED, device)
        out[name] = link_score(task.metric, positive, negative)
        out[f"{name}_mrr"] = mrr(positive, negative)
        for k in REPORTED_HITS:  # a positive among fewer negatives than K is always a hit: not reported
            if k < negative.shape[-1]:
                out[f"{name}_hits_{k}"] = hits_at_k(positive, negative, k)
        out[f"{name}_rocauc"] = link_roc_auc(positive, negative)
    return out


def _pairs(edges) -> torch.Tensor:
    return torch.from_numpy(np.array(edges, dtype=np.int64).reshape(2, -1))


def _scores(model: LinkModel, embeddings: torch.Tensor, nodes: torch.Tensor, positives: torch.Tensor,
            negatives: torch.Tensor, shared: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores of the (2, P) positives, and of the negatives: (N,) for shared (2, N) pairs, else (P, K) for
    each positive's source with its row of destinations."""
    row = lambda ids: embeddings[torch.searchsorted(nodes, ids)].to(device)  # noqa: E731
    positive = _chunked(lambda s: model.score(row(positives[0, s]), row(positives[1, s])), positives.shape[1])
    if shared:
        negative = _chunked(lambda s: model.score(row(negatives[0, s]), row(negatives[1, s])), negatives.shape[1])
    else:
        per = max(1, SCORE_CHUNK // max(1, negatives.shape[1]))
        negative = _chunked(lambda s: model.score(row(positives[0, s]).unsqueeze(1), row(negatives[s])),
                            positives.shape[1], per)
    return positive, negative


def _chunked(score, count: int, chunk: int = SCORE_CHUNK) -> torch.Tensor:
    parts = [score(slice(start, start + chunk)).float().cpu() for start in range(0, count, chunk)]
    return torch.cat(parts) if parts else torch.zeros(0)
