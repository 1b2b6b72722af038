"""Your own model: any ``torch.nn.Module`` that follows a small protocol trains like the built-in ones
(docs/models.md, "Your own model"; docs/heterogeneous.md, "Your own module").

``UserModel`` adapts it to what the engine calls, telling its ``forward``'s form (``PROTOCOL``,
``TYPED_PROTOCOL``) by the graph and the names of its first parameters.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from neutronorch.errors import ConfigError
from neutronorch.nn.models import Tables
from neutronorch.nn.splice import splice
from neutronorch.sampling.block import pyg_form

PROTOCOL = ("forward(x, edge_index) returning a row per vertex of x (the PyG form: any two positional "
            "parameters, read by position as PyG does), or forward(blocks, x) returning a row per destination of the "
            "last block (the block form: a first parameter named blocks); docs/models.md, 'Your own model'")
TYPED_PROTOCOL = ("forward(blocks, features, ids) returning the logits of the seeds, a row per destination of "
                  "the last block's target type (TypedGNN's call; docs/heterogeneous.md, 'Your own module')")
_TRIM = ("num_sampled_nodes_per_hop", "num_sampled_edges_per_hop")
_PYG_NAMES = ("x", "x_dict", "data", "batch")


class ModelProtocolError(ConfigError, ValueError):
    """A module that does not follow the protocol: what it does and what the protocol expects (a
    ``ConfigError``: the module is the run's model option)."""


def check_trainable(module: nn.Module, kind: str, sparse_tables: bool = False) -> None:
    """Refuse, before any work, a module ``train()`` could not train (no trainable parameters, parameters on
    the meta device, trainable weights not float32, sparse tables where ``sparse_tables`` is off: whether
    the run moves ``nn.Embedding(sparse=True)`` tables with an optimizer of their own)."""
    named = list(module.named_parameters())
    if not named:
        raise ModelProtocolError(f"{kind} has no parameters, so training has nothing to update; give it its "
                                 f"weights as nn.Parameter or submodules (a plain tensor attribute is no parameter)")
    trainable = [(name, p) for name, p in named if p.requires_grad]
    if not trainable:
        raise ModelProtocolError(f"none of the {len(named)} parameters of {kind} requires a gradient ({named[0][0]} "
                                 f"has requires_grad False), so training has nothing to update; call "
                                 f"module.requires_grad_(True), or unfreeze the layers to train")
    unmade = [name for name, p in named if p.is_meta]
    if unmade:
        raise ModelProtocolError(f"{len(unmade)} parameter(s) of {kind} are on the meta device ({unmade[0]}), "
                                 f"shapes without values; give them values first (module.to_empty(device='cpu') "
                                 f"and initialise them, or build the module off the meta device)")
    sparse = [name for name, m in module.named_modules()
              if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse and m.weight.requires_grad]
    if sparse and not sparse_tables:
        raise ModelProtocolError(f"{kind}.{sparse[0]} is an embedding with sparse=True, whose sparse gradients "
                                 f"the Adam of a homogeneous run cannot take; make it dense (sparse=False), or "
                                 f"train it in a loop of your own over NeighborLoader's batches")
    odd = [(name, p) for name, p in trainable if p.dtype != torch.float32]
    if odd:
        name, p = odd[0]
        raise ModelProtocolError(f"{len(odd)} trainable parameter(s) of {kind} are not float32 ({name} is "
                                 f"{str(p.dtype).replace('torch.', '')}); weights train in float32 (`precision` "
                                 f"bf16 computes in bfloat16 under autocast from float32 weights): call module.float()")


def _form(module: nn.Module, typed: bool) -> tuple[str, bool]:
    """(input form, whether it takes PyG's trimming counts) of ``module.forward``, on a typed graph or not."""
    name = type(module).__name__
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError) as exc:
        raise ModelProtocolError(f"cannot read the parameters of {name}.forward ({exc}); the protocol: "
                                 f"{TYPED_PROTOCOL if typed else PROTOCOL}") from None
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = {p.name for p in params}
    if typed:
        if positional[:1] and positional[0] in _PYG_NAMES:
            raise ModelProtocolError(f"{name}.forward takes ({', '.join(positional)}), PyG's form; train() calls a "
                                     f"typed graph's model as {TYPED_PROTOCOL}. A PyG model trains in a loop of "
                                     f"your own over TypedNeighborLoader's batch.to_pyg() (docs/loader.md, 'Typed "
                                     f"graphs').")
        if len(positional) < 3 and not any(p.kind == p.VAR_POSITIONAL for p in params):
            raise ModelProtocolError(f"{name}.forward takes ({', '.join(positional) or 'nothing'}); a typed graph's "
                                     f"model must take {TYPED_PROTOCOL}")
        return "typed", False
    if len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params):
        if positional[:1] == ["blocks"]:
            return "blocks", False
        return "pyg", all(name in names for name in _TRIM)  # (x, edge_index, ...) by position, as PyG calls it
    raise ModelProtocolError(f"{name}.forward takes ({', '.join(positional) or 'nothing'}); a "
                             f"model trained here must take {PROTOCOL}")


class UserModel(Tables, nn.Module):
    """A user's module behind the interface the engine calls. ``num_layers``: the sampled hops it reads;
    ``width``: its output width (the task's); ``target``: on a typed graph, the type whose seeds it scores."""

    layerwise = False  # no layer-by-layer inference: evaluation samples every neighbour of every hop

    def __init__(self, module: nn.Module, num_layers: int, width: int, target: str | None = None):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise ModelProtocolError(f"the model must be a torch.nn.Module, not {type(module).__name__}")
        self.module = module
        self.form, self.trims = _form(module, target is not None)
        self.num_layers, self.out_width, self.target = num_layers, width, target
        self.needs_degrees = bool(getattr(module, "needs_degrees", False))
        kind = type(module)
        self.kind = f"{kind.__module__}.{kind.__qualname__}"
        # Not what rebuilds it (only its own code can): what a checkpoint needs to check the module given
        # (a typed run's summary names the width num_classes, as TypedGNN's arguments do).
        self.arguments = {"custom": self.kind, "num_layers": num_layers,
                          ("width" if target is None else "num_classes"): width}

    @classmethod
    def wrap(cls, module: nn.Module, num_layers: int, width: int) -> "UserModel":
        """``module`` adapted (itself when it is adapted already, for ``num_layers`` and ``width``)."""
        if isinstance(module, cls):
            if (module.num_layers, module.out_width) != (num_layers, width):
                raise ModelProtocolError(f"the model was adapted for {module.num_layers} layers and {module.out_width} "
                                         f"outputs; this run needs {num_layers} and {width}")
            return module
        return cls(module, num_layers, width)

    @property
    def reuses(self) -> bool:
        """Whether NeutronOrch mode can reuse its bottom layer (``bottom`` and ``upper`` given)."""
        return self.form == "blocks" and isinstance(getattr(self.module, "bottom", None), nn.Module) and \
            callable(getattr(self.module, "upper", None))

    @property
    def bottom(self) -> nn.Module:
        if self.form == "typed":
            self._no_typed_bottom()
        if not self.reuses:
            raise ModelProtocolError(
                f"NeutronOrch mode computes the bottom layer of hot vertices apart, so {self.kind} must take the "
                "block form and expose it: an attribute `bottom` (a module, bottom(block, x) -> the bottom "
                "layer's output before its activation, with `out_dim`) and a method `upper(blocks, h)`; or "
                "train it in exact or device mode (docs/models.md, 'Your own model')")
        bottom = self.module.bottom
        if not isinstance(getattr(bottom, "out_dim", None), int):
            raise ModelProtocolError(f"{self.kind}.bottom has no integer `out_dim` (the width of its output), "
                                     "which NeutronOrch mode needs for its table of hot rows")
        return bottom

    def _no_typed_bottom(self):
        raise ModelProtocolError(f"NeutronOrch mode computes hot vertices' bottom layer apart, with a copy of a "
                                 f"TypedGNN's bottom layer and snapshots of the embedding rows it reads, which "
                                 f"{self.kind} does not expose; train it in `mode` exact or device")

    def width(self, index: int) -> int:
        if index != self.num_layers - 1:
            raise ModelProtocolError(f"{self.kind} gives its final output only; a layer's embedding (embed "
                                     "--layer) needs a built-in model")
        return self.out_width

    def forward(self, blocks: list, *inputs) -> torch.Tensor:
        """``inputs``: ``(x[, hot])`` (``features, ids[, hot]`` in the typed form), as a built-in model's."""
        typed = self.form == "typed"
        x, hot = inputs[:1 + typed], (inputs[1 + typed:] or [None])[0]
        if typed and hot:
            self._no_typed_bottom()  # hot rows are NeutronOrch's
        if len(blocks) != self.num_layers:
            raise ValueError(f"{len(blocks)} blocks for a {self.num_layers}-layer model")
        if typed:
            rows = int(blocks[-1].num_dst.get(self.target, 0))
            return self._checked(self.module(blocks, *x), rows, "forward(blocks, features, ids)",
                                 f"{self.target} seed", TYPED_PROTOCOL)
        x = x[0]
        rows = blocks[-1].num_dst
        if hot is not None:
            h = splice(self.bottom(blocks[0], x), hot.table, hot.index, hot.grad_acc)
            return self._checked(self.module.upper(blocks[1:], h), rows, "upper(blocks, h)")
        if self.form == "blocks":
            return self._checked(self.module(blocks, x), rows, "forward(blocks, x)")
        edge_index, nodes, edges = pyg_form(blocks)
        extra = dict(zip(_TRIM, (nodes, edges))) if self.trims else {}
        out = self.module(x, edge_index, **extra)
        # A row per vertex of x (fewer where the model trims its layers to what the seeds need), seeds first.
        if isinstance(out, torch.Tensor) and out.dim() == 2 and out.shape[0] >= rows:
            out = out[:rows]
        return self._checked(out, rows, "forward(x, edge_index)", "seed, the first rows of x")

    def _checked(self, out, rows: int, call: str, per: str = "seed", protocol: str = PROTOCOL) -> torch.Tensor:
        expected = f"a [{rows}, {self.out_width}] tensor (one row of logits per {per}, one column per output"
        if not isinstance(out, torch.Tensor):
            raise ModelProtocolError(f"{self.kind}.{call} returned {type(out).__name__}; the protocol expects "
                                     f"{expected})")
        if out.dim() != 2 or out.shape[0] != rows or out.shape[1] != self.out_width:
            raise ModelProtocolError(f"{self.kind}.{call} returned shape {list(out.shape)}; the protocol "
                                     f"expects {expected}; {protocol})")
        if self.training and torch.is_grad_enabled() and not out.requires_grad:
            raise ModelProtocolError(f"{self.kind}.{call} returned logits that carry no gradient (requires_grad "
                                     f"False), so the loss cannot reach its parameters; remove the detach(), .data "
                                     f"or torch.no_grad() that cuts them off in forward")
        return out
