"""Config files read strictly: a key given twice in one mapping is an error, where JSON and PyYAML would
keep the last one silently (TOML refuses it itself); numbers that a YAML 1.1 parser (PyYAML) reads as text."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from neutronorch.errors import ConfigError, not_a_file


class RepeatedKey(Exception):
    """A key given twice in one mapping of a config file."""


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
    """The mapping a YAML, TOML or JSON config file holds (by its suffix; YAML otherwise), read strictly, or a
    ``ConfigError`` saying what is wrong with the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {path}: {not_a_file(path, 'no such file')}.")
    try:
        text = path.read_text()
    except PermissionError:
        raise ConfigError(f"cannot read --config {path}: permission denied; give the user running neutronorch "
                          f"read access to it.") from None
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
    """A parser's error on one line: YAML's names the problem and where (its own message quotes the line and
    points at it on lines below), any other's whitespace is collapsed."""
    mark = getattr(exc, "problem_mark", None)
    if getattr(exc, "problem", None) and mark is not None:
        context = f"{exc.context}, " if getattr(exc, "context", None) else ""
        return f"{context}{exc.problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(exc).split())


def float_text(value):
    """A float setting's value as a config file gave it: text that reads as a finite number becomes that
    number (PyYAML reads ``1e-3``, without a dot, as a string); anything else is left for ``validate`` to name."""
    if not isinstance(value, str):
        return value
    try:
        number = float(value)
    except ValueError:
        return value
    return number if math.isfinite(number) else value


def number_hint(value: str, want: type) -> str:
    """For a number written as text where ``want`` (int or float) is expected: how to write it as a number."""
    try:
        number = float(value)
    except ValueError:
        return ""
    if not math.isfinite(number):
        return ""
    if want is int:
        return (f"; write it with digits only ({int(number)}), which every config file reads as a number"
                if number.is_integer() else "")
    return f"; give it as a number ({value.strip()}, not quoted)"
