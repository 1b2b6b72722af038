"""The train command's help: the full texts ``--help-all`` shows, the short ones ``--help`` shows, the
groups the options are listed in, and their metavars (``options.py`` builds the parser from them)."""

from neutronorch.data import DATASET_SPEC_HELP

HELP = {
    "dataset": f"dataset spec: {DATASET_SPEC_HELP} (default: %(default)s)",
    "task": "node: classify vertices by their labels; link: predict edges, trained on seed edges with drawn "
            "negatives and scored by MRR, Hits@K or ROC-AUC against held-out edges (docs/link-prediction.md) "
            "(default: %(default)s)",
    "link_head": "link task: how a pair of embeddings is scored: dot (their inner product) or mlp (a two-layer "
                 "perceptron over their element-wise product, as OGB's examples) (default: %(default)s)",
    "negatives": "link task: destinations drawn uniformly per training positive, seeded like the neighbour "
                 "draws (default: %(default)s)",
    "link_direction": "link task, --split edges:...: undirected (an edge and its reverse are one link, held out "
                      "of message passing both ways), directed (each edge a link), or auto: undirected when at "
                      "least half of the edges have their reverse (default: %(default)s)",
    "eval_negatives": "link task: destinations drawn per validation and test positive where the data stores "
                      "no negatives of its own (the same at every evaluation) (default: %(default)s)",
    "split": "split for data without one: ratio:TRAIN,VAL or per-class:TRAIN,VAL of the vertices; a link task: "
             "edges:TRAIN,VAL of the edges, validation and test edges left out of message passing (default: the "
             "data's own split, else ratio:0.6,0.2; synthetic graphs: ratio:0.1,0.05; link: edges:0.85,0.05)",
    "convert_split": "split for data without one: ratio:TRAIN,VAL or per-class:TRAIN,VAL of the vertices (default: "
                     "the data's own split, else ratio:0.6,0.2; synthetic graphs: ratio:0.1,0.05); a link task draws "
                     "its edge split as it trains (train --task link --split edges:TRAIN,VAL)",
    "model": "GNN architecture: sage, gcn or gat; for a typed graph (docs/heterogeneous.md) sage, rgcn or rgat "
             "(default: %(default)s)",
    "fanouts": "neighbours sampled per layer, seed hop first; -1 takes all (default: 10,10)",
    "hidden": "hidden width (default: %(default)s)",
    "heads": "GAT and R-GAT attention heads in hidden layers (default: %(default)s)",
    "architecture": "plain: a stack of graph layers with ReLU and dropout between; blocks: an input map, one "
                    "residual block h + FFN(aggregate(norm(h))) per layer, and a linear head, as the "
                    "heterophilous-graph baselines of Platonov et al. (docs/models.md) (default: %(default)s)",
    "norm": "normalisation between layers, before the activation: none, layer (LayerNorm) or batch "
            "(BatchNorm) (default: %(default)s)",
    "layers": "number of layers; 0 = one per --fanouts entry; with a single fanout, that fanout in every layer "
              "(default: %(default)s)",
    "metric": "what evaluation scores: accuracy, rocauc, f1-micro, f1-macro; auto = the dataset's own (ROC-AUC "
              "for the binary heterophilous graphs), else ROC-AUC for multi-label labels, accuracy otherwise; a "
              "link task: mrr, hits@K (hits@50) or rocauc, auto = the dataset's own, else mrr "
              "(default: %(default)s)",
    "split_index": "which of the dataset's stored splits to use (the heterophilous .npz files hold 10: 0..9) "
                   "(default: %(default)s)",
    "gcn_norm": "GCN normalisation: symmetric = Kipf & Welling's D^-1/2 (A+I) D^-1/2 by graph degrees (PyG's "
                "GCNConv, DGL's GraphConv), mean = the mean over the vertex and its sampled neighbours "
                "(default: %(default)s)",
    "batch_size": "seeds per mini-batch; 0 = min(1024, max(32, training seeds // 32)) (default: %(default)s)",
    "epochs": "training epochs (default: %(default)s)",
    "lr": "Adam learning rate (default: %(default)s)",
    "weight_decay": "Adam weight decay (default: 5e-3 for a node task, 0 for a link task)",
    "dropout": "dropout after each hidden layer; on CPU resolved to steps of 1/256 (default: %(default)s)",
    "seed": "seed of model init, seed order and sampling (default: %(default)s)",
    "device": "training device; auto picks CUDA when available (default: %(default)s)",
    "precision": "fp32, or bf16: bfloat16 features, activations and matrix products (AMX on CPUs, tensor "
                 "cores on GPUs) with float32 weights, optimizer state, loss and evaluation; auto = bf16 where "
                 "the training device computes it natively, else fp32 (the run says which) "
                 "(default: %(default)s)",
    "mode": "placement of the stages: exact samples and gathers on the host and computes every layer of "
            "every mini-batch on the device; device also samples and gathers on the training device (graph "
            "and features resident there, or read from pinned host memory beyond --gpu-memory-gb); "
            "neutronorch computes hot vertices' bottom layer on the host once per super-batch and reuses it; "
            "auto chooses one when the run starts, says which and why (the log and the summary's "
            "mode_choice) and keeps it when resumed: exact on the CPU; on a GPU device while the topology and "
            "features fit --gpu-memory-gb, else device or neutronorch by a short measured probe "
            "(default: %(default)s)",
    "eval_every": "evaluate val/test every N epochs; 0 evaluates only after the last, -1 never (timing "
                  "runs) (default: %(default)s)",
    "eval_fanouts": "sampled inference with these fanouts instead of exact full-neighbour inference",
    "eval_batch_size": "destinations per inference chunk (default: %(default)s)",
    "eval_max_nodes": "evaluate on a seeded random sample of at most this many validation and test vertices "
                      "each; with exact inference only the last layer gets cheaper (every layer below runs "
                      "over all vertices), so pair it with --eval-fanouts to save real time; 0 = all "
                      "(default: %(default)s)",
    "patience": "stop after this many evaluations without a better validation score (--metric; the summary "
                "and best.pt hold the best epoch); 0 = never stop early (default: %(default)s)",
    "prefetch": "mini-batches prepared ahead of training (default: %(default)s)",
    "threads": "training threads; 0 = all cores (default: %(default)s)",
    "sampler_threads": "sampler/gather threads; 0 = half the cores (default: %(default)s)",
    "super_batch": "neutronorch: mini-batches per super-batch P; hot embeddings are computed once per "
                   "super-batch (default: %(default)s)",
    "hot_ratio": "neutronorch: share of the vertices a super-batch reaches in its bottom layer made hot, "
                 "or auto to tune it between epochs from measured host and device time, down to 0 (no hot rows, "
                 "no host work, probed again every few epochs) while reuse does not pay (default: %(default)s)",
    "staleness_bound": "neutronorch: most optimizer steps between the parameters hot embeddings were "
                       "computed from and their use; at least P-1 (default: 2P-1)",
    "hot_grad": "neutronorch: cpu adds the hot rows' bottom-layer gradient, computed on the host once per "
                "super-batch; stop treats hot rows as constants (faster, but the bottom layer then learns "
                "nothing from them) (default: %(default)s)",
    "hot_error_budget": "neutronorch with --hot-ratio auto: cap r so that (share of bottom-layer rows served "
                        "hot) x (measured drift of a row per step x mean staleness) stays below this "
                        "(default: %(default)s)",
    "snapshot_lead": "neutronorch: optimizer steps between a super-batch's W0 snapshot and its first "
                     "mini-batch (the host's time to compute its hot rows); capped by S-P+1; default: auto "
                     "(2, raised while the trainer waits for hot rows)",
    "hot_set": "neutronorch, data parallel: each rank plans its own hot sets; a row hot on several ranks of a "
               "node is computed by each of them (rank) or by one of them and sent to the others (node: less "
               "host work, more data moved between the ranks; see docs/distributed.md) (default: %(default)s)",
    "host_threads": "neutronorch: threads of the planner's and of the host compute thread's sampling and "
                    "aggregation kernels (each); 0 = half the cores (default: %(default)s)",
    "gpu_memory_gb": "device memory this run may use, in GiB: the budget for the training workspace, the "
                     "topology (where the device samples) and the feature cache; set it below the GPU's "
                     "size to emulate a smaller GPU (default: the whole device)",
    "gpu_cache_gb": "GiB of the hottest feature rows kept on the device; rows not cached are read from "
                    "pinned host memory; auto fills what the budget leaves (every row when they fit), 0 "
                    "turns the cache off; on a CPU-only run a number builds the cache in host memory "
                    "(default: %(default)s)",
    "read_order": "how memory-mapped features and topology are read: file reads each mini-batch's rows "
                  "and adjacency front to back (needed when the page cache cannot keep them: in batch order, "
                  "readahead then reads pages that are evicted before use); batch in the batch's order "
                  "(faster while everything stays in memory); auto = file when the memory-mapped arrays are "
                  "larger than half the memory left beside the run's working memory (default: %(default)s)",
    "host_cache_gb": "GiB of the hottest feature rows (below those on the device) copied into memory when the "
                     "features are a memory map; the other rows are copied once into a compact file of their "
                     "own, so each mini-batch's pass over the file is that much shorter; auto = 60%% of the "
                     "memory left beside the run's working memory when the features do not fit in it (none "
                     "when they do), 0 = off (default: %(default)s)",
    "host_cache_dir": "folder for the host cache's file of the rows it does not hold (deleted as soon as it "
                      "is open): needs that many bytes free (default: next to the features, else the "
                      "temporary folder)",
    "embedding_storage": "typed graphs: where the featureless types' embedding tables and their two Adam "
                         "moments live: memory; mmap, in files the OS pages rows of in and out (CPU runs; "
                         "checkpoints keep them as files beside last.pt and best.pt); auto = memory while they take "
                         "at most half the memory available, else mmap (default: %(default)s)",
    "embedding_dir": "folder for mmap tables' files (deleted as soon as they are open; 12 bytes per table "
                     "entry) (default: --checkpoint-dir, else the temporary folder, the first with room)",
    "cache_policy": "how the cache ranks rows: presample counts bottom-frontier appearances over a few "
                    "sampled mini-batches, degree uses out-degree (default: %(default)s)",
    "device_sampling": "neutronorch: sample every hop and plan each super-batch on the device (topology "
                       "placed there, or read from pinned host memory) instead of on the host; auto = on "
                       "with CUDA (default: %(default)s)",
    "summary_json": "write the run summary (config, per-epoch times, stages, utilisation, data moved, "
                    "accuracy, memory) here",
    "timeline": "draw the stage timeline (a Gantt chart of the host, sampler, copy and trainer lanes, with "
                "CPU/GPU utilisation) of a window of steps to this .png; the raw spans go next to it as "
                ".json (needs matplotlib)",
    "timeline_steps": "steps in the timeline window, from the start of the second epoch (the first if the "
                      "run has one epoch) (default: %(default)s)",
    "log_jsonl": "write step losses and epoch records as JSON lines here",
    "log_csv": "write step losses and epoch results as CSV here",
    "tensorboard": "write TensorBoard scalars (loss, epoch time, validation and test scores, stages, "
                   "utilisation) to this folder (needs tensorboard)",
    "checkpoint_dir": "write DIR/last.pt after every epoch and DIR/best.pt whenever the validation score "
                      "(--metric) improves (model, optimizer, config, dataset fingerprint, history; written "
                      "atomically); `neutronorch predict` reads them",
    "checkpoint_every": "also write DIR/last.pt every this many steps, so that a killed run loses at most "
                        "that many; 0 = at epoch ends only (default: %(default)s)",
    "log_every": "steps per group of logged step losses, read from the device together (default: %(default)s)",
    "dist_timeout": "data parallel (launched with torchrun): seconds a collective waits for the other ranks "
                    "before the run fails saying so (default: %(default)s)",
}


# Short help for the options `train --help` lists (every other option is listed by --help-all only).
SHORT = {  # at most 50 characters each (--split aside), so that an option takes one line of 80 columns
    "dataset": "folder, file, or synthetic[:nodes=N] (the default)",
    "task": "node (classification) or link (prediction)",
    "split": "ratio:TRAIN,VAL or per-class:TRAIN,VAL; a link task: edges:TRAIN,VAL",
    "model": "sage (default), gcn or gat; typed: also rgcn, rgat",
    "hidden": "hidden width (default: 256)",
    "fanouts": "neighbours per layer, -1 all (default: 10,10)",
    "epochs": "training epochs (default: 50)",
    "batch_size": "seeds per mini-batch (default: from the train set)",
    "lr": "Adam learning rate (default: 0.003)",
    "seed": "seed of weights, sampling and order (default: 0)",
    "mode": "exact (default), device, neutronorch; auto picks",
    "device": "training device; auto (default): CUDA if present",
    "precision": "fp32 (default) or bf16; auto: bf16 where native",
    "gpu_memory_gb": "GiB of GPU memory the run may use (default: all)",
    "hot_ratio": "neutronorch: share of vertices hot (default: auto)",
    "super_batch": "neutronorch: batches per super-batch (default: 8)",
    "run_name": "results in runs/NAME/ (default: time, model, data)",
    "save": "no run folder: only the outputs named below",
    "summary_json": "write the run summary (accuracy, times) here",
    "checkpoint_dir": "write last.pt each epoch, best.pt at each best",
    "resume": "continue the run of --run-name/--checkpoint-dir",
    "overwrite": "replace an earlier run's outputs, not refuse them",
    "config": "YAML, TOML or JSON options; the command line wins",
}

# train's options by group, as --help-all lists them (by TrainConfig field; `config`, `progress` and
# `stage_table` are the --config, --no-progress and --no-stage-table flags); a field not placed here goes to
# the advanced group. --help lists those in SHORT.
TRAIN_GROUPS = [
    ("data", None, ["dataset", "task", "split", "split_index", "link_direction"]),
    ("model", None, ["model", "layers", "hidden", "fanouts", "heads", "gcn_norm", "residual", "norm",
                     "architecture", "link_head"]),
    ("training", None, ["epochs", "batch_size", "lr", "seed", "weight_decay", "dropout", "patience", "negatives"]),
    ("evaluation", None, ["metric", "eval_every", "eval_fanouts", "eval_batch_size", "eval_max_nodes",
                          "eval_negatives"]),
    ("mode", None, ["mode", "device", "precision", "gpu_memory_gb", "hot_ratio", "super_batch",
                    "staleness_bound", "hot_grad", "gpu_cache_gb"]),
    ("outputs", None, ["run_name", "save", "summary_json", "checkpoint_dir", "resume", "overwrite", "config",
                       "checkpoint_every", "log_jsonl", "log_csv", "tensorboard"]),
    ("advanced", "tuning and diagnostic knobs: the defaults suit nearly every run",
     ["snapshot_lead", "hot_error_budget", "hot_set", "device_sampling", "cache_policy", "read_order",
      "host_cache_gb", "host_cache_dir", "embedding_storage", "embedding_dir", "threads", "sampler_threads",
      "host_threads", "prefetch", "timeline", "timeline_steps", "log_every", "progress", "stage_table",
      "dist_timeout"]),
]

METAVARS = {"metric": "METRIC", "negatives": "K", "eval_negatives": "K", "dataset": "SPEC", "split": "SPEC", "split_index": "K", "layers": "N", "hidden": "N", "fanouts": "LIST",
            "heads": "N", "epochs": "N", "batch_size": "N", "lr": "LR", "seed": "S", "weight_decay": "WD",
            "dropout": "P", "patience": "N", "eval_every": "N", "eval_fanouts": "LIST", "eval_batch_size": "N",
            "eval_max_nodes": "N", "gpu_memory_gb": "G", "hot_ratio": "R", "super_batch": "P",
            "staleness_bound": "S", "gpu_cache_gb": "G", "summary_json": "PATH", "checkpoint_dir": "DIR",
            "config": "FILE", "run_name": "NAME", "checkpoint_every": "N", "log_jsonl": "PATH", "log_csv": "PATH",
            "tensorboard": "DIR", "snapshot_lead": "N", "hot_error_budget": "E", "host_cache_gb": "G",
            "host_cache_dir": "DIR", "embedding_dir": "DIR", "threads": "N", "sampler_threads": "N",
            "host_threads": "N",
            "prefetch": "N", "timeline": "PNG", "timeline_steps": "N", "log_every": "N", "dist_timeout": "SECONDS"}

# Options that are not TrainConfig fields or are spelt otherwise: (flag, dest, action, help). --config's path,
# the command line's run folder (--run-name, --no-save), and the switches that set TrainConfig fields.
RUN_FOLDER_KEYS = ("run_name", "save")  # a --config file takes them too
SWITCHES = {
    "config": ("--config", "config", "store",
               "YAML, TOML or JSON file with the same keys as the options (batch_size or batch-size), at the top "
               "level or in sections named after TrainConfig's parts ([network], [sampling], [optimization], "
               "[evaluation], [link], [neutronorch], [placement], [outputs], [logging]); options given on the "
               "command line win"),
    "run_name": ("--run-name", "run_name", "store",
                 "keep this run's results (summary.json, metrics.jsonl, last.pt and best.pt) in runs/NAME/ under "
                 "the current folder. A run never writes into an existing run's folder: an existing runs/NAME/ is "
                 "refused unless --resume (continue that run) or --overwrite (replace its results). Default: a "
                 "new folder named by the UTC time, the model and the dataset (runs/2026-12-03T07-15-02-sage-"
                 "synthetic/). No run folder is made when an output option (--summary-json, --checkpoint-dir, "
                 "--log-jsonl, --log-csv, --tensorboard, --timeline) is given: the run writes what they name"),
    "save": ("--no-save", "save", "store_false",
             "make no run folder: write only the outputs the options name (with none, the run keeps nothing)"),
    "progress": ("--no-progress", "progress", "store_false", "no progress bar (the per-epoch lines stay)"),
    "resume": ("--resume", "resume", "store_true",
               "continue the run whose checkpoints are in --checkpoint-dir from its last.pt (raise --epochs to "
               "train longer), mid-epoch included, in every mode"),
    "overwrite": ("--overwrite", "overwrite", "store_true",
                  "replace the outputs of an earlier run (--summary-json, the logs, --timeline, the checkpoints "
                  "in --checkpoint-dir), kept aside until this run has written its first checkpoint (or its "
                  "summary) and put back if it fails before; without it a run refuses paths that already hold them"),
    "residual": ("--residual", "residual", "store_true",
                 "skip connections around every layer but the output layer (identity, or a learned projection "
                 "where the widths differ)"),
    "stage_table": ("--no-stage-table", "stage_table", "store_false",
                    "no per-lane stage breakdown after each epoch line"),
}

TRAIN_EPILOG = ("A run that names no output (--summary-json, ...) keeps its results in runs/.\n"
                "--help-all lists every option; a --config file takes every option as a key.")
TRAIN_EPILOG_ALL = ("A --config file (YAML, TOML or JSON) takes every option as a key, with dashes or underscores "
                    "(batch-size or batch_size; no-progress: true); a key set to null keeps its default; options given on the "
                    "command line win.")
SHORT_METAVARS = {"precision": "PREC", "model": "MODEL"}  # short help: the choices are in the text
