#!/usr/bin/env bash
# Create or update a separate virtual environment holding DGL 2.1.0 next to torch 2.13.0 (CPU),
# for the peer benchmark bench/peers/dgl_train.py. Never install this into the project's .venv.
#
# usage: bash bench/peers/install_dgl.sh [VENV_DIR]     (default: .venv-peers)
#
# Why it needs tricks (see shared/design/peers.md):
#  * dgl==2.1.0 is the newest Linux wheel; it declares torch 2.0-2.2, so it is installed with --no-deps.
#  * torchdata 0.10+ removed the datapipes DGL imports: torchdata==0.9.0, also --no-deps.
#  * `import dgl` fails: dgl/graphbolt/__init__.py ends by loading a GraphBolt C++ library built per torch
#    version, and none exists for torch 2.13. We patch that one load to warn instead of raising. The classic
#    sampler (dgl.dataloading.NeighborSampler / DataLoader) and the nn modules do not need GraphBolt.
set -euo pipefail

VENV="${1:-.venv-peers}"
PY="${PYTHON:-python3}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[install_dgl] creating venv $VENV" >&2
    "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
PIP=("$VPY" -m pip install --disable-pip-version-check)

# torch: CPU build only. Pin the +cpu local version so pip can never resolve a CUDA build from the index
# (the CPU wheel is found via find-links). If already installed, nothing is downloaded.
if ! "$VPY" -c "import torch,sys; sys.exit(0 if torch.__version__=='${TORCH_VERSION}+cpu' else 1)" 2>/dev/null; then
    echo "[install_dgl] installing torch==${TORCH_VERSION}+cpu" >&2
    "${PIP[@]}" "torch==${TORCH_VERSION}+cpu"
fi

echo "[install_dgl] installing numpy and DGL's runtime dependencies" >&2
"${PIP[@]}" numpy scipy packaging pandas pyyaml pydantic networkx requests tqdm psutil
echo "[install_dgl] installing dgl==2.1.0 and torchdata==0.9.0 (--no-deps)" >&2
"${PIP[@]}" --no-deps dgl==2.1.0 torchdata==0.9.0

# Check that no CUDA torch slipped in.
"$VPY" - <<'PYEOF'
import importlib.metadata as md, sys
v = md.version("torch")
if "+cpu" not in v:
    sys.exit(f"[install_dgl] torch {v} is not the CPU build; refusing to continue")
bad = [d.metadata["Name"] for d in md.distributions() if (d.metadata["Name"] or "").lower().startswith("nvidia")]
if bad:
    sys.exit(f"[install_dgl] CUDA packages present: {bad}")
PYEOF

# Patch dgl/graphbolt/__init__.py: make the final library load non-fatal (idempotent).
"$VPY" - <<'PYEOF'
import importlib.util, os, re, sys
spec = importlib.util.find_spec("dgl")
path = os.path.join(os.path.dirname(spec.origin), "graphbolt", "__init__.py")
src = open(path).read()
MARK = "# neutronorch-peers: graphbolt load made non-fatal"
if MARK in src:
    print(f"[install_dgl] {path}: already patched", file=sys.stderr)
    sys.exit(0)
lines = src.rstrip("\n").split("\n")
# the last non-empty, non-comment line is the library load, e.g. `load_graphbolt()`
i = len(lines) - 1
while i >= 0 and (not lines[i].strip() or lines[i].lstrip().startswith("#")):
    i -= 1
last = lines[i]
if last.startswith((" ", "\t")) or "graphbolt" not in last.lower():
    sys.exit(f"[install_dgl] unexpected last line in {path!r}: {last!r}; patch by hand")
lines[i:i + 1] = [
    MARK,
    "try:",
    "    " + last,
    "except Exception as _gb_err:  # no GraphBolt library for this torch version",
    "    import warnings as _gb_warnings",
    "    _gb_warnings.warn(f'GraphBolt unavailable, continuing without it: {_gb_err}')",
]
with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
print(f"[install_dgl] patched {path}: {last.strip()!r} wrapped in try/except", file=sys.stderr)
PYEOF

"$VPY" - <<'PYEOF'
import warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import dgl, torch
    from dgl.dataloading import NeighborSampler, DataLoader
    import dgl.nn as dglnn
print(f"[install_dgl] ok: dgl {dgl.__version__}, torch {torch.__version__}")
PYEOF
