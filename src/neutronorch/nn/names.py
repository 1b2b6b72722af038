"""The models' names and settings, without torch (the command line and the configuration import this)."""

from __future__ import annotations

MODELS = ("sage", "gcn", "gat")
# Relational models of typed graphs (nn/typed_models.py); ``sage`` names both kinds (the graph chooses).
TYPED_MODELS = ("sage", "rgcn", "rgat")
RELATIONAL_ONLY = tuple(m for m in TYPED_MODELS if m not in MODELS)
LINK_HEADS = ("dot", "mlp")  # how a link task scores a pair of embeddings (nn/link.py)
NORMS = ("none", "layer", "batch")  # between layers
GCN_NORMS = ("symmetric", "mean")
# plain: a stack of graph layers with ReLU and dropout between; blocks: residual graph blocks between an
# input map and a linear head (nn/blocks.py)
ARCHITECTURES = ("plain", "blocks")
# fp32, bf16, or auto: bf16 where the training device computes it natively (nn/precision.py)
PRECISIONS = ("fp32", "bf16", "auto")


def needs_degrees(kind: str, gcn_norm: str = "symmetric") -> bool:
    """Whether a model's blocks must carry their sources' graph degrees (what the samplers are told)."""
    return kind == "gcn" and gcn_norm == "symmetric"
