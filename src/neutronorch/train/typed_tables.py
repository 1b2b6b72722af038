"""Where a typed run's embedding tables live (``embedding_storage``: memory, mmap or auto; what each does
and where the files go: docs/heterogeneous.md, Embedding tables in files). A table's files are deleted as
soon as they are open, so a run leaves none behind however it ends; ``plan_tables`` checks their folder
before any work.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from neutronorch.atomic import existing_ancestor, make_folder, remove_made, reserve, write_error
from neutronorch.config import TrainConfig
from neutronorch.data import dataset_paths
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import ConfigError, OutputError
from neutronorch.features.memory import available_memory_bytes
from neutronorch.nn.typed_models import TypedSpec, table_shapes
from neutronorch.train.output_guard import check_creatable, check_distinct, check_space, size_text
from neutronorch.train.table_files import CHECKPOINT_COPIES, check_table_folders

logger = logging.getLogger("neutronorch")

MEMORY, MMAP = "memory", "mmap"
PARTS = ("weight", "exp_avg", "exp_avg_sq")  # a table's files: its weights and RowAdam's two moments
COMFORT = 0.5  # auto keeps the tables in memory while they take at most this share of the memory available
CHUNK_BYTES = 64 << 20  # drawn into a file this much at a time


class TypedTables:
    """A typed run's tables: where they live (``storage``, and ``reason``), their shapes per type
    (``table_shapes``), and for ``mmap`` the folder of their files, open while the run lasts (a context
    manager). ``maker`` is what ``TypedGNN`` takes as ``tables``, ``moments`` what ``RowAdam`` takes."""

    def __init__(self, storage: str, reason: str, shapes: dict[str, tuple[int, int]], folder: Path | None = None,
                 fill: bool = True):
        self.storage, self.reason, self.shapes, self.folder = storage, reason, shapes, folder
        self.fill = fill  # draw the weights (a resumed run copies them from its checkpoint instead)
        self.arrays: dict[str, dict[str, np.ndarray]] = {}  # mapped tables: type -> part -> its memory map
        self.fds: dict[tuple[str, str], int] = {}  # (type, part) -> its file, open for reading (deleted)
        self.written: tuple | None = None  # the files last written for a checkpoint (table_files.py)
        self.draw_seconds = 0.0
        self.made: list[Path] = []  # the folders made for the files (the table folder and its missing parents)
        self.nbytes = len(PARTS) * 4 * sum(rows * width for rows, width in shapes.values())  # with both moments

    @property
    def maker(self):
        """``TypedGNN``'s ``tables``: None for tables in memory."""
        return self.table if self.storage == MMAP else None

    def __enter__(self) -> "TypedTables":
        if self.storage == MMAP and self.shapes and not self.folder.exists():
            try:
                self.made = make_folder(self.folder)  # and its missing parents, all removed on leaving
            except OSError as exc:
                raise OutputError(f"`embedding_dir` {self.folder}: cannot be made ({exc.strerror or exc}). Choose "
                                  f"a folder you can write to.") from None
        return self

    def __exit__(self, *exc) -> None:
        """Close the files (their mappings live on while tensors use them; the disk space goes with them)."""
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        remove_made(self.made)  # the folders made for the tables, kept where anything else is there
        self.made = []

    def table(self, node_type: str, rows: int, width: int) -> torch.Tensor | None:
        """``node_type``'s table weights in a file of their own, with files for its two moments (zeros); the
        weights drawn as ``nn.Embedding`` draws them, unless the run resumes. None (in memory) when empty."""
        if rows * width == 0:
            return None
        arrays = {part: self._file(node_type, part, rows, width) for part in PARTS}
        self.arrays[node_type] = arrays
        weight = torch.from_numpy(arrays["weight"])
        if self.fill:
            started = time.perf_counter()
            draw_like_embedding(weight)
            self.draw_seconds += time.perf_counter() - started
        return weight

    def moments(self, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``RowAdam``'s two moments of a memory-mapped table (None for one in memory)."""
        for arrays in self.arrays.values():
            if arrays["weight"].ctypes.data == table.data_ptr():
                return torch.from_numpy(arrays["exp_avg"]), torch.from_numpy(arrays["exp_avg_sq"])
        return None

    def summary(self) -> dict:
        """What the run summary says of the tables."""
        return {"storage": self.storage, "reason": self.reason,
                "tables": {t: list(shape) for t, shape in self.shapes.items()},
                "gib": round(self.nbytes / 2**30, 4), "folder": str(self.folder) if self.folder else None,
                "draw_seconds": round(self.draw_seconds, 3)}

    def _file(self, node_type: str, part: str, rows: int, width: int) -> np.ndarray:
        """A new float32 ``.npy`` file of (rows, width) zeros in ``folder``, its blocks reserved, memory-mapped
        and deleted at once (an open descriptor is kept for copying it into checkpoints)."""
        name = None
        try:
            fd, name = tempfile.mkstemp(prefix=f".neutronorch-table-{node_type}.{part}-", suffix=".npy",
                                        dir=self.folder)
            os.close(fd)
            array = np.lib.format.open_memmap(name, mode="w+", dtype=np.float32, shape=(rows, width))
            reserve(name)  # a disk that fills up later would kill the run with SIGBUS on a page's first write
            self.fds[(node_type, part)] = os.open(name, os.O_RDONLY)
        except OSError as exc:
            raise write_error(self.folder / f"{node_type}.{part}.npy", exc, False) from exc  # no temporary name
        finally:
            if name is not None:
                Path(name).unlink(missing_ok=True)
        return array


def draw_like_embedding(weight: torch.Tensor) -> None:
    """Fill a (rows, width) float32 table in place with what ``nn.Embedding`` draws for it (``normal_``: the
    global generator, mean 0, std 1), a chunk of rows at a time. torch draws a contiguous float tensor of at
    least 16 values as one uniform per value, then turns each run of 16 into normals (Box-Muller), and the
    last 16 values again from 16 more uniforms when the count is not a multiple of 16: chunks of a multiple
    of 16 values, the last of at least 16, draw exactly what one call draws, and leave the generator where it
    leaves it."""
    for start, end in drawn_chunks(*weight.shape):
        weight[start:end].normal_()


def drawn_chunks(rows: int, width: int):
    """The (start, end) rows of each chunk ``draw_like_embedding`` draws a (rows, width) table in."""
    step = max(16, (CHUNK_BYTES // max(1, 4 * width)) // 16 * 16)  # rows: a multiple of 16 values
    start = 0
    while start < rows:
        end = rows if rows - start < 2 * step else start + step  # the last chunk: at least `step` rows
        yield start, end
        start = end


def plan_tables(config: TrainConfig, graph: TypedGraph, num_layers: int, embed_dim: int | None,
                device: torch.device, available: int | None = None) -> TypedTables:
    """Where a typed run's tables will live, every check passed before any work: the storage
    (``embedding_storage``; ``auto`` weighs the tables and moments against half of ``available`` bytes,
    default the memory available now), and for ``mmap`` the folder, checked not to be a file or inside an
    input's folder, to be writable, and its disk to have room. ``graph``: with its reverse relations."""
    shapes = table_shapes(config.model, TypedSpec.of(graph), config.hidden, num_layers, embed_dim)
    check_table_folders(config)
    need = len(PARTS) * 4 * sum(rows * width for rows, width in shapes.values())
    storage, reason = _storage(config, shapes, need, device, available)
    folder = _folder(config, graph, need) if storage == MMAP and shapes else None
    if shapes:
        logger.info(f"embedding tables: {len(shapes)} table(s), {sum(r for r, _ in shapes.values()):,} rows, "
                    f"{size_text(need)} with both moments, {f'memory-mapped in {folder}' if folder else 'in memory'} "
                    f"({reason})")
    return TypedTables(storage, reason, shapes, folder, fill=not config.resume)


def _storage(config: TrainConfig, shapes: dict, need: int, device: torch.device, available: int | None
             ) -> tuple[str, str]:
    """The storage the setting resolves to, and why."""
    chosen = config.embedding_storage
    if chosen == MMAP and device.type != "cpu":
        raise ConfigError(f"`embedding_storage` mmap: memory-mapped tables live on the host, and this run trains "
                          f"on {device}, where the tables would be copied; give `device` cpu, or `embedding_storage` "
                          f"memory or auto.")
    if chosen != "auto":
        return chosen, f"embedding_storage {chosen}"
    if not shapes:
        return MEMORY, "auto: no featureless type, no table"
    if device.type != "cpu":
        return MEMORY, f"auto: the tables train on {device}"
    available = available_memory_bytes() if available is None else available
    if available is None:
        return MEMORY, "auto: the memory available is unknown"
    fits = need <= COMFORT * available
    return (MEMORY if fits else MMAP), (f"auto: {size_text(need)} of tables and moments "
                                        f"{'within' if fits else 'above'} half the {size_text(available)} of memory "
                                        f"available")


def _folder(config: TrainConfig, graph: TypedGraph, need: int) -> Path:
    """The folder for the tables' files: ``embedding_dir``, or the first of ``checkpoint_dir`` and the temporary
    folder whose disk has room; checked."""
    checkpoints = need * CHECKPOINT_COPIES if config.checkpoint_dir else 0
    given = config.embedding_dir
    candidates = [Path(given or config.checkpoint_dir).expanduser()] if given or config.checkpoint_dir else []
    candidates += [] if given else [Path(tempfile.gettempdir())]
    files = graph.files()
    reads = {"dataset": dataset_paths(config.dataset),
             "graph": files + sorted({str(Path(f).parent) for f in files})}
    refused = []
    for folder in candidates:
        try:
            if folder.exists() and not folder.is_dir():
                raise ConfigError(f"`embedding_dir` {folder}: exists and is not a folder; give a folder for "
                                  f"the tables' files.")
            check_distinct(reads, {"embedding_dir": [folder / ".neutronorch-tables"]})
            check_creatable("embedding_dir", folder / ".neutronorch-tables")
            # The tables' files, and the checkpoints' copies where they share its disk, fit on it.
            same = checkpoints and _device(folder) == _device(Path(config.checkpoint_dir).expanduser())
            check_space("embedding_dir", folder, need + (checkpoints if same else 0))
            if checkpoints and not same:
                check_space("checkpoint_dir", config.checkpoint_dir, checkpoints)
        except (ConfigError, OutputError) as exc:
            if given:
                raise
            refused.append(str(exc))
            continue
        return folder
    raise OutputError(f"`embedding_storage` mmap: no folder takes the tables' files ({size_text(need)}): "
                      f"{' '.join(refused)} Give `embedding_dir` on a disk with room, or `embedding_storage` "
                      f"memory.")


def _device(path: Path) -> int | None:
    try:
        return os.stat(existing_ancestor(path.absolute())).st_dev
    except OSError:
        return None
