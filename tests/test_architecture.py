"""The house rules of docs/architecture.md, checked on the source: layering, no cycles, sizes, no prints."""

import ast
from pathlib import Path

import pytest

from neutronorch.observe import StageTable
from neutronorch.orchestration.loading import DeviceMode, ExactMode
from neutronorch.orchestration.mode import Mode
from neutronorch.orchestration.neutronorch import NeutronOrchMode
from neutronorch.train.part_mode import PartitionedMode

SRC = Path(__file__).resolve().parents[1] / "src" / "neutronorch"
MODULES = sorted(p for p in SRC.rglob("*.py"))
MODES = (ExactMode, DeviceMode, NeutronOrchMode, PartitionedMode)  # the last: exact mode's placement on one part

# package -> packages it must never import (docs/architecture.md, "which part may know which")
# The loader (the engine for a loop of one's own) sits beside train: it builds modes as train does, and
# nothing but the public API uses it.
FORBIDDEN = {
    "nn": {"orchestration", "train", "loader", "cli"},
    "sampling": {"nn", "orchestration", "train", "loader", "cli"},
    "data": {"nn", "orchestration", "train", "loader", "cli"},
    "features": {"orchestration", "train", "loader", "cli"},
    "orchestration": {"train", "loader", "cli"},
    "config": {"train", "orchestration", "loader", "cli"},
    "capabilities": {"train", "orchestration", "loader", "cli"},
    "observe": {"nn", "sampling", "data", "features", "orchestration", "train", "config", "errors", "loader", "cli"},
    "train": {"loader", "cli"},
    "loader": {"cli"},
}


def package_of(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return parts[0]


def imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "neutronorch" and len(parts) > 1:
                found.add(parts[1])
    return found


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in MODULES:
        package = package_of(path)
        if package in ("__init__", "__main__"):
            continue  # the public API and the entry point gather everything
        graph.setdefault(package, set()).update(imported_packages(path) - {package})
    return graph


def test_layering_holds():
    broken = [f"{package} imports {other}" for package, uses in package_graph().items()
              for other in uses & FORBIDDEN.get(package, set())]
    assert not broken


def module_name(path: Path) -> str:
    parts = ("neutronorch", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The modules of ours that ``path`` imports anywhere in it (inside a function, under TYPE_CHECKING),
    relative imports resolved: ``from package import name`` counts the package, and ``name`` when it is a
    module."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + [base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return (found & known) - {here}


def module_graph() -> dict[str, set[str]]:
    known = {module_name(path) for path in MODULES}
    return {module_name(path): imported_modules(path, known) for path in MODULES}


def first_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle of ``graph``, its first node repeated at the end, or None."""
    state: dict[str, int] = {}

    def visit(node, trail):
        if state.get(node) == 1:
            return trail[trail.index(node):] + [node]
        if state.get(node) == 2:
            return None
        state[node] = 1
        for other in sorted(graph.get(node, ())):
            cycle = visit(other, trail + [node])
            if cycle:
                return cycle
        state[node] = 2
        return None

    for node in sorted(graph):
        cycle = visit(node, [])
        if cycle:
            return cycle
    return None


def test_no_import_cycle_between_packages():
    cycle = first_cycle(package_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycle_between_modules():
    """A circle means two modules are one concept, or a third is missing; an import moved into a function
    still counts."""
    cycle = first_cycle(module_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_modules_and_classes_stay_small(path):
    text = path.read_text()
    assert len(text.splitlines()) <= 400, f"{path.name} has more than 400 lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            length = node.end_lineno - node.lineno + 1
            assert length <= 250, f"class {node.name} has {length} lines"


def test_only_the_command_line_prints():
    printing = []
    for path in MODULES:
        if package_of(path) == "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                printing.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not printing


def test_modes_are_siblings_behind_one_protocol():
    for mode in MODES:
        assert isinstance(mode, type) and not any(issubclass(mode, other) for other in MODES if other is not mode)
        assert isinstance(getattr(mode, "stages", None), StageTable)
        missing = [name for name in ("start", "batches", "step_inputs", "before_step", "after_step", "end_epoch",
                                     "summary", "describe", "close") if not callable(getattr(mode, name, None))]
        assert not missing, f"{mode.__name__} lacks {missing}"
        assert mode.name in ("exact", "device", "neutronorch") and mode.stages.lanes


def test_nothing_outside_a_mode_branches_on_mode_names():
    """Only the factory (which builds modes by name) and the modes themselves may compare mode names."""
    allowed = {"orchestration/factory.py", "config.py", "cli/options.py", "cli/app.py"}
    offenders = []
    for path in MODULES:
        rel = str(path.relative_to(SRC))
        if rel in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                names = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
                constants = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant)}
                if names & {"name", "mode"} and constants & {"exact", "device", "neutronorch"}:
                    offenders.append(f"{rel}:{node.lineno}")
    assert not offenders


def test_the_command_line_and_the_data_layer_load_without_torch():
    """`neutronorch convert`, `info` and `--help` start without waiting for torch (docs/architecture.md)."""
    import subprocess
    import sys

    code = ("import sys, neutronorch, neutronorch.cli, neutronorch.data, neutronorch.config; "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
