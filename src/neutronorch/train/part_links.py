"""A link task on a partition folder (``train --partitions DIR --task link``; docs/distributed.md, "Partitioned
training"): the folder's link split (``data/partition_links.py``), the model a full-copy run makes (its first
layer started from the whole graph's input statistics the manifest holds), the seed edges dealt by the owner
of their source (``LinkSeeds`` with ``owner``), and the evaluation: every layer computed across the parts
(``PartEvaluation``) for the vertices the validation and test pairs name, each rank scoring a share of the pairs
from the rows its share names, and the metrics those of all the scores in one place (``evaluate_links``')."""

from __future__ import annotations

import numpy as np
import torch

from neutronorch.config import TrainConfig
from neutronorch.data.partition_files import is_partition_dir, is_typed, read_manifest
from neutronorch.data.partition_links import input_statistics
from neutronorch.data.partition_typed_links import check_link_relation
from neutronorch.errors import ConfigError
from neutronorch.nn.link import LinkModel
from neutronorch.data.links import SHARED
from neutronorch.train.health import SPLIT_NAMES, nonfinite_rows
from neutronorch.train.link_metrics import PerPositiveScores, SharedScores
from neutronorch.train.link_task import SCORE_CHUNK, eval_sets, named_vertices, pair_scores, set_metrics
from neutronorch.train.part_eval import PartEvaluation


def check_task(config: TrainConfig) -> None:
    """A partition folder's task is its own: a link split's folder trains `task` link, any other a node task
    (read from its manifest, before any output is made; a folder that cannot be read is refused later)."""
    folder = config.partitions
    if not is_partition_dir(folder):
        return
    manifest = read_manifest(folder)
    typed, links = is_typed(manifest), bool(manifest.get("links"))
    if links and config.task != "link":
        raise ConfigError(f"`task` {config.task}: {folder} is a partition of a link split (its validation and test "
                          f"edges are out of its topology); give `task` link, or partition the graph without "
                          f"`--split`.")
    if not links and config.task == "link":
        how = ("`--split edges:TRAIN,VAL --link-relation REL`" if typed else
               "`--split edges:TRAIN,VAL` (or a dataset with its own link split)")
        raise ConfigError(f"`task` link: {folder} holds no link split; partition the graph with {how} for a link "
                          f"task.")
    if typed and links:  # the relation is the folder's
        check_link_relation(manifest, folder, config.link_relation)


def link_model(config: TrainConfig, encoder: torch.nn.Module, manifest: dict) -> LinkModel:
    """``homogeneous_model``'s ``LinkModel`` over ``encoder``, from the statistics the partition holds."""
    norm, mean = input_statistics(manifest)
    return LinkModel(encoder, config.link_head, input_norm=norm,
                     input_mean=None if mean is None else torch.from_numpy(mean))


class PartLinkEvaluation(PartEvaluation):
    """``PartEvaluation`` of a link task: ``evaluate_links``' metrics, each rank scoring a share of the pairs.

    Every rank computes the encoder's rows of the named vertices it owns (the layers across the parts), into a
    table of its part's rows. Each rank then takes a contiguous share of each set's positives (and of shared
    negative pairs), fetches the rows its shares name from their owners (one fetch), and scores them; the
    positives' scores are gathered, and per-positive negatives' counts and ranks summed (``combined``), so every
    rank reports the metrics one process would, holding only its share's rows."""

    def evaluate(self, run, check, progress=None) -> dict[str, float]:
        config, model = run.config, run.model
        self.prepare(model)
        model.eval()
        count, destinations = self.vertices(run)
        sets = eval_sets(run.graph.links, config.seed, config.eval_negatives, destinations)
        fetch = self.embed_named(run, named_vertices(sets, count).numpy(), progress)
        shares = {name: self.share_of(pairs) for name, pairs in sets.items()}
        # The rows every set's share names, fetched from their owners at once (the drawn negatives read twice,
        # a chunk at a time: here for their ids, then to score them).
        named = torch.zeros(count, dtype=torch.bool)
        for lo, positives, negatives in shares.values():
            named[positives.reshape(-1)] = True
            for _, chunk in negatives():
                named[chunk.reshape(-1)] = True
        ids = named.nonzero().reshape(-1)
        del named
        got = torch.from_numpy(fetch(ids.numpy()))
        del fetch  # and the rows it fetched from
        row = lambda v: got[torch.searchsorted(ids, v)].to(run.device)  # noqa: E731
        out: dict[str, float] = {}
        with torch.no_grad():
            for name, pairs in sets.items():
                scores = self.scored(model, pairs, *shares[name], row, check, SPLIT_NAMES[name])
                out.update(set_metrics(name, scores, run.task.metric, check))
        return out

    def vertices(self, run) -> tuple[int, tuple[int, int]]:
        """The vertices pairs name (their count) and the range of their destinations' ids."""
        return run.graph.num_nodes, (0, run.graph.num_nodes)

    def embed_named(self, run, nodes: np.ndarray, progress=None):
        """The encoder's rows of the named vertices ``nodes`` this rank owns (layer by layer across the parts),
        and a function fetching any named vertices' rows from their owners (a collective)."""
        part = self.part
        owned = nodes[np.asarray(part.part_of[nodes]) == part.part]
        encoder = run.model.encoder
        table = np.zeros((part.ids.shape[0], self.out_width(encoder)), np.float32)
        local, at = part.local(owned), 0
        for rows in self.last_rows(encoder, np.ascontiguousarray(owned), run.device, run.config.eval_batch_size,
                                   progress):  # written into the table chunk by chunk
            table[local[at:at + rows.shape[0]]] = rows.numpy()
            at += rows.shape[0]
        return lambda ids: self.fetcher.fetch(ids, table=table)[0]

    def share_of(self, pairs) -> tuple[int, torch.Tensor, object]:
        """This rank's share of a set: its first positive, its positives (2, p), and a function giving its
        negatives a chunk at a time as (first row, chunk): its positives' (rows, K), or its share of shared
        negative pairs (one chunk, (2, n))."""
        lo, hi = share(pairs.positives.shape[1], self.part)
        if pairs.kind == SHARED:
            low, high = share(pairs.stored.shape[1], self.part)
            stored = torch.from_numpy(np.array(pairs.stored[:, low:high], np.int64))
            return lo, pairs.positives[:, lo:hi], lambda: iter([(0, stored)])
        step = max(1, SCORE_CHUNK // max(1, pairs.per_positive))

        def negatives():  # the draws' stream from its start (the same numbers whatever the chunks): the share's
            for start, chunk in pairs.negatives(step):
                if start < hi and start + chunk.shape[0] > lo:
                    yield max(start, lo) - lo, chunk[max(0, lo - start):hi - start]
        return lo, pairs.positives[:, lo:hi], negatives

    def scored(self, model, pairs, lo: int, positives, negatives, row, check, split: str):
        """The set's scores on every rank (``SharedScores`` or ``PerPositiveScores``), this rank scoring its
        share (``share_of``; ``row(ids)``: their rows). Collectives: the gathers and the sums."""
        count = pairs.positives.shape[1]
        positive = pair_scores(model, row, positives)
        bad = [nonfinite_rows(positive)]
        positive = self.gathered(positive)
        if pairs.kind == SHARED:
            negative = pair_scores(model, row, next(negatives())[1])
            bad.append(nonfinite_rows(negative))
            scores = SharedScores(positive, self.gathered(negative))
        else:
            scores, bad_rows = PerPositiveScores(positive), 0
            for at, chunk in negatives():
                sources = row(positives[0, at:at + chunk.shape[0]]).unsqueeze(1)
                negative = model.score(sources, row(chunk)).float().cpu()
                bad_rows += nonfinite_rows(negative)
                scores.add(lo + at, negative)
            scores.negatives_per_positive = pairs.per_positive
            bad.append(bad_rows)
            scores = scores.combined(lambda state: self.summed(state)) if self.world.distributed else scores
        bad = self.summed(np.asarray(bad, np.float64)) if self.world.distributed else bad
        labels = ("positive pairs", "negative pairs" if pairs.kind == SHARED else "positives' negative pairs")
        totals = (count, pairs.stored.shape[1] if pairs.kind == SHARED else count)
        for n, total, label in zip(bad, totals, labels):  # rows of scores that held NaN or infinities
            check.nonfinite(int(n), total, split, "scores", label)
        return scores

    def gathered(self, scores: torch.Tensor) -> torch.Tensor:
        """Every rank's ``scores``, in rank order (contiguous shares: the set's order)."""
        if not self.world.distributed:
            return scores
        return torch.cat(self.world.all_gather_rows(scores.contiguous(), "gathering the link scores"))

    def summed(self, state: np.ndarray) -> np.ndarray:
        return self.world.all_reduce_(torch.from_numpy(state), "summing the link scores' counts").numpy()


def share(count: int, part) -> tuple[int, int]:
    """Part ``part.part``'s contiguous share of ``count`` items of ``part.parts`` shares (``torch.tensor_split``'s:
    sizes differ by at most one)."""
    rank, size = part.part, part.parts
    base, extra = divmod(count, size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (rank < extra)
