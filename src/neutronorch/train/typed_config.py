"""What a typed graph cannot train with yet: ``check_typed_config`` refuses each such setting with a
``ConfigError`` that says so, before anything is loaded or trained."""

from __future__ import annotations

from neutronorch.config import TYPED_MODE_CHOICES, TrainConfig
from neutronorch.errors import ConfigError
from neutronorch.nn.names import TYPED_MODELS
from neutronorch.orchestration.factory import TYPED_DATA_PARALLEL_MODES
from neutronorch.train.typed_distributed import world_size

NOT_YET = "not available for typed graphs yet"
# Settings of homogeneous runs' placement and NeutronOrch tuning that typed runs do not read yet.
HOMOGENEOUS_ONLY = ("hot_error_budget", "hot_set", "device_sampling", "gpu_cache_gb", "cache_policy", "read_order",
                    "host_cache_gb", "host_cache_dir")
TYPED_ONLY = ("embedding_storage", "embedding_dir")  # where a typed graph's embedding tables live


def check_typed_config(config: TrainConfig) -> None:
    """Raise ``ConfigError`` for the first setting a typed graph cannot train with yet; ``config`` validated."""
    ignored = config.settings_given(HOMOGENEOUS_ONLY)
    them = "it" if len(ignored) == 1 else "them"
    refused = [
        (config.mode not in TYPED_MODE_CHOICES,
         f"`mode` {config.mode}: {NOT_YET}; give `mode` {', '.join(TYPED_MODE_CHOICES)} (auto picks exact)."),
        (config.task != "node", f"`task` {config.task}: {NOT_YET}; typed graphs train node classifiers."),
        (bool(config.link_settings_given()), f"{', '.join(config.link_settings_given())}: link task settings, and "
                                             f"typed graphs train node classifiers; leave them out."),
        (bool(ignored), f"{', '.join(ignored)}: {NOT_YET} (a typed run would ignore {them}); leave {them} out."),
        (config.model not in TYPED_MODELS,
         f"`model` {config.model}: {NOT_YET}; choose one of {', '.join(TYPED_MODELS)}."),
        (config.architecture != "plain" or config.residual or config.norm != "none",
         f"`architecture` blocks, `residual` and `norm` are {NOT_YET}; leave them at their defaults."),
        (config.split is not None,
         f"`split` {config.split}: a typed graph carries its own split on its target type; leave `split` out."),
        (config.mode not in TYPED_DATA_PARALLEL_MODES and world_size() > 1,
         f"`mode` {config.mode} on several ranks (data-parallel training) is {NOT_YET}: NeutronOrch mode's hot sets "
         f"per rank and its hot rows' gradient averaged over the ranks are missing. Give `mode` "
         f"{' or '.join(TYPED_DATA_PARALLEL_MODES[1:])}, which train data parallel, or run one process."),
    ]
    for bad, message in refused:
        if bad:
            raise ConfigError(f"{message} docs/heterogeneous.md says what typed graphs train with.")


def check_homogeneous_config(config: TrainConfig) -> None:
    """Refuse, on a graph of one vertex type, the settings only typed graphs use (a run would ignore them)."""
    given = config.settings_given(TYPED_ONLY)
    if given:
        raise ConfigError(f"{', '.join(given)}: where a typed graph keeps its featureless types' embedding tables, "
                          f"and this graph has one vertex type and no tables; leave {'it' if len(given) == 1 else 'them'}"
                          f" out.")
