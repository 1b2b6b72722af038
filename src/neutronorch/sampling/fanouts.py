"""Fanouts as the command line and config files give them (no torch: the command line imports this)."""

from __future__ import annotations

from neutronorch.errors import ConfigError

FANOUT_MAX = 2**31 - 1  # the samplers count a vertex's neighbours in 32 bits


def parse_fanouts(text: str | list[int] | tuple[int, ...], field: str = "fanouts", whose: str = "",
                  none: bool = False) -> list[int]:
    """``"15,10,5"`` -> [15, 10, 5] (seed hop first). ``-1`` means all neighbours; with ``none`` (a typed
    graph's relation), ``0`` means none. Errors name ``field`` and, where given, ``whose`` list it is."""
    label = f"`{field}`" + (f" for {whose}" if whose else "")
    items = text.split(",") if isinstance(text, str) else text
    try:
        if isinstance(items, (dict, set)) or any(isinstance(f, (bool, float)) for f in items):
            raise TypeError
        fanouts = [int(f) for f in items]
    except (TypeError, ValueError):
        raise ConfigError(f"{label} {text!r}: not a list of integers such as 15,10,5.") from None
    if not fanouts or any(f < -1 or (f == 0 and not none) for f in fanouts):
        raise ConfigError(f"{label} {text!r}: give one fanout per layer, seed hop first (e.g. 15,10,5), each a "
                          f"positive integer, -1 for all neighbours" + (" or 0 for none." if none else "."))
    if any(f > FANOUT_MAX for f in fanouts):
        raise ConfigError(f"{label} {text!r}: a fanout above {FANOUT_MAX} is more neighbours than a vertex can "
                          f"have (degrees are 32-bit); give -1 to take all neighbours.")
    return fanouts
