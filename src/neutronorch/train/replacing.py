"""Replacing an earlier run's outputs (``overwrite``) without ever losing them before the new run has its own
(docs/checkpoints.md and docs/errors.md say when they are set aside, deleted or put back). Set aside means
renamed into a hidden folder beside them, ``.neutronorch-replaced-PID@HOST-RANDOM/``, which nothing deletes:
a run killed outright leaves it, and the next run into that folder refuses to start over it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
from pathlib import Path
from typing import Iterator

from neutronorch.atomic import host_tag
from neutronorch.config import TrainConfig
from neutronorch.errors import OutputError
from neutronorch.train.output_guard import SET_ASIDE, check_fresh, claim_folder
from neutronorch.train.outputs import CHECKPOINT_FILES, rank_files, run_outputs
from neutronorch.train.table_files import table_folders

logger = logging.getLogger("neutronorch")


def replaced_outputs(config: TrainConfig) -> list[Path]:
    """Every file and folder of an earlier run that ``config``'s run would replace, as they exist now."""
    paths = [path for paths in run_outputs(config).values() for path in paths]
    if config.checkpoint_dir:
        folder = Path(config.checkpoint_dir)
        paths += [p for name in CHECKPOINT_FILES for p in table_folders(folder, Path(name).stem)]
    if config.tensorboard and Path(config.tensorboard).is_dir():
        paths += sorted(p for p in Path(config.tensorboard).glob("events.out.tfevents.*") if p.is_file())
    return [p for p in paths if p.exists() or p.is_symlink()]


class Replacement:
    """The earlier outputs one run replaces: set aside (``set_aside``), then deleted (``replace``) or put back
    (``put_back``). Made with nothing set aside, every method does nothing."""

    def __init__(self, config: TrainConfig | None = None):
        self.config = config
        self.asides: dict[Path, Path] = {}  # folder -> its set-aside folder
        self.done = False

    def set_aside(self) -> None:
        """Move every earlier output ``config`` replaces into a set-aside folder beside it; if one cannot be
        moved, those moved go back and ``OutputError`` says why."""
        moved = []
        try:
            for path in replaced_outputs(self.config):
                folder = path.parent
                if folder not in self.asides:
                    aside = folder / f"{SET_ASIDE}{os.getpid()}@{host_tag()}-{secrets.token_hex(4)}"
                    aside.mkdir()
                    self.asides[folder] = aside
                path.rename(self.asides[folder] / path.name)
                moved.append(path)
        except OSError as exc:
            for path in moved:
                with contextlib.suppress(OSError):
                    (self.asides[path.parent] / path.name).rename(path)
            for aside in self.asides.values():
                with contextlib.suppress(OSError):
                    aside.rmdir()
            self.asides, self.done = {}, True
            raise OutputError(f"`overwrite`: cannot set the earlier run's outputs aside in their folder "
                              f"({exc.strerror or exc}: {exc.filename}); they are kept. Choose a folder you can "
                              f"write to, or new paths for the outputs.") from None
        if self.asides:
            logger.info(f"overwrite: the earlier run's outputs are set aside in "
                        f"{', '.join(map(str, self.asides.values()))} until this run has written its own")

    def replace(self) -> None:
        """Delete the earlier outputs set aside: the run has its own."""
        if self.done:
            return
        self.done = True
        for aside in self.asides.values():
            shutil.rmtree(aside, ignore_errors=True)
            if aside.exists():
                logger.warning(f"overwrite: cannot remove {aside}, the earlier run's outputs this run replaced; "
                               f"delete it by hand")

    def put_back(self) -> bool:
        """Remove what the run wrote in the earlier outputs' place and put those back. Returns whether any
        were."""
        if self.done or not self.asides:
            return False
        self.done = True
        for path in replaced_outputs(self.config):  # now the new run's
            with contextlib.suppress(OSError):
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        for folder, aside in self.asides.items():
            try:
                for path in aside.iterdir():
                    path.rename(folder / path.name)
                aside.rmdir()
            except OSError as exc:
                logger.error(f"overwrite: cannot put the earlier run's outputs back from {aside} "
                             f"({exc.strerror or exc}); move them into {folder} by hand")
        logger.warning(f"overwrite: the run ended before it wrote its own outputs: the earlier run's outputs in "
                       f"{', '.join(map(str, self.asides))} are back as they were, and this run's are removed")
        return True


@contextlib.contextmanager
def claim_outputs(config: TrainConfig, writes: bool = True) -> Iterator[Replacement]:
    """For the run's life: hold ``checkpoint_dir`` (another run into it is refused while this one lasts),
    check again under the lock that it holds no earlier run's checkpoints unless ``resume`` continues them or
    ``overwrite`` replaces them, and with ``overwrite`` set the earlier outputs aside (the module's
    docstring: replaced at the run's first checkpoint or its end, put back if it fails before). ``writes``:
    this process writes the outputs (rank 0 of data-parallel ranks)."""
    replacement = Replacement(config)
    with contextlib.ExitStack() as stack:
        if writes and config.checkpoint_dir:
            folder = stack.enter_context(claim_folder("checkpoint_dir", config.checkpoint_dir))
            check_fresh({"checkpoint_dir": [folder / name for name in CHECKPOINT_FILES] + rank_files(folder)},
                        config.overwrite, config.resume)
        try:
            if writes and config.overwrite and not config.resume:
                replacement.set_aside()
            yield replacement
        except BaseException as exc:
            if replacement.put_back():
                with contextlib.suppress(AttributeError):  # the command line says the earlier results are kept
                    exc.earlier_kept = True
            raise
        replacement.replace()
