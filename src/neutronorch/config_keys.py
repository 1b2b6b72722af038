"""Config files read strictly: a key given twice in one mapping is an error, where JSON and PyYAML would
keep the last one silently (TOML refuses it itself)."""

from __future__ import annotations


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
