"""A link task on a partition folder (``train --partitions DIR --task link``; docs/distributed.md, "Partitioned
training"): the folder's link split (``data/partition_links.py``), the model a full-copy run makes (its first
layer started from the whole graph's input statistics the manifest holds), the seed edges dealt by the owner
of their source (``LinkSeeds`` with ``owner``), and the evaluation: every layer computed across the parts
(``PartEvaluation``) for the vertices the validation and test pairs name, their rows gathered on every rank,
which scores every pair as the full-copy run does (``evaluate_links``)."""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from neutronorch.config import TrainConfig
from neutronorch.data.partition_files import is_partition_dir, read_manifest
from neutronorch.data.partition_links import input_statistics
from neutronorch.errors import ConfigError
from neutronorch.nn.link import LinkModel
from neutronorch.train.link_task import evaluate_links
from neutronorch.train.part_eval import PartEvaluation


def check_task(config: TrainConfig) -> None:
    """A partition folder's task is its own: a link split's folder trains `task` link, any other a node task
    (read from its manifest, before any output is made; a folder that cannot be read is refused later)."""
    folder = config.partitions
    if not is_partition_dir(folder):
        return
    links = bool(read_manifest(folder).get("links"))
    if links and config.task != "link":
        raise ConfigError(f"`task` {config.task}: {folder} is a partition of a link split (its validation and test "
                          f"edges are out of its topology); give `task` link, or partition the graph without "
                          f"`--split`.")
    if not links and config.task == "link":
        raise ConfigError(f"`task` link: {folder} holds no link split; partition the graph with `--split "
                          f"edges:TRAIN,VAL` (or a dataset with its own link split) for a link task.")


def link_model(config: TrainConfig, encoder: torch.nn.Module, manifest: dict) -> LinkModel:
    """``homogeneous_model``'s ``LinkModel`` over ``encoder``, from the statistics the partition holds."""
    norm, mean = input_statistics(manifest)
    return LinkModel(encoder, config.link_head, input_norm=norm,
                     input_mean=None if mean is None else torch.from_numpy(mean))


class PartLinkEvaluation(PartEvaluation):
    """``PartEvaluation`` of a link task: the metrics of ``evaluate_links`` from rows computed across the parts."""

    def evaluate(self, run, check, progress=None) -> dict[str, float]:
        config = run.config
        self.prepare(run.model)
        embedded = lambda nodes: contextlib.nullcontext(  # noqa: E731
            self.rows(run.model.encoder, nodes.numpy(), run.device, config.eval_batch_size, progress))
        return evaluate_links(run.model, run.graph, None, run.device, config.eval_batch_size, config.seed,
                              config.eval_negatives, run.task, progress=progress, check=check, embedded=embedded)

    def rows(self, encoder, nodes: np.ndarray, device: torch.device, chunk_size: int, progress) -> torch.Tensor:
        """The last layer's rows of ``nodes`` (every rank the same ids), in their order, on every rank: each
        rank computes those it owns, and the rows are gathered (a collective)."""
        part, world = self.part, self.world
        positions = np.flatnonzero(np.asarray(part.part_of[nodes]) == part.part)
        rows = self.logits(encoder, np.ascontiguousarray(nodes[positions]), device, chunk_size, progress)
        positions = torch.from_numpy(positions)
        if world.distributed:
            positions = torch.cat(world.all_gather_rows(positions, "gathering the evaluation's positions"))
            rows = torch.cat(world.all_gather_rows(rows.contiguous(), "gathering the evaluation's embeddings"))
        out = torch.empty((nodes.shape[0], rows.shape[1]))
        out[positions] = rows
        return out
