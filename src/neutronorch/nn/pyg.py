"""A trained model as PyTorch Geometric builds it, for those who serve or fine-tune with PyG.

``to_pyg_model(model)``: PyG's own ``GraphSAGE``, ``GCN`` or ``GAT`` with the same weights, giving on a whole
graph without self loops the logits of full-neighbour inference (docs/models.md, "Serving with PyG").
"""

from __future__ import annotations

import torch

from neutronorch.errors import ConfigError
from neutronorch.nn.models import GNN

# Per kind, each parameter of PyG's layer and ours that it copies.
_PYG_NAMES = {
    "sage": {"lin_l.weight": "lin_neigh.weight", "lin_l.bias": "lin_self.bias",
             "lin_r.weight": "lin_self.weight"},
    "gcn": {"lin.weight": "lin.weight", "bias": "lin.bias"},
    "gat": {"lin.weight": "lin.weight", "att_src": "attn_src", "att_dst": "attn_dst", "bias": "bias"}}


def to_pyg_model(model: GNN) -> torch.nn.Module:
    """PyG's ``GraphSAGE``, ``GCN`` or ``GAT`` with ``model``'s weights (on the CPU, in ``model``'s
    training or evaluation mode)."""
    if not isinstance(model, GNN):
        raise ConfigError(f"to_pyg_model exports a neutronorch GNN (a homogeneous checkpoint's model), not a "
                          f"{type(model).__name__}.")
    try:
        from torch_geometric.nn import GATConv  # noqa: PLC0415 - optional
        from torch_geometric.nn import models as pyg  # noqa: PLC0415
    except ImportError:
        raise ImportError("to_pyg_model needs PyTorch Geometric: pip install torch-geometric") from None
    args = model.arguments
    if args.get("residual") or args.get("norm", "none") != "none" or args.get("architecture", "plain") != "plain":
        raise ValueError("to_pyg_model exports plain stacks of layers; a model trained with residual "
                         "connections or normalisation between layers has no PyG model class to go into")
    common = dict(in_channels=args["in_dim"], hidden_channels=args["hidden"], num_layers=args["num_layers"],
                  out_channels=args["num_classes"], dropout=args["dropout"], act="relu")
    if model.kind == "sage":
        target = pyg.GraphSAGE(**common, aggr="mean")
    elif model.kind == "gcn":
        if args["gcn_norm"] != "symmetric":
            raise ValueError("GCN with gcn_norm 'mean' has no PyG equivalent (PyG's GCNConv normalises "
                             "symmetrically); train with gcn_norm 'symmetric' to serve with PyG")
        target = pyg.GCN(**common)
    else:
        target = pyg.GAT(**common, heads=args["heads"])
        last = model.layers[-1]
        target.convs[-1] = GATConv(last.in_dim, last.out_dim, heads=1, concat=False, dropout=args["dropout"])
    with torch.no_grad():
        for ours, theirs in zip(model.layers, target.convs):
            for name, source in _PYG_NAMES[model.kind].items():
                weight = theirs.get_parameter(name)
                weight.copy_(ours.get_parameter(source).view_as(weight))
    return target.train(model.training)
