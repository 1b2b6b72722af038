#!/usr/bin/env python
"""One DistDGL process of ``distdgl_train.py``'s run on one machine: a graph server or a trainer.

Started by ``distdgl_train.py`` (never by hand) with the environment DGL's ``tools/launch.py`` would set
(DGL_ROLE, DGL_SERVER_ID, DGL_IP_CONFIG, DGL_CONF_PATH, DGL_NUM_SERVER, DGL_NUM_CLIENT, DGL_NUM_SAMPLER,
DGL_GRAPH_FORMAT, DGL_DIST_MODE, DGL_GROUP_ID, OMP_NUM_THREADS; MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE as
torch.distributed.run sets them) and one more, DISTDGL_MACHINE: the simulated machine (= part) it belongs to.

Several DistDGL "machines" on one host need two corrections, both applied before DGL starts (see
bench/peers/README.md, "DistDGL"):

* Machine of a client. DGL finds it by matching the host's IP addresses against ip_config
  (``rpc_client.get_local_machine_id``); every line of a one-host ip_config matches, so every trainer would
  take machine 0, part 0 as its local part, and a DGL rank in the order the trainers connect. Each trainer
  is told its machine instead.
* Shared memory. Each KVStore server puts its part's features in shared memory named after the feature
  (``kvstore.empty_shared_mem(name + "-kvdata-", ...)``, opened with O_CREAT, not O_EXCL), and its trainers
  map it. Servers of two parts on one host would open the same segment and overwrite each other's rows.
  Every name gets the run's id and the machine as a prefix, so each machine's segments are its own.

The graph structure is not put in shared memory (``DistGraphServer(disable_shared_mem=True)``, as DGL's own
multi-part tests on localhost do): trainers sample every part, their own included, through the servers.
"""
import json
import os
import resource
import sys
import time

RUN = json.loads(os.environ["DISTDGL_RUN"])  # the launcher's settings for this run
MACHINE = int(os.environ["DISTDGL_MACHINE"])
THREADS = int(RUN["threads"])
os.environ.setdefault("DGLBACKEND", "pytorch")

import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torchdata's banner and the (patched) GraphBolt load warning
    import dgl  # noqa: E402
    import dgl.distributed.kvstore as dgl_kvstore  # noqa: E402
    import dgl.distributed.rpc_client as dgl_rpc_client  # noqa: E402
    import dgl.nn as dglnn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_common import dgl_measure, peak_rss_mb, train_epochs  # noqa: E402


def log(msg):
    print(f"[distdgl {os.environ['DGL_ROLE']} {MACHINE}] {msg}", file=sys.stderr, flush=True)


def memory_mb():
    """This process's CPU seconds (user + system, its whole life), its peak RSS, and its resident memory now:
    anonymous, shared memory (the KVStore's segments, counted in the server that creates them and in every
    trainer that touches them) and mapped files."""
    with open("/proc/self/status") as f:
        kb = {k: float(v.split()[0]) for k, v in (line.split(":", 1) for line in f) if v.strip().endswith("kB")}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"cpu_seconds": usage.ru_utime + usage.ru_stime, "peak_rss_mb": peak_rss_mb(),
            "anon_mb": kb["RssAnon"] / 1024, "shmem_mb": kb["RssShmem"] / 1024, "file_mb": kb["RssFile"] / 1024}


def server_cpu_seconds():
    """The CPU seconds so far (user + system) of this machine's graph server, which samples for every
    trainer: /proc/PID/stat's utime and stime of the process the launcher names in DISTDGL_SERVER_PID."""
    with open(f"/proc/{int(os.environ['DISTDGL_SERVER_PID'])}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def report(name, record):
    with open(os.path.join(RUN["work_dir"], f"{name}.json"), "w") as f:
        json.dump({**record, **memory_mb()}, f)


def one_machine_patches():
    """The two corrections of the module docstring."""
    prefix = f"{RUN['shm_prefix']}m{MACHINE}-"
    opened = dgl_kvstore.empty_shared_mem

    def empty_shared_mem(name, is_create, shape, dtype="float32"):
        return opened(prefix + name, is_create, shape, dtype)

    dgl_kvstore.empty_shared_mem = empty_shared_mem
    dgl_rpc_client.get_local_machine_id = lambda server_namebook: MACHINE


def serve():
    from dgl.distributed import DistGraphServer  # noqa: PLC0415

    server = DistGraphServer(int(os.environ["DGL_SERVER_ID"]), os.environ["DGL_IP_CONFIG"],
                             int(os.environ["DGL_NUM_SERVER"]), int(os.environ["DGL_NUM_CLIENT"]),
                             os.environ["DGL_CONF_PATH"], disable_shared_mem=True,
                             graph_format=os.environ.get("DGL_GRAPH_FORMAT", "csc").split(","))
    log(f"serving part {server.part_id}: {server.client_g.num_nodes()} vertices (halo included), "
        f"{server.client_g.num_edges()} edges; peak RSS {peak_rss_mb():.0f} MB")
    server.start()  # returns when the trainers shut the servers down
    report(f"server-{MACHINE}", {"part": int(server.part_id)})


class SAGE(nn.Module):
    """GraphSAGE (mean) as DistDGL's example builds it: ReLU + dropout between layers, none after the last."""

    def __init__(self, in_dim, hidden, out_dim, num_layers, dropout):
        super().__init__()
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.layers = nn.ModuleList(dglnn.SAGEConv(dims[i], dims[i + 1], "mean") for i in range(num_layers))
        self.dropout = nn.Dropout(dropout)

    def layer_forward(self, i, block, h):
        out = self.layers[i](block, h)
        return out if i == len(self.layers) - 1 else self.dropout(F.relu(out))

    def forward(self, blocks, x):
        for i, block in enumerate(blocks):
            x = self.layer_forward(i, block, x)
        return x


def check_features(g, rank):
    """Pull rows of every part through the KVStore and compare them with the dataset's: a machine reading
    another's shared memory would fail here instead of training on wrong rows."""
    orig = np.load(RUN["orig_nids"], mmap_mode="r")
    feats = np.load(os.path.join(RUN["dataset"], "features.npy"), mmap_mode="r")
    labels = np.load(os.path.join(RUN["dataset"], "labels.npy"), mmap_mode="r")
    ids = np.random.default_rng(rank).choice(g.num_nodes(), size=min(4096, g.num_nodes()), replace=False)
    ids.sort()
    got = g.ndata["features"][torch.from_numpy(ids)].numpy()
    want = np.asarray(feats[orig[ids]], dtype=got.dtype)
    got_labels = g.ndata["labels"][torch.from_numpy(ids)].numpy()
    if not (np.array_equal(got, want) and np.array_equal(got_labels, labels[orig[ids]])):
        bad = int((~(got == want).all(1)).sum())
        raise SystemExit(f"trainer {rank}: {bad} of {len(ids)} feature rows pulled through DistDGL's KVStore "
                         "differ from the dataset's; the parts' shared memory is mixed up")
    return len(ids)


@torch.no_grad()
def evaluate(model, g, val_nid, test_nid, batch_size):
    """DistDGL's layer-wise full-neighbour inference (its example's), every trainer computing its share of
    the vertices into a DistTensor; then the accuracy over all trainers' validation and test shares."""
    t = time.perf_counter()
    model.eval()
    nodes = dgl.distributed.node_split(np.arange(g.num_nodes()), g.get_partition_book(), force_even=True)
    x = g.ndata["features"]
    for i, layer in enumerate(model.layers):
        y = dgl.distributed.DistTensor((g.num_nodes(), layer._out_feats), torch.float32, f"h{i}",
                                       persistent=True)
        loader = dgl.dataloading.DistNodeDataLoader(g, nodes, dgl.dataloading.NeighborSampler([-1]),
                                                    batch_size=batch_size, shuffle=False, drop_last=False)
        for input_nodes, output_nodes, blocks in loader:
            y[output_nodes] = model.layer_forward(i, blocks[0], x[input_nodes])
        x = y
        g.barrier()
    counts = []
    for nid in (val_nid, test_nid):
        pred = x[nid].argmax(1) if len(nid) else torch.empty(0, dtype=torch.int64)
        counts += [float((pred == g.ndata["labels"][nid].long()).sum()) if len(nid) else 0.0, float(len(nid))]
    total = torch.tensor(counts, dtype=torch.float64)
    torch.distributed.all_reduce(total)
    val_acc = float(total[0] / total[1]) if total[1] else None
    test_acc = float(total[2] / total[3]) if total[3] else None
    return val_acc, test_acc, time.perf_counter() - t


def train():
    from types import SimpleNamespace  # noqa: PLC0415

    args = SimpleNamespace(**RUN["args"])
    torch.set_num_threads(THREADS)
    dgl.utils.set_num_threads(THREADS)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    dgl.seed(args.seed)
    t0 = time.perf_counter()
    dgl.distributed.initialize(os.environ["DGL_IP_CONFIG"])
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    gpb = dgl.distributed.load_partition_book(RUN["part_config"], MACHINE)[0]
    g = dgl.distributed.DistGraph(RUN["graph_name"], gpb=gpb, part_config=RUN["part_config"])
    if g.rank() != rank:
        raise SystemExit(f"trainer on machine {MACHINE}: DGL's trainer rank {g.rank()} is not torch's {rank}")
    pb = g.get_partition_book()
    train_nid = dgl.distributed.node_split(g.ndata["train_mask"], pb, force_even=True)
    val_nid = dgl.distributed.node_split(g.ndata["val_mask"], pb, force_even=True)
    test_nid = dgl.distributed.node_split(g.ndata["test_mask"], pb, force_even=True)
    checked = check_features(g, rank)
    local = pb.partid2nids(pb.partid).numpy()
    local_train = int(np.isin(train_nid.numpy(), local).sum())
    startup = time.perf_counter() - t0
    log(f"rank {rank}, part {pb.partid}: {len(train_nid)} training vertices ({local_train} in its part), "
        f"{len(val_nid)} validation, {len(test_nid)} test; {checked} feature rows checked; "
        f"started in {startup:.1f} s")

    sampler = dgl.dataloading.NeighborSampler(list(reversed(args.fanouts_list)))  # DGL: input layer first
    loader = dgl.dataloading.DistNodeDataLoader(g, train_nid, sampler, batch_size=args.batch_size,
                                                shuffle=True, drop_last=False)
    model = opt = None
    if not args.sampler_only:
        model = SAGE(g.ndata["features"].shape[1], args.hidden, RUN["num_classes"], len(args.fanouts_list),
                     args.dropout)
        model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)

    def gather(item, _):
        input_nodes, seeds, blocks = item
        return g.ndata["features"][input_nodes], g.ndata["labels"][seeds].long(), lambda m, x: m(blocks, x)

    loop_args = SimpleNamespace(**{**vars(args), "eval": "none"})
    loop = (loop_args, loader, model, opt, dgl_measure, gather, None, log)
    if model is not None:
        with model.join():  # DDP with trainers whose last epochs may hold one batch fewer
            epochs, rate, _, _, _ = train_epochs(*loop, server_cpu=server_cpu_seconds)
    else:
        epochs, rate, _, _, _ = train_epochs(*loop, server_cpu=server_cpu_seconds)
    val_acc = test_acc = eval_seconds = None
    if args.eval == "full" and model is not None:
        val_acc, test_acc, eval_seconds = evaluate(model.module, g, val_nid, test_nid, args.eval_batch_size)
        log(f"eval (full-neighbour layer-wise): val_acc {val_acc} test_acc {test_acc} in {eval_seconds:.1f} s")
    result = {"rank": rank, "part": int(pb.partid), "train": len(train_nid), "train_in_part": local_train,
              "startup_seconds": startup, "features_checked": checked, "epochs": epochs,
              "sampled_edges_per_second": rate, "val_acc": val_acc, "test_acc": test_acc,
              "eval_seconds": eval_seconds}
    report(f"trainer-{rank}", result)


if __name__ == "__main__":
    one_machine_patches()
    serve() if os.environ["DGL_ROLE"] == "server" else train()
