"""Your own module in a typed run (``train(config, graph=typed, model=module)``): the settings it trains with,
checked before any work, and the module adapted (``nn/custom.py``'s ``UserModel``).

It trains in exact and device mode, with the built-in models' optimizers (Adam for its dense parameters,
``RowAdam`` or ``SparseAdam`` for its sparse ``nn.Embedding`` tables), evaluation and logs. Refused, each with
a ``ConfigError`` saying why:

- NeutronOrch mode: it computes hot vertices' bottom layer apart, with a copy of a ``TypedGNN``'s bottom layer
  and snapshots of the embedding rows it reads, parts a module of one's own does not expose.
- Checkpoints (``checkpoint_dir``, and so ``checkpoint_every`` and ``resume``): a typed checkpoint rebuilds its
  model from ``TypedGNN``'s arguments; one of your module would need your module to load into, which typed
  checkpoints, their resume and ``predict`` do not take yet. Save ``module.state_dict()`` after ``train()``.
- ``embedding_storage`` mmap: it places the built-in models' tables in files; your module's tables are its own
  (``auto`` keeps none of them: no table of a built-in model is made).
"""

from __future__ import annotations

import dataclasses

import torch

from neutronorch.capabilities import OWN_MODULE_REFUSED
from neutronorch.config import TrainConfig
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import ConfigError
from neutronorch.nn.custom import ModelProtocolError, UserModel, check_trainable

__all__ = ["check_own_model_config", "own_typed_model"]


def check_own_model_config(config: TrainConfig) -> None:
    """Raise ``ConfigError`` for a setting your own module cannot train a typed graph with (before any work)."""
    refused = [
        (("typed", config.mode) in OWN_MODULE_REFUSED, OWN_MODULE_REFUSED.get(("typed", config.mode))),
        (bool(config.checkpoint_dir),
         "`checkpoint_dir`: checkpoints of your own module in a typed run are not written yet (a typed checkpoint "
         "rebuilds a built-in model from its arguments; yours needs your module to load into). Leave "
         "`checkpoint_dir`, `checkpoint_every` and `resume` out, and save module.state_dict() after train()."),
        (config.embedding_storage not in ("auto", "memory"),
         f"`embedding_storage` {config.embedding_storage}: it places the built-in models' embedding tables; your "
         f"module's tables are its own. Leave `embedding_storage` out."),
    ]
    for bad, message in refused:
        if bad:
            raise ConfigError(f"{message} docs/heterogeneous.md, 'Your own module'.")


def own_typed_model(module: torch.nn.Module | None, config: TrainConfig, graph: TypedGraph, num_layers: int,
                    device: torch.device) -> tuple[UserModel | None, TrainConfig]:
    """``module`` adapted for ``graph``'s run and moved to ``device``, after ``check_own_model_config``, and
    ``config`` with no built-in model's tables to plan (``embedding_storage`` memory); None and ``config`` as
    it is without a module (the built-in ``config.model`` trains)."""
    if module is None:
        return None, config
    check_own_model_config(config)
    try:
        model = UserModel(module, num_layers, graph.num_classes, graph.target)
        check_trainable(module, model.kind, sparse_tables=True)  # RowAdam or SparseAdam moves sparse tables
    except ModelProtocolError as exc:
        raise ConfigError(f"`model`: {exc}.") from None
    return model.to(device), dataclasses.replace(config, embedding_storage="memory")
