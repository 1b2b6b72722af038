"""Your own module on a typed graph: any ``torch.nn.Module`` that takes a ``TypedGNN``'s arguments trains like one.

``TypedUserModel`` adapts it to what a typed run calls (``train(config, graph=typed, model=module)``;
``docs/heterogeneous.md``, "Your own module"). The protocol: ``forward(blocks, features, ids)``, where
``blocks`` are the sampled ``TypedBlock``s (bottom layer first), ``features[t]`` the float32 input rows of
each featured type of the bottom frontier and ``ids[t]`` every type's bottom frontier (global ids within the
type: what a featureless type's embedding table is looked up by); it returns the logits of the target's
seeds, ``[seeds, outputs]`` (the destinations of the last block's target type, in their order). A module
taking PyG's form (``x_dict, edge_index_dict``) is refused, naming ``TypedNeighborLoader``'s ``to_pyg()``,
the loop of one's own that feeds it.

Optimizers as for the built-in models: every ``nn.Embedding`` (or ``nn.EmbeddingBag``) made with
``sparse=True`` is a table, its rows moved by ``RowAdam`` (or ``SparseAdam`` off the CPU) where a batch looked
them up (``embedding_parameters``); every other parameter goes to Adam (``dense_parameters``).

NeutronOrch mode is not offered: it computes hot vertices' bottom layer apart (``TypedGNN.bottom_layer``)
from snapshots of the embedding rows it reads, which a module of one's own does not expose;
``bottom_layer`` says so.
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from neutronorch.nn.custom import ModelProtocolError, check_output_trains, forward_parameters
from neutronorch.sampling.typed_block import TypedBlock

__all__ = ["TypedUserModel", "TYPED_PROTOCOL"]

TYPED_PROTOCOL = ("forward(blocks, features, ids) returning the logits of the seeds, a row per destination of "
                  "the last block's target type (TypedGNN's call; docs/heterogeneous.md, 'Your own module')")
_PYG_NAMES = ("x", "x_dict", "data", "batch")


class TypedUserModel(nn.Module):
    """A user's module behind the interface a typed run calls. ``num_layers``: the sampled hops it reads;
    ``num_classes``: its output width (the task's); ``target``: the type whose seeds it scores."""

    def __init__(self, module: nn.Module, num_layers: int, num_classes: int, target: str):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise ModelProtocolError(f"the model must be a torch.nn.Module, not {type(module).__name__}")
        _check_form(module)
        self.module = module
        self.num_layers, self.target = num_layers, target
        kind = type(module)
        self.kind = f"{kind.__module__}.{kind.__qualname__}"
        # Not what rebuilds it (only its own code can): what a summary says of it.
        self.arguments = {"custom": self.kind, "num_layers": num_layers, "num_classes": num_classes}

    def embedding_parameters(self) -> list[nn.Parameter]:
        """The weights of every sparse ``nn.Embedding``/``nn.EmbeddingBag`` (sparse gradients: the tables'
        optimizer), each once."""
        found, seen = [], set()
        for module in self.module.modules():
            if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.sparse and id(module.weight) not in seen:
                seen.add(id(module.weight))
                found.append(module.weight)
        return found

    def dense_parameters(self) -> list[nn.Parameter]:
        """Every other parameter (dense gradients: Adam)."""
        sparse = {id(p) for p in self.embedding_parameters()}
        return [p for p in self.parameters() if id(p) not in sparse]

    def bottom_layer(self):
        raise ModelProtocolError(f"NeutronOrch mode computes hot vertices' bottom layer apart, with a copy of a "
                                 f"TypedGNN's bottom layer and snapshots of the embedding rows it reads, which "
                                 f"{self.kind} does not expose; train it in `mode` exact or device")

    def forward(self, blocks: list[TypedBlock], features: Mapping[str, torch.Tensor], ids: Mapping[str, torch.Tensor],
                hot=None) -> torch.Tensor:
        if hot:
            self.bottom_layer()  # raises: hot rows are NeutronOrch's
        if len(blocks) != self.num_layers:
            raise ValueError(f"{len(blocks)} blocks for a {self.num_layers}-layer model")
        out = self.module(blocks, features, ids)
        rows, width = int(blocks[-1].num_dst.get(self.target, 0)), self.arguments["num_classes"]
        if not isinstance(out, torch.Tensor) or out.dim() != 2 or tuple(out.shape) != (rows, width):
            got = f"shape {list(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
            raise ModelProtocolError(f"{self.kind}.forward(blocks, features, ids) returned {got}; the protocol "
                                     f"expects a [{rows}, {width}] tensor (a row of logits per {self.target} seed, "
                                     f"a column per output): {TYPED_PROTOCOL}")
        check_output_trains(out, self, self.kind, "forward(blocks, features, ids)")
        return out


def _check_form(module: nn.Module) -> None:
    """``module.forward`` takes three arguments (blocks, features, ids), or says what it takes instead."""
    name = type(module).__name__
    positional, params = forward_parameters(module, TYPED_PROTOCOL)
    varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
    if positional[:1] and positional[0] in _PYG_NAMES:
        raise ModelProtocolError(f"{name}.forward takes ({', '.join(positional)}), PyG's form; train() calls a "
                                 f"typed graph's model as {TYPED_PROTOCOL}. A PyG model trains in a loop of your "
                                 f"own over TypedNeighborLoader's batch.to_pyg() (docs/loader.md, 'Typed graphs').")
    if len(positional) < 3 and not varargs:
        raise ModelProtocolError(f"{name}.forward takes ({', '.join(positional) or 'nothing'}); a typed graph's "
                                 f"model must take {TYPED_PROTOCOL}")
