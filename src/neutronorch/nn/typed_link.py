"""How a relational encoder (``TypedGNN``) starts in a link model: the typed counterpart of ``glorot_``'s input
scaling and centring (docs/link-prediction.md, "Typed graphs"). Per vertex type the bottom layer reads rows of
their own scale: a featured type its feature rows (raw, often larger than unit norm), a featureless one its
embedding table's rows, drawn as ``nn.Embedding`` draws them (standard normal: norm about the square root of
their width). The weights that read each type's rows are divided by that type's RMS row norm where it is above
1 (``SCALED``), and learn at the learning rate divided by it (``input_groups``, ``optimizer_groups``); the
biases start at zero, and where the bottom layer has a bias of a destination type's own, at minus what the
weights make of the mean rows, so each type's first outputs start centred. The weights keep their own start
(Glorot's with the ReLU gain, as ``glorot_`` gives a homogeneous encoder, started the embeddings 3 to 5 times
larger, summed over the relations). R-GAT keeps its own start.
"""

from __future__ import annotations

import math
from typing import Mapping

import torch
from torch import nn

from neutronorch.nn.relational import RGCNConv, TypedSAGEConv, module_key
from neutronorch.nn.typed_models import TypedGNN

SCALED = 1.0 + 1e-3  # a row norm above this scales the weights that read the rows; unit rows do not


def type_norms(encoder: TypedGNN, feature_norms: Mapping[str, float]) -> dict[str, float]:
    """The RMS row norm of each type the bottom layer reads: ``feature_norms[t]`` for a featured type (1 where
    not given), and for a featureless one its table's, the square root of its width (standard normal rows)."""
    return {t: math.sqrt(encoder.embeddings[t].embedding_dim) if t in encoder.embeddings
            else float(feature_norms.get(t, 1.0)) for t in encoder.input_types}


def input_groups(encoder: TypedGNN, norms: Mapping[str, float]) -> list[tuple[list[nn.Parameter], float]]:
    """The weights that read each input type's rows, with that type's norm, for the types whose norm is above
    ``SCALED``: R-GCN's input projection of a featured type; a relational SAGE bottom layer's neighbour weights
    of the relations from the type and its root weights over the type's rows. A weight that reads several types'
    rows (R-GCN's relation weights and root, which read a featureless type's table rows as they read every
    type's projected rows) is left out: the table's rows are divided instead (``typed_start``)."""
    layer, groups = encoder.layers[0], []
    for t, norm in norms.items():
        if norm <= SCALED:
            continue
        if isinstance(layer, TypedSAGEConv):
            weights = [layer.neigh[module_key(r)].weight for r in layer.relations if r[0] == t]
            if layer.root is not None:
                keys = [module_key(r) if layer.root_mode == "relation" else r[2] for r in layer.relations if r[2] == t]
                weights += [layer.root[k].weight for k in dict.fromkeys(keys)]
        elif isinstance(layer, RGCNConv) and t in encoder.projections:
            weights = [encoder.projections[t].weight]
        else:
            weights = []
        if weights:
            groups.append((weights, norm))
    return groups


def typed_start(encoder: TypedGNN, feature_norms: Mapping[str, float],
                feature_means: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Start ``encoder`` for a link task (the module docstring) from the featured types' RMS row norms and mean
    rows; returns the norms of the types whose weights learn at a divided rate (``input_groups``). R-GCN's
    featureless types' tables, read by weights shared with other types, are divided by their norm instead."""
    if encoder.kind not in ("sage", "rgcn"):
        return {}
    norms = type_norms(encoder, feature_norms)
    layer = encoder.layers[0]
    with torch.no_grad():
        for name, parameter in encoder.named_parameters():
            if name.rsplit(".", 1)[-1] == "bias":  # a bias shared by every embedding: a direction a dot rewards
                parameter.zero_()
        if isinstance(layer, RGCNConv):
            for t in encoder.embeddings:
                if norms[t] > SCALED:
                    encoder.embeddings[t].weight.div_(norms[t])
            norms = {t: n for t, n in norms.items() if t not in encoder.embeddings}
        groups = input_groups(encoder, norms)
        for weights, norm in groups:
            for weight in weights:
                weight.div_(norm)
        _centre(encoder, feature_means)
    return {t: n for t, n in norms.items() if n > SCALED and input_groups(encoder, {t: n})}


def _centre(encoder: TypedGNN, means: Mapping[str, torch.Tensor]) -> None:
    """Each destination type's bias of the bottom layer at minus what its weights make of the featured types'
    mean rows (a table's mean row is about zero): R-GCN's through each featured type's projection bias;
    relational SAGE's through one bias that only the type's outputs add (its first root bias, or neighbour
    bias without roots)."""
    layer = encoder.layers[0]
    means = {t: torch.as_tensor(m, dtype=torch.float32) for t, m in means.items() if m is not None}
    if isinstance(layer, RGCNConv):
        for t, projection in encoder.projections.items():
            if t in means and projection.bias is not None:
                projection.bias.sub_(projection.weight.float() @ means[t])
        return
    if not isinstance(layer, TypedSAGEConv):
        return
    for t in dict.fromkeys(r[2] for r in layer.relations):
        into = [r for r in layer.relations if r[2] == t]
        shift = sum((layer.neigh[module_key(r)].weight @ means[r[0]] for r in into if r[0] in means),
                    torch.zeros(layer.out_dim))
        if layer.root is not None and t in means:
            keys = dict.fromkeys(module_key(r) if layer.root_mode == "relation" else t for r in into)
            shift = shift + sum(layer.root[k].weight @ means[t] for k in keys)
        bias = layer.root[module_key(into[0]) if layer.root_mode == "relation" else t].bias \
            if layer.root is not None else layer.neigh[module_key(into[0])].bias
        bias.sub_(shift.to(bias.dtype))
