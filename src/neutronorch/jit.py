"""Says, once per process, that numba is compiling neutronorch's kernels (the first run on a machine spends
tens of seconds on it; later runs read them from numba's disk cache). numba fires ``numba:compile`` only
when it compiles, never for a cached kernel, so the listener speaks exactly when the cache is cold.
Importing this module registers it; it imports nothing of ours.

``read_only`` gives the kernels one type of an array they only read, whether it is mapped from a file or held
in memory: numba compiles a kernel once per type of its arguments, and read-only is part of an array's type."""

from __future__ import annotations

import logging
import threading

import numpy as np
from numba.core import event

MESSAGE = "compiling the sampling and layer kernels with numba (first run only, cached afterwards)..."
PREFIX = "neutronorch."  # whose kernels count: those of modules whose names start so


class FirstCompile(event.Listener):
    """Logs ``MESSAGE`` when numba first starts compiling a kernel of ours (``PREFIX``) in this process."""

    def __init__(self):
        self._unsaid = threading.Lock()  # taken, never released, by the one call that says it

    def on_start(self, ev) -> None:
        dispatcher = (ev.data or {}).get("dispatcher")
        module = getattr(getattr(dispatcher, "py_func", None), "__module__", None) or ""
        if module.startswith(PREFIX) and self._unsaid.acquire(blocking=False):
            logging.getLogger("neutronorch").info(MESSAGE)

    def on_end(self, ev) -> None:
        pass


event.register("numba:compile", FirstCompile())


def read_only(array: np.ndarray | None) -> np.ndarray | None:
    """``array`` as a read-only view (itself when it already is, or None): what a kernel only reads is passed
    read-only wherever it comes from. A file's memory map is read-only, an array built in memory is not, and
    numba would compile each kernel (seconds each) once for either. No copy is made."""
    if array is None or not array.flags.writeable:
        return array
    view = array.view()
    view.flags.writeable = False
    return view
