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


def test_the_epoch_loop_counts_a_serving_process_cpu_seconds_per_epoch():
    """DistDGL's trainers sample through a graph server: each epoch's record has the server's CPU seconds
    taken over that epoch (here a clock the batches advance), and no such key without a server."""
    sys.path.insert(0, str(PEERS))
    try:
        import peer_common
    finally:
        sys.path.remove(str(PEERS))
    from types import SimpleNamespace

    clock = [10.0]

    def measure(item):
        clock[0] += 0.25 * item
        return 5, 7, None

    args = SimpleNamespace(epochs=2, max_batches=0, eval="none", eval_every=0)
    loader = [1, 2, 1]  # one epoch advances the server's clock by 1.0
    epochs = peer_common.train_epochs(args, loader, None, None, measure, None, None, lambda _: None,
                                      server_cpu=lambda: clock[0])[0]
    assert [e["server_cpu_seconds"] for e in epochs] == [1.0, 1.0]
    assert [e["batches"] for e in epochs] == [3, 3] and [e["sampled_edges"] for e in epochs] == [15, 15]
    plain = peer_common.train_epochs(args, loader, None, None, measure, None, None, lambda _: None)[0]
    assert all("server_cpu_seconds" not in e for e in plain)
