#!/usr/bin/env bash
# Add PyG (torch-geometric 2.8.1 + torch-scatter 2.1.2 + torch-sparse 0.6.18, CPU) to the peers virtual
# environment, next to torch 2.13.0+cpu (and DGL), for the peer benchmark bench/peers/pyg_train.py.
# Never install this into the project's .venv.
#
# usage: bash bench/peers/install_pyg.sh [VENV_DIR]     (default: .venv-peers)
#
# Why it needs care (see bench/peers/README.md, section PyG):
#  * torch-geometric itself is pure Python and does not depend on torch, but its NeighborLoader needs either
#    pyg-lib (not on our registry) or torch-sparse (for the CSC sampler). torch-sparse needs torch-scatter.
#  * torch-scatter / torch-sparse publish only source distributions on PyPI (the prebuilt wheels live on
#    data.pyg.org, per torch version, and none exist for torch 2.13): they are compiled here against the
#    installed torch, with --no-build-isolation (the build imports torch) and --no-deps (so pip never
#    touches torch). Takes roughly 5 + 9 minutes on 2 cores (MAX_JOBS, default 2).
#  * The script checks afterwards that torch is still the same +cpu build and that no nvidia-* package came in.
# Each step is skipped when its package already imports at the pinned version: a rerun takes seconds.
set -euo pipefail

VENV="${1:-.venv-peers}"
PY="${PYTHON:-python3}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
PYG_VERSION="${PYG_VERSION:-2.8.1}"
SCATTER_VERSION="${SCATTER_VERSION:-2.1.2}"
SPARSE_VERSION="${SPARSE_VERSION:-0.6.18}"
export MAX_JOBS="${MAX_JOBS:-2}"
# CPU-only builds of the extensions, whatever the machine has.
export FORCE_CUDA=0 FORCE_ONLY_CPU=1

if [ ! -x "$VENV/bin/python" ]; then
    echo "[install_pyg] creating venv $VENV" >&2
    "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
PIP=("$VPY" -m pip install --disable-pip-version-check)

# torch: CPU build only (same as install_dgl.sh). The +cpu pin means pip can never resolve a CUDA build.
if ! "$VPY" -c "import torch,sys; sys.exit(0 if torch.__version__=='${TORCH_VERSION}+cpu' else 1)" 2>/dev/null; then
    echo "[install_pyg] installing torch==${TORCH_VERSION}+cpu" >&2
    "${PIP[@]}" "torch==${TORCH_VERSION}+cpu"
fi
TORCH_BEFORE="$("$VPY" -c 'import torch; print(torch.__version__)')"
echo "[install_pyg] torch $TORCH_BEFORE" >&2

# has MODULE VERSION: exit 0 when MODULE imports and its __version__ starts with VERSION
has() {
    "$VPY" - "$1" "$2" <<'PYEOF' 2>/dev/null
import importlib, sys, warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    m = importlib.import_module(sys.argv[1])
sys.exit(0 if str(getattr(m, "__version__", "")).startswith(sys.argv[2]) else 1)
PYEOF
}

# 1. torch-geometric: pure Python. Its dependencies (aiohttp fsspec jinja2 numpy psutil pyparsing requests
#    tqdm xxhash) are listed explicitly and the package itself goes in with --no-deps.
if has torch_geometric "$PYG_VERSION"; then
    echo "[install_pyg] torch-geometric $PYG_VERSION already installed" >&2
else
    echo "[install_pyg] installing torch-geometric==$PYG_VERSION and its dependencies" >&2
    "${PIP[@]}" numpy scipy aiohttp fsspec jinja2 psutil pyparsing requests tqdm xxhash
    "${PIP[@]}" --no-deps "torch-geometric==$PYG_VERSION"
fi

# 2. Build tools for the C++ extensions: ninja lets torch's BuildExtension compile MAX_JOBS files at a time
#    (without it, setuptools compiles one file after another).
if ! "$VPY" -c "import ninja, wheel" 2>/dev/null; then
    echo "[install_pyg] installing build tools (setuptools wheel ninja)" >&2
    "${PIP[@]}" setuptools wheel ninja
fi
export PATH="$(cd "$VENV/bin" && pwd):$PATH"  # the ninja executable

# 3. torch-scatter, then torch-sparse (which needs it), compiled against the installed torch.
build() {  # build MODULE DIST VERSION
    if has "$1" "$3"; then
        echo "[install_pyg] $2 $3 already installed" >&2
        return
    fi
    echo "[install_pyg] building $2==$3 from source against torch $TORCH_BEFORE (MAX_JOBS=$MAX_JOBS; minutes)" >&2
    local t0=$SECONDS
    "${PIP[@]}" --no-deps --no-build-isolation --no-binary "$2" "$2==$3"
    echo "[install_pyg] $2 built in $((SECONDS - t0)) s" >&2
}
build torch_scatter torch-scatter "$SCATTER_VERSION"
build torch_sparse torch-sparse "$SPARSE_VERSION"

# 4. Check that torch is unchanged and that no CUDA package slipped in.
"$VPY" - "$TORCH_BEFORE" <<'PYEOF'
import importlib.metadata as md, sys
import torch
if torch.__version__ != sys.argv[1] or "+cpu" not in torch.__version__:
    sys.exit(f"[install_pyg] torch is now {torch.__version__}, was {sys.argv[1]}; refusing to continue")
bad = [d.metadata["Name"] for d in md.distributions() if (d.metadata["Name"] or "").lower().startswith("nvidia")]
if bad:
    sys.exit(f"[install_pyg] CUDA packages present: {bad}")
PYEOF

# 5. Smoke test: the loader must find a sampler backend (torch-sparse here).
"$VPY" - <<'PYEOF'
import warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch, torch_geometric, torch_scatter, torch_sparse
    from torch_geometric.loader import NeighborLoader
    from torch_geometric.typing import WITH_PYG_LIB, WITH_TORCH_SPARSE
    from torch_geometric.utils import trim_to_layer  # noqa: F401
if not (WITH_PYG_LIB or WITH_TORCH_SPARSE):
    raise SystemExit("[install_pyg] NeighborLoader has no sampler backend (neither pyg-lib nor torch-sparse)")
print(f"[install_pyg] ok: torch_geometric {torch_geometric.__version__}, torch_scatter {torch_scatter.__version__}, "
      f"torch_sparse {torch_sparse.__version__}, torch {torch.__version__}")
PYEOF
