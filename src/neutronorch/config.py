"""Training configuration: one dataclass, validated once at the edge (CLI, config file or API).

The core trusts a ``TrainConfig`` that passed ``validate``; it never re-checks arguments.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from neutronorch.errors import ConfigError
from neutronorch.nn.models import MODELS
from neutronorch.sampling.neighbor_sampler import parse_fanouts

MODES = ("exact",)
DEVICES = ("auto", "cpu", "cuda")


@dataclass
class TrainConfig:
    dataset: str = "synthetic"
    split: str | None = None
    model: str = "sage"
    fanouts: list[int] = field(default_factory=lambda: [10, 10])
    hidden: int = 256
    heads: int = 4
    batch_size: int = 0  # 0: auto_batch_size(number of training seeds)
    epochs: int = 50
    lr: float = 0.003
    weight_decay: float = 5e-3
    dropout: float = 0.7
    seed: int = 0
    device: str = "auto"
    mode: str = "exact"
    eval_every: int = 1
    eval_fanouts: list[int] | None = None
    eval_batch_size: int = 4096
    prefetch: int = 2
    threads: int = 0
    sampler_threads: int = 0
    summary_json: str | None = None
    progress: bool = True

    def validate(self) -> "TrainConfig":
        """Normalise and check every field; raise ``ConfigError`` saying how to fix the first problem."""
        self.fanouts = parse_fanouts(self.fanouts)
        if self.eval_fanouts is not None:
            self.eval_fanouts = parse_fanouts(self.eval_fanouts)
            if len(self.eval_fanouts) != len(self.fanouts):
                raise ConfigError(f"--eval-fanouts has {len(self.eval_fanouts)} entries but the model has "
                                  f"{len(self.fanouts)} layers (one per --fanouts entry).")
        checks = [
            (self.model in MODELS, f"--model {self.model!r}: choose one of {', '.join(MODELS)}."),
            (self.mode in MODES, f"--mode {self.mode!r}: choose one of {', '.join(MODES)}."),
            (self.device in DEVICES, f"--device {self.device!r}: choose one of {', '.join(DEVICES)}."),
            (self.batch_size >= 0, f"--batch-size {self.batch_size}: must be a positive number of seeds "
                                   f"(or 0 to choose from the training-set size)."),
            (self.eval_batch_size >= 1, f"--eval-batch-size {self.eval_batch_size}: must be positive."),
            (self.hidden >= 1, f"--hidden {self.hidden}: must be positive."),
            (self.heads >= 1, f"--heads {self.heads}: must be positive."),
            (self.model != "gat" or self.hidden % self.heads == 0,
             f"--hidden {self.hidden} is not divisible by --heads {self.heads}; GAT splits the hidden width "
             f"evenly across heads."),
            (self.epochs >= 0, f"--epochs {self.epochs}: must be zero or more."),
            (self.lr > 0, f"--lr {self.lr}: must be positive."),
            (self.weight_decay >= 0, f"--weight-decay {self.weight_decay}: must be zero or more."),
            (0 <= self.dropout < 1, f"--dropout {self.dropout}: must be in [0, 1)."),
            (self.eval_every >= 0, f"--eval-every {self.eval_every}: must be zero (end only) or more."),
            (self.prefetch >= 1, f"--prefetch {self.prefetch}: must be at least 1."),
            (self.threads >= 0 and self.sampler_threads >= 0, "--threads/--sampler-threads must be >= 0 "
             "(0 picks automatically)."),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def auto_batch_size(num_train: int) -> int:
    """Seeds per mini-batch when none is given: about 32 optimizer steps per epoch on small training sets
    (140 Cora seeds in one batch learn far too slowly), never below 32 nor above 1024 seeds."""
    return min(1024, max(32, num_train // 32))


def load_config_file(path: str | os.PathLike) -> dict:
    """Read a YAML, TOML or JSON file whose keys are ``TrainConfig`` fields (dashes or underscores)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file.")
    text = path.read_text()
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            import tomllib
            data = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            import yaml
            data = yaml.safe_load(text) or {}
    except Exception as exc:  # noqa: BLE001 - every parser error becomes one clear message
        raise ConfigError(f"--config {path}: cannot be parsed ({exc}).") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of option names to values.")
    known = set(TrainConfig.keys())
    out = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in known:
            raise ConfigError(f"--config {path}: unknown key {key!r}. Known keys: {', '.join(sorted(known))}.")
        out[name] = value
    return out
