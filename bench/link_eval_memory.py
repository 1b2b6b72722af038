"""Link-prediction evaluation's peak memory and time: ``evaluate_links`` over every validation and test edge.

Loads the dataset with a written link split (``bench/link_vs_pyg.py`` writes them), builds an untrained
``LinkModel`` (GraphSAGE encoder, ``--layers`` layers of ``--hidden``, dot head: the weights do not change
what is held) and evaluates once, sampling the process's /proc/self/status every 20 ms. Prints the resident
memory before the evaluation, the peak during it (whole, anonymous, file-backed), its seconds and the metrics;
run it under ``/usr/bin/time -v`` for the kernel's own peak. glibc malloc is set as ``train`` sets it
(``keep_freed_memory``: freed memory kept for reuse, so the peak is the heap's high-water mark) unless
``--system-malloc``, or ``NEUTRONORCH_SYSTEM_MALLOC=1``, leaves glibc's defaults.

    /usr/bin/time -v python bench/link_eval_memory.py --split bench/out/link-split-synthetic1m-s0.npz \
        --dataset synthetic:nodes=1000000,degree=20,features=100,classes=16,seed=0
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import threading
import time

FIELDS = ("VmRSS", "RssAnon", "RssFile")


class PeakSampler:
    """The peak of /proc/self/status's resident-memory fields (kB) since the last ``reset``, sampled every
    20 ms by a daemon thread."""

    def __init__(self):
        self.peak = dict.fromkeys(FIELDS, 0)
        threading.Thread(target=self._run, daemon=True).start()

    @staticmethod
    def now() -> dict[str, int]:
        with open("/proc/self/status") as f:
            rows = (line.split() for line in f)
            return {row[0].rstrip(":"): int(row[1]) for row in rows if row and row[0].rstrip(":") in FIELDS}

    def reset(self) -> None:
        self.peak = self.now()

    def _run(self) -> None:
        while True:
            current = self.now()
            self.peak = {k: max(v, current[k]) for k, v in self.peak.items()}
            time.sleep(0.02)


def prepared_graph(spec: str, split: str):
    """The dataset with the split's message-passing topology and its links."""
    import numpy as np

    from neutronorch import load_dataset
    from neutronorch.data.links import LinkSplit

    graph = load_dataset(spec)
    arrays = np.load(split)
    links = LinkSplit(train=arrays["train"], val=arrays["val"], test=arrays["test"],
                      undirected=bool(arrays["undirected"]))
    return dataclasses.replace(graph, indptr=arrays["indptr"], indices=arrays["indices"], links=links, notes=[])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--split", required=True, help="a .npz link split (indptr, indices, train, val, test)")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--eval-negatives", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=4096, help="vertices per layer-wise chunk")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--system-malloc", action="store_true", help="glibc's defaults, not train's setting")
    args = parser.parse_args()

    import torch

    from neutronorch.features.store import FeatureStore
    from neutronorch.nn.link import LinkModel
    from neutronorch.nn.models import GNN
    from neutronorch.train.link_task import LinkTask, evaluate_links
    from neutronorch.train.resources import keep_freed_memory

    kept = not args.system_malloc and keep_freed_memory()
    torch.set_num_threads(args.threads)
    sampler = PeakSampler()
    graph = prepared_graph(args.dataset, args.split)
    torch.manual_seed(args.seed)
    model = LinkModel(GNN("sage", graph.feature_dim, args.hidden, args.hidden, args.layers))
    store = FeatureStore(graph.features, graph.labels)
    before = sampler.now()
    sampler.reset()
    t0 = time.perf_counter()
    scores = evaluate_links(model, graph, store, torch.device("cpu"), args.batch_size, args.seed,
                            args.eval_negatives, LinkTask.of(graph, model))
    seconds = time.perf_counter() - t0
    time.sleep(0.05)
    peak = sampler.peak
    print(f"{graph.links.describe()}; malloc: {'freed memory kept (as train sets it)' if kept else 'system defaults'}")
    print(f"before evaluation: RSS {before['VmRSS'] / 1024:.0f} MiB (anonymous {before['RssAnon'] / 1024:.0f}, "
          f"file-backed {before['RssFile'] / 1024:.0f})")
    print(f"evaluation peak:   RSS {peak['VmRSS'] / 1024:.0f} MiB (anonymous {peak['RssAnon'] / 1024:.0f}, "
          f"file-backed {peak['RssFile'] / 1024:.0f}); {seconds:.1f} s")
    print("RESULT " + json.dumps({"seconds": seconds, "malloc_kept": kept, "before_mib": before["VmRSS"] / 1024,
                                  "peak_mib": peak["VmRSS"] / 1024, "peak_anon_mib": peak["RssAnon"] / 1024,
                                  "peak_file_mib": peak["RssFile"] / 1024, "scores": scores}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
