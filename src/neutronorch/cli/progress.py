"""The command line's progress bar."""

from __future__ import annotations

import sys

from tqdm import tqdm


class ProgressBar:
    """A tqdm bar per part (epoch, layer of inference, file being parsed), fed by ``progress(part, done,
    total)``; hidden when stderr is no terminal. Training also reports ``loss`` and ``evaluating``."""

    def __init__(self, label: str = "epoch", unit: str = "batch"):
        self._bar, self._part = None, None
        self._label, self._unit = label, unit
        self._loss: tuple | None = None  # (epoch, running mean loss) last reported

    def __call__(self, part, done: int, total: int) -> None:
        loss = f"loss {self._loss[1]:.4f}" if self._loss is not None and self._loss[0] == part else None
        # A resumed epoch starts at its step: the bar's rate counts only the steps run here.
        self._update(part, f"{self._label} {part}", self._unit, done, total,
                     initial=done - 1 if self._unit == "batch" else 0, postfix=loss)

    def loss(self, epoch: int, mean: float) -> None:
        self._loss = (epoch, mean)

    def evaluating(self, epoch: int, layer: int, done: int, total: int) -> None:
        what = f"evaluating after epoch {epoch}" + (f", layer {layer}" if layer else "")
        self._update(("evaluation", epoch, layer), what, "vertex", done, total, initial=0)

    def _update(self, part, desc: str, unit: str, done: int, total: int, initial: int, postfix=None) -> None:
        if self._bar is None or part != self._part:
            self.close()
            self._part = part
            self._bar = tqdm(total=total, desc=desc, unit=unit, leave=False, disable=None, file=sys.stderr,
                             initial=initial, unit_scale=unit != "batch")
        if postfix is not None:
            self._bar.set_postfix_str(postfix, refresh=False)
        self._bar.update(done - self._bar.n)
        if done >= total:
            self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
