"""What the peer runners share (bench/peers/peer_common.py, numpy only) that can be checked without DGL or PyG:
a runner's peak memory is its own, also when the process that started it holds much more."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

PEERS = Path(__file__).resolve().parents[1] / "bench" / "peers"


def test_a_runner_started_by_a_large_parent_reports_its_own_peak_rss():
    """ru_maxrss of an exec'd child keeps the forking parent's high-water mark; the runners' launchers
    (distdgl_train.py, a harness) hold a graph when they start them."""
    held = np.ones(300 << 20, dtype=np.uint8)  # 300 MB resident in this (the parent) process
    child = ("import sys; sys.path.insert(0, sys.argv[1]); import numpy as np, peer_common; "
             "a = np.ones(40 << 20, dtype=np.uint8); print(peer_common.peak_rss_mb())")
    out = subprocess.run([sys.executable, "-c", child, str(PEERS)], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    peak = float(out.split()[-1])
    assert held.sum() == 300 << 20
    assert 40 < peak < 200, f"the child's peak RSS {peak:.0f} MB is not its own (it holds about 70 MB)"
