"""Config files: their keys mapped onto ``TrainConfig``'s settings (``load_config_file``), read strictly: a key
given twice in one mapping is an error, where JSON and PyYAML would keep the last one silently."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from neutronorch.config import TrainConfig, check_types, setting_fields, value_type
from neutronorch.errors import ConfigError, not_a_file, permission_message


# Other programs' names of settings (PyG's, DGL's examples, common scripts): said as a hint, never accepted.
ALIASES = {"learning_rate": "lr", "num_epochs": "epochs", "epoch": "epochs", "hidden_dim": "hidden",
           "hidden_channels": "hidden", "hidden_size": "hidden", "num_layers": "layers", "num_neighbors": "fanouts",
           "fanout": "fanouts", "neighbors": "fanouts", "batchsize": "batch_size", "wd": "weight_decay",
           "data": "dataset", "num_workers": "sampler_threads", "workers": "sampler_threads"}


def did_you_mean(name: str, known) -> str:
    """``"; did you mean X?"`` for a misspelt or another program's setting ``name`` (underscores or dashes as
    ``name`` has them), or ""."""
    import difflib

    plain = name.replace("-", "_")
    match = ALIASES.get(plain) if ALIASES.get(plain) in known else None
    match = match or next(iter(difflib.get_close_matches(plain, list(known), n=1, cutoff=0.75)), None)
    if match is None:
        return ""
    return f"; did you mean {match.replace('_', '-') if '-' in name else match}?"


class RepeatedKey(Exception):
    pass


def unique_keys(pairs):
    keys = [key for key, _ in pairs]
    for key in keys:
        if keys.count(key) > 1:
            raise RepeatedKey(repr(key))
    return dict(pairs)


def load_yaml(text: str):
    """YAML through ``safe_load``'s loader, except that a repeated key is an error (PyYAML keeps the last)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            self.flatten_mapping(node)
            unique_keys([(self.construct_object(key, deep=deep), None) for key, _ in node.value])
            return super().construct_mapping(node, deep=deep)

    return yaml.load(text, Loader=UniqueKeyLoader) or {}


def read_config_mapping(path: str | os.PathLike) -> dict:
    """The mapping a YAML, TOML or JSON config file holds (by its suffix; YAML otherwise)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {path}: {not_a_file(path, 'no such file')}.")
    try:
        text = path.read_text()
    except PermissionError:
        raise ConfigError(permission_message(f"--config {path}")) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path}: cannot be read ({exc}); give a UTF-8 text file.") from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            try:
                import tomllib
            except ImportError:  # Python 3.10: the same parser as a package (a dependency there)
                import tomli as tomllib
            data = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text, object_pairs_hook=unique_keys)
        else:
            data = load_yaml(text)
    except RepeatedKey as exc:
        raise ConfigError(f"--config {path}: gives {exc} more than once; the parser would keep only one of them. "
                          f"Say each option once.") from None
    except Exception as exc:  # noqa: BLE001 - every parser error becomes one clear message
        raise ConfigError(f"--config {path}: cannot be parsed ({_one_line(exc)}).") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of option names to values.")
    return data


def _one_line(exc: Exception) -> str:
    """A parser's error on one line (YAML's own message quotes the line and points at it on lines below)."""
    mark = getattr(exc, "problem_mark", None)
    if getattr(exc, "problem", None) and mark is not None:
        context = f"{exc.context}, " if getattr(exc, "context", None) else ""
        return f"{context}{exc.problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(exc).split())


def float_text(value):
    """Text that reads as a finite number, as that number (PyYAML reads ``1e-3`` as text); else ``value``."""
    if not isinstance(value, str):
        return value
    try:
        number = float(value)
    except ValueError:
        return value
    return number if math.isfinite(number) else value


def load_config_file(path: str | os.PathLike, extra: dict[str, str] | None = None) -> dict:
    """The settings a YAML, TOML or JSON file gives, by name (its rules: README.md, docs/errors.md);
    ``extra``: keys of the caller's own, each with its section (the command line's ``run_name``: outputs)."""
    data = read_config_mapping(path)
    extra = extra or {}
    known = set(TrainConfig.keys()) | set(extra)
    sections = TrainConfig.sections()
    home = {name: part for part, names in sections.items() for name in names} | extra
    floats = {f.name for f in setting_fields() if value_type(f) is float}
    negated_keys = {f"no_{f.name}" for f in setting_fields() if f.default is True} | {"no_save"}
    flat = []  # (key as written, value, section or None)
    for key, value in data.items():
        if str(key) in sections and (isinstance(value, dict) or value is None):
            flat.extend((inner, inner_value, str(key)) for inner, inner_value in (value or {}).items())
        elif str(key) in sections:
            raise ConfigError(f"--config {path}: {key!r} is a section, not a setting: give its settings under it "
                              f"({', '.join(sections[str(key)][:3])}, ...), not {value!r}.")
        else:
            flat.append((key, value, None))
    out, seen = {}, set()
    for key, value, section in flat:
        name = str(key).replace("-", "_")
        negated = name in negated_keys  # the switches' spelling: --no-progress, ...
        name = name[3:] if negated else name
        if name not in known:
            raise ConfigError(f"--config {path}: unknown key {key!r}{did_you_mean(str(key), known) or '.'} Known keys: "
                              f"{', '.join(sorted(known))}. Sections: {', '.join(sections)}.")
        if section is not None and home.get(name) != section:
            where = f"under [{home[name]}] (or at the top level)" if name in home else "at the top level"
            raise ConfigError(f"--config {path}: {key!r} is under [{section}], but belongs {where}.")
        if name in seen:  # batch-size and batch_size, or progress and no-progress: which one would be meant?
            raise ConfigError(f"--config {path}: {key!r} sets `{name}`, which an earlier key sets too; give it once.")
        seen.add(name)
        if value is None:
            continue  # null: the default
        if negated and not isinstance(value, bool):
            raise ConfigError(f"--config {path}: {key!r} {value!r}: expected true or false.")
        out[name] = float_text(value) if name in floats else (not value if negated else value)
    check_types(TrainConfig(**{k: v for k, v in out.items() if k not in extra}))  # one a flag replaces too
    return out
