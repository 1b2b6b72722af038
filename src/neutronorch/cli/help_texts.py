"""The train command's help beyond each setting's own option: the groups the options are listed in, the
command line's own options, and the epilogs."""

CONVERT_SPLIT_HELP = ("split for data without one: ratio:TRAIN,VAL or per-class:TRAIN,VAL of the vertices (default: "
                      "the data's own split, else ratio:0.6,0.2; synthetic graphs: ratio:0.1,0.05); a link task draws "
                      "its edge split as it trains (train --task link --split edges:TRAIN,VAL)")

# train's options by group, in the order --help-all lists them (by TrainConfig setting, and the command line's
# own options); the advanced group takes every setting not placed here, in their order in TrainConfig's parts.
TRAIN_GROUPS = [
    ("data", None, ["dataset", "task", "split", "split_index", "link_direction", "link_relation"]),
    ("model", None, ["model", "layers", "hidden", "fanouts", "heads", "gcn_norm", "residual", "norm",
                     "architecture", "link_head"]),
    ("training", None, ["epochs", "batch_size", "lr", "seed", "weight_decay", "dropout", "patience", "negatives"]),
    ("evaluation", None, ["metric", "eval_every", "eval_fanouts", "eval_batch_size", "eval_max_nodes",
                          "eval_negatives"]),
    ("mode", None, ["mode", "device", "precision", "gpu_memory_gb", "hot_ratio", "super_batch",
                    "staleness_bound", "hot_grad", "gpu_cache_gb"]),
    ("outputs", None, ["run_name", "save", "summary_json", "checkpoint_dir", "resume", "overwrite", "config",
                       "checkpoint_every", "log_jsonl", "log_csv", "tensorboard"]),
    ("advanced", "tuning and diagnostic knobs: the defaults suit nearly every run", []),
]

# The command line's own options, not TrainConfig settings: (flag, action, metavar, help, short help). --config's
# path and the run folder (--run-name, --no-save), which a --config file takes too (RUN_FOLDER_KEYS).
RUN_FOLDER_KEYS = ("run_name", "save")
RUN_OPTIONS = {
    "config": ("--config", "store", "FILE",
               "YAML, TOML or JSON file with the same keys as the options (batch_size or batch-size), at the top "
               "level or in sections named after TrainConfig's parts ([network], [sampling], [optimization], "
               "[evaluation], [link], [neutronorch], [placement], [outputs], [logging]); options given on the "
               "command line win", "YAML, TOML or JSON options; the command line wins"),
    "run_name": ("--run-name", "store", "NAME",
                 "keep this run's results (summary.json, metrics.jsonl, last.pt and best.pt) in runs/NAME/ under "
                 "the current folder. A run never writes into an existing run's folder: an existing runs/NAME/ is "
                 "refused unless --resume (continue that run) or --overwrite (replace its results). Default: a "
                 "new folder named by the UTC time, the model and the dataset (runs/2026-12-03T07-15-02-sage-"
                 "synthetic/). No run folder is made when an output option (--summary-json, --checkpoint-dir, "
                 "--log-jsonl, --log-csv, --tensorboard, --timeline) is given: the run writes what they name",
                 "results in runs/NAME/ (default: time, model, data)"),
    "save": ("--no-save", "store_false", None,
             "make no run folder: write only the outputs the options name (with none, the run keeps nothing)",
             "no run folder: only the outputs named below"),
}

TRAIN_EPILOG = ("A run that names no output (--summary-json, ...) keeps its results in runs/.\n"
                "--help-all lists every option; a --config file takes every option as a key.")
TRAIN_EPILOG_ALL = ("A --config file (YAML, TOML or JSON) takes every option as a key, with dashes or underscores "
                    "(batch-size or batch_size; no-progress: true); a key set to null keeps its default; options given on the "
                    "command line win.")
