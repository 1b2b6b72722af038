"""Says, once per process, that numba is compiling neutronorch's kernels.

The kernels are compiled on their first call and cached on disk (``cache=True``: in ``__pycache__`` beside
their module, or under ``NUMBA_CACHE_DIR``), so the first run on a machine spends tens of seconds in its
first epoch that later runs read from the cache in well under a second. numba fires its ``numba:compile``
event only when it compiles, never when it loads a cached kernel, so a listener on that event says so
exactly when the cache is cold, before the first compilation, and costs nothing otherwise.

Importing this module registers the listener (``sampling/kernels.py`` does); it imports nothing of ours.
"""

from __future__ import annotations

import logging
import threading

from numba.core import event

MESSAGE = "compiling the sampling and layer kernels with numba (first run only, cached afterwards)..."
PREFIX = "neutronorch."  # whose kernels count: those of modules whose names start so


class FirstCompile(event.Listener):
    """Logs ``MESSAGE`` through the ``neutronorch`` logger when numba starts compiling a kernel of ours
    (``PREFIX``) for the first time in this process; other packages' numba functions are ignored."""

    def __init__(self):
        self._unsaid = threading.Lock()  # taken, never released, by the one call that says it

    def on_start(self, ev) -> None:
        dispatcher = (ev.data or {}).get("dispatcher")
        module = getattr(getattr(dispatcher, "py_func", None), "__module__", None) or ""
        if module.startswith(PREFIX) and self._unsaid.acquire(blocking=False):
            logging.getLogger("neutronorch").info(MESSAGE)

    def on_end(self, ev) -> None:
        pass


LISTENER = FirstCompile()
event.register("numba:compile", LISTENER)
