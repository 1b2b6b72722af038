"""The command line's options (``build_parser``). ``--help`` lists the options a first run needs, with short
help; ``--help-all`` lists every option with its full help. Both parse the same options the same way."""

from __future__ import annotations

import argparse
import inspect
import re
import sys
import textwrap
from dataclasses import fields

from neutronorch.config import TrainConfig, setting_fields
from neutronorch.data import DATASET_SPEC_HELP, SyntheticSpec, synthetic_temporal, synthetic_typed
from neutronorch.cli.partition import add_partition_options
from neutronorch.config_keys import did_you_mean
from neutronorch.data.tabular import HEADERS

__all__ = ["RUN_FOLDER_KEYS", "TEMPORAL_ONLY", "build_parser"]

# train's options by group, in the order --help-all lists them (by TrainConfig setting, and the command line's
# own options); the advanced group takes every setting not placed here, in their order in TrainConfig's parts.
TRAIN_GROUPS = [
    ("data", None, ["dataset", "partitions", "deal_by", "task", "split", "split_index", "link_direction", "link_relation"]),
    ("model", None, ["model", "layers", "hidden", "fanouts", "heads", "gcn_norm", "residual", "norm",
                     "architecture", "link_head"]),
    ("training", None, ["epochs", "batch_size", "lr", "seed", "weight_decay", "dropout", "patience",
                        "negatives"]),
    ("evaluation", None, ["metric", "eval_every", "eval_fanouts", "eval_batch_size", "eval_max_nodes",
                          "eval_negatives"]),
    ("mode", None, ["mode", "device", "precision", "gpu_memory_gb", "hot_ratio", "super_batch",
                    "staleness_bound", "hot_grad", "gpu_cache_gb"]),
    ("outputs", None, ["run_name", "save", "summary_json", "checkpoint_dir", "resume", "overwrite", "config",
                       "checkpoint_every", "log_jsonl", "log_csv", "tensorboard"]),
    ("advanced", "tuning and diagnostic knobs: the defaults suit nearly every run", []),
]

# The command line's own options, not TrainConfig settings: name -> (default, option as a setting's):
# --config's path and the run folder (--run-name, --no-save), which a --config file takes too.
RUN_FOLDER_KEYS = ("run_name", "save")
RUN_OPTIONS = {
    "config": (None, dict(
        metavar="FILE", short="YAML, TOML or JSON options; the command line wins",
        help="YAML, TOML or JSON file with the same keys as the options (batch_size or batch-size), at the "
             "top level or in sections named after TrainConfig's parts ([network], [sampling], "
             "[optimization], [evaluation], [link], [neutronorch], [placement], [outputs], [logging]); "
             "options given on the command line win")),
    "run_name": (None, dict(
        metavar="NAME", short="results in runs/NAME/ (default: time, model, data)",
        help="keep this run's results (summary.json, metrics.jsonl, last.pt and best.pt) in runs/NAME/ "
             "under the current folder. A run never writes into an existing run's folder: an existing "
             "runs/NAME/ is refused unless --resume (continue that run) or --overwrite (replace its "
             "results). Default: a new folder named by the UTC time, the model and the dataset "
             "(runs/2026-12-03T07-15-02-sage-synthetic/). No run folder is made when an output option "
             "(--summary-json, --checkpoint-dir, --log-jsonl, --log-csv, --tensorboard, --timeline) is "
             "given: the run writes what they name")),
    "save": (True, dict(
        short="no run folder: only the outputs named below",
        help="make no run folder: write only the outputs the options name (with none, the run keeps "
             "nothing)")),
}

TRAIN_EPILOG = ("A run that names no output (--summary-json, ...) keeps its results in runs/.\n"
                "--help-all lists every option; a --config file takes every option as a key.")
TRAIN_EPILOG_ALL = ("A --config file (YAML, TOML or JSON) takes every option as a key, with dashes or "
                    "underscores (batch-size or batch_size; no-progress: true); a key set to null keeps its "
                    "default; options given on the command line win.")

class _Formatter(argparse.HelpFormatter):
    """Help texts from column 28 (room for `--device {auto,cpu,cuda}` beside its help), wrapped at spaces
    only (never inside a flag)."""

    def __init__(self, prog: str):
        super().__init__(prog, max_help_position=28)

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        """Descriptions and epilogs: each line of ``text`` a paragraph of its own."""
        return "\n".join(textwrap.fill(" ".join(line.split()), width, initial_indent=indent,
                                        subsequent_indent=indent, break_on_hyphens=False)
                          for line in text.splitlines())


# Options whose value is a list that may start with a negative number (`--fanouts -1,10`).
_LIST_OPTIONS = frozenset({"--fanouts", "--eval-fanouts"})
_NEGATIVE_LEADING = re.compile(r"-\d")


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that reads ``--fanouts -1,10`` as ``--fanouts=-1,10`` (argparse takes a word
    starting with '-' for a flag unless it is a single negative number), and refuses empty values."""

    def parse_known_args(self, args=None, namespace=None):
        joined: list[str] = []
        for word in sys.argv[1:] if args is None else args:
            if joined and joined[-1] in _LIST_OPTIONS and _NEGATIVE_LEADING.match(word):
                joined[-1] = f"{joined[-1]}={word}"
            else:
                joined.append(word)
        namespace, rest = super().parse_known_args(joined, namespace)
        for action in self._actions:  # "" is no path or value: read as the current folder or as not given
            if isinstance(getattr(namespace, action.dest, None), str) and not getattr(namespace, action.dest).strip():
                self.error(f"argument {'/'.join(action.option_strings) or action.metavar or action.dest}: an empty "
                           f"value; give one, or leave the option out.")
        return namespace, rest

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but an unknown option is refused by its command's parser (its usage shown), with the
        option it may have meant (``--hiden``: ``--hidden``; ``--learning-rate``: ``--lr``)."""
        namespace, rest = self.parse_known_args(args, namespace)
        if rest:
            commands = next((a.choices for a in self._actions if isinstance(a, argparse._SubParsersAction)), {})
            parser = commands.get(getattr(namespace, "command", None), self)
            flags = {flag[2:] for action in parser._actions for flag in action.option_strings if flag.startswith("--")}
            hints = [f"{word.split('=')[0]}: {hint[2:].replace('did you mean ', 'did you mean --')}" for word in rest
                     if word.startswith("--") and (hint := did_you_mean(word[2:].split("=")[0], flags))]
            parser.error(f"unrecognized arguments: {' '.join(rest)}" + (f" ({'; '.join(hints)})" if hints else ""))
        return namespace


class _HelpAll(argparse.Action):
    """``--help-all``: the command's help with every option (``add_options(parser, full=True)``), then exit."""

    def __init__(self, option_strings, dest, add_options, **kwargs):
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, **kwargs)
        self.add_options = add_options

    def __call__(self, parser, namespace, values, option_string=None):
        full = _Parser(prog=parser.prog, description=parser.description, formatter_class=_Formatter,
                       add_help=False)
        self.add_options(full, full=True)
        full.print_help()
        parser.exit()


def _help_options(parser: argparse.ArgumentParser, full: bool, add_options, listed: bool = True) -> None:
    """-h/--help and --help-all; ``listed``: the short help lists them (train's names them in its usage)."""
    parser.add_argument("-h", "--help", action="help",
                        help="the short help" if full else _shown("this help", listed))
    parser.add_argument("--help-all", action=_HelpAll, add_options=add_options,
                        help="this help" if full else _shown("every option, the advanced ones too", listed))


def _shown(text: str, listed: bool) -> str:
    return text if listed else argparse.SUPPRESS


def _add_train_options(parser: argparse.ArgumentParser, full: bool = False) -> None:
    """train's options in their groups; ``full``: the help lists every option (--help-all), else those with
    a short help."""
    parser.usage = ("%(prog)s [-h | --help-all] [--dataset SPEC] [OPTION ...]"
                    if not full else "%(prog)s [OPTION ...]")
    parser.epilog = TRAIN_EPILOG_ALL if full else TRAIN_EPILOG
    _help_options(parser, full, _add_train_options, listed=False)
    defaults = TrainConfig()  # each setting with its option (OPTION_SPEC), and the command line's own
    options = {f.name: (getattr(defaults, f.name), f.metadata) for f in setting_fields()} | RUN_OPTIONS
    grouped = {name for _, _, names in TRAIN_GROUPS for name in names}
    unlisted = [name for name in options if name not in grouped]
    for title, description, names in TRAIN_GROUPS:
        group = parser.add_argument_group(title, description if full else None)
        for name in names + (unlisted if title == "advanced" else []):
            flag, kwargs = _train_option(name, *options[name], full)
            group.add_argument(flag, **kwargs)


def _train_option(name: str, default, option: dict, full: bool) -> tuple[str, dict]:
    """A setting's flag and its ``add_argument`` keywords, from its default and option: a bool setting is a
    switch (``--residual``; ``--no-progress`` for one that is on by default)."""
    flag = "--" + name.replace("_", "-")
    text = option["help"] if full else option.get("short", "")
    if full and default is not None and not isinstance(default, bool):
        text += f" (default: {','.join(map(str, default)) if isinstance(default, list) else default})"
    kwargs = {"dest": name, "default": argparse.SUPPRESS,
              "help": _shown(text, full or option.get("short") is not None)}
    if isinstance(default, bool):
        switch = "--no-" + flag[2:] if default else flag
        return switch, kwargs | {"action": "store_false" if default else "store_true"}
    if option.get("choices") is not None:
        kwargs["choices"] = option["choices"]
        if not full and option.get("metavar"):
            kwargs["metavar"] = option["metavar"]
        return flag, kwargs
    kind = option.get("type") or type(default)
    kwargs["metavar"] = option.get("metavar", "N" if kind is int else name.upper())
    if kind in (int, float):
        kwargs["type"] = kind
    return flag, kwargs


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="neutronorch",
        description="Sample-based GNN training on CPU and GPU together (NeutronOrch).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text, description, add_options in _COMMANDS:
        # convert, partition and info have no --help-all: argparse's own -h
        add_options(commands.add_parser(name, help=text, description=description, formatter_class=_Formatter,
                                        add_help=name in ("convert", "partition", "info")))
    return parser


def _add_convert_options(convert: argparse.ArgumentParser) -> None:
    convert.add_argument("source", help="what to read: a dataset spec as train's --dataset (docs/datasets.md), "
                                        "your edge table or a JODIE/TGN interaction CSV (docs/temporal.md)")
    convert.add_argument("out_dir", help="output directory")
    convert.add_argument("--split", default=None, help=(
        "for data without a split: ratio:TRAIN,VAL or per-class:TRAIN,VAL (default: the data's own, else "
        "ratio:0.6,0.2; synthetic: ratio:0.1,0.05), or with your tables a split table"))
    convert.add_argument("--seed", type=int, default=0, help="seed of the split (default: 0)")
    convert.add_argument("--times", action="store_true", help="keep an OGB node dataset's years as vertex times")
    tables = convert.add_argument_group(
        "your own tables", "SOURCE is your edge table ('src,dst' lines, .npy or JSON); ids other than 0..n-1 are "
        "renumbered, kept in OUT_DIR/node_ids.npy (docs/datasets.md)")
    tables.add_argument("--features", metavar="FILE", help="'id,x1,x2,...' lines, a .npy in id order, or JSON "
                                                          "(none: each vertex learns an embedding)")
    tables.add_argument("--labels", metavar="FILE", help="'id,label' lines (a class number or name), in id order, "
                                                        "or JSON (none: for --task link only)")
    tables.add_argument("--label-column", metavar="COL", help="the labels' column: header name or index from 0")
    tables.add_argument("--directed", action="store_true", help="messages only from each edge's first to second id")
    tables.add_argument("--header", choices=HEADERS, default="auto",
                        help="whether the first line is a header (default: auto)")
    tables.add_argument("--name", help="dataset name (default: OUT_DIR's; else SOURCE's)")
    _add_write_options(convert, "OUT_DIR", " (it may be SOURCE itself)")


# generate's options that shape the graph beyond its size: listed by --help-all.
_GENERATE_ADVANCED = ("power", "homophily", "noise", "train", "val", "recent", "closing")
_GENERATE_HELP = {"nodes": "vertices", "degree": "average in-degree", "features": "feature width",
                  "classes": "label classes", "power": "Zipf exponent of the vertex weights: larger, heavier hubs",
                  "homophily": "share of edges within a class", "noise": "feature noise per dimension",
                  "train": "share of training vertices", "val": "share of validation vertices",
                  "seed": "seed of the graph, its features and labels"}
# --temporal's own options (synthetic_temporal's arguments that SyntheticSpec has not)
TEMPORAL_ONLY = {"events": "interactions, one per time step", "recent": "newest partners a triangle closes through",
                 "closing": "chance an interaction closes a triangle"}


def generator_defaults() -> dict[str, dict]:
    """The other generators' defaults by switch: what each of SyntheticSpec's options means under it."""
    return {switch: {name: p.default for name, p in inspect.signature(function).parameters.items()}
            for switch, function in (("--typed", synthetic_typed), ("--temporal", synthetic_temporal))}


def _differs(name: str, default, others: dict[str, dict]) -> str:
    """``; --typed: 20000; not with --temporal``: where the other generators' defaults differ or they lack it."""
    said: dict[str, list[str]] = {}
    for switch, defaults in others.items():
        if defaults.get(name, default) != default or name not in defaults:
            said.setdefault(f"{defaults[name]}" if name in defaults else "", []).append(switch)
    return "".join(f"; {', '.join(switches)}: {value}" if value else f"; not with {' or '.join(switches)}"
                   for value, switches in said.items())


def _add_generate_options(gen: argparse.ArgumentParser, full: bool = False) -> None:
    """Each option defaults to None: each generator (``SyntheticSpec``, ``synthetic_typed``,
    ``synthetic_temporal``) has its own."""
    _help_options(gen, full, _add_generate_options)
    gen.add_argument("kind", choices=["synthetic"], help="generator")
    gen.add_argument("--typed", action="store_true",
                     help="a typed graph (papers, authors, institutions, fields; docs/heterogeneous.md) in the "
                          "typed native layout")
    gen.add_argument("--temporal", action="store_true",
                     help="interactions with times that close triangles among recent partners (docs/temporal.md)")
    defaults, others = SyntheticSpec(), generator_defaults()
    options = [(f.name, getattr(defaults, f.name), _GENERATE_HELP[f.name] + " (default: "
                f"{getattr(defaults, f.name)}{_differs(f.name, getattr(defaults, f.name), others)})")
               for f in fields(SyntheticSpec)]
    options += [(name, others["--temporal"][name], f"{text} (--temporal only; default: {others['--temporal'][name]})")
                for name, text in TEMPORAL_ONLY.items()]
    later = []
    for name, default, text in options:
        if name in _GENERATE_ADVANCED:
            later.append((name, default, text))
            continue
        gen.add_argument("--" + name, type=type(default), default=None, help=text)
    gen.add_argument("--out", required=True, help="output directory")
    _add_write_options(gen, "--out")
    advanced = gen.add_argument_group("advanced", "the graph's shape beyond its size" if full else None)
    for name, default, text in later:
        advanced.add_argument("--" + name, type=type(default), default=None, help=_shown(text, full))


def _add_write_options(parser: argparse.ArgumentParser, out: str, same: str = "") -> None:
    """What convert and generate take about the folder they write: halved features, replacing a dataset."""
    halves = parser.add_mutually_exclusive_group()
    halves.add_argument("--float16", action="store_true",
                        help="store features as float16 (half the disk; features beyond +-65504 are refused)")
    halves.add_argument("--bfloat16", action="store_true",
                        help="store features as bfloat16 (half the disk; float32's range, for features "
                             "beyond float16's +-65504 or below its 6e-8)")
    parser.add_argument("--overwrite", action="store_true",
                        help=f"replace the dataset (native or typed) in {out}{same}; without it {out} must not "
                             f"exist or be empty")


def _add_predict_options(pred: argparse.ArgumentParser, full: bool = False) -> None:
    own = {"--pairs": dict(metavar="FILE", help=(
        "score these vertex pairs with a link checkpoint (instead of --nodes): a text file of 'u v' or 'u,v' "
        "lines, or a .npy file of a (P, 2) or (2, P) array (2 x 2 is ambiguous and refused: give a text "
        "file); ids as for --nodes")),
           "--probabilities": dict(action="store_true", help=(
        "write class probabilities (one float32 row per vertex) instead of classes; with --pairs, each "
        "pair's probability (the sigmoid of its logit)"))}
    _inference_options(pred, full, _add_predict_options, own, None,
                       "the predictions here (.npy; with --pairs one float32 score per pair; .csv or .tsv: a "
                       "table of your ids and class names)")


def _add_embed_options(emb: argparse.ArgumentParser, full: bool = False) -> None:
    own = {"--layer": dict(type=int, metavar="K", help=(
        "1 = the bottom layer's output (after its activation) ... the last layer (logits; of a link "
        "checkpoint, the embeddings its head scores); 0 = the inputs (a featureless type's learned embedding "
        "table); a typed graph's default: the last hidden layer")),
           "--node-type": dict(metavar="TYPE", help=(
        "a typed graph: the vertex type whose rows to write (default: the target; one the layer computes)"))}
    _inference_options(emb, full, _add_embed_options, own, "all",
                       "the embeddings here (.npy, float32, a row per vertex; .csv or .tsv: a table, "
                       "each row headed by its id)")


def _inference_options(parser: argparse.ArgumentParser, full: bool, add_options, own: dict[str, dict],
                       nodes: str | None, out: str) -> None:
    """predict's and embed's options: the common ones and the command's ``own`` (flag -> keywords); ``out``:
    what --out is written with; ``nodes``: --nodes' default (None: test, where --pairs is not given)."""
    _help_options(parser, full, add_options)
    parser.add_argument("--checkpoint", required=True, metavar="PATH",
                        help="a checkpoint (DIR/best.pt or DIR/last.pt of --checkpoint-dir)")
    parser.add_argument("--dataset", required=True, metavar="SPEC", help=f"dataset spec: {DATASET_SPEC_HELP}"
                        if full else "the dataset, as train's --dataset takes it")
    parser.add_argument("--out", required=True, metavar="PATH", help=f"write {out}")
    parser.add_argument("--nodes", default=nodes, help="test, val, train, all, or a file of ids (.npy, or text: "
                                                       "one a line, or separated by commas or spaces; your tables' "
                                                       f"where convert renumbered them) (default: {nodes or 'test'})")
    for flag, kwargs in own.items():
        parser.add_argument(flag, **kwargs)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                        help="inference device (default: %(default)s)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace --out if it exists (it may never be one of the inputs)")
    advanced = parser.add_argument_group("advanced")
    advanced.add_argument("--scratch-dir", default="auto", metavar="DIR", help=_shown(
        "memory-map the intermediate layers' embeddings (a row per vertex) in this folder; auto: in memory when "
        "they fit in half the available memory, else beside --out; memory: always in memory (default: "
        "%(default)s)", full))
    advanced.add_argument("--no-progress", dest="progress", action="store_false",
                          help=_shown("no progress bar", full))


# Each command: its name, its line in the command list, its description and what adds its options.
_COMMANDS = (
    ("train", "train a GNN and report accuracy and time per epoch",
     "Train a GNN (GraphSAGE, GCN, GAT; typed graphs: R-GCN, R-GAT) by sampling.", _add_train_options),
    ("convert", "write a dataset in the native format",
     "Read any supported dataset and write the native format (meta.json + memory-mappable .npy arrays).",
     _add_convert_options),
    ("generate", "generate a synthetic graph",
     "Write a synthetic power-law graph with learnable labels in the native format; with --typed, a typed "
     "graph whose labels need its relations, in the typed native layout; with --temporal, one whose links "
     "need their times.", _add_generate_options),
    ("predict", "predict classes, or score vertex pairs, with a trained model",
     "Exact full-neighbour inference of a checkpoint's model: the classes of vertices (--nodes), or with a "
     "link checkpoint (train --task link) the scores of vertex pairs (--pairs). A typed graph's: the target "
     "type's classes, over neighbourhoods sampled as its evaluation sampled them.", _add_predict_options),
    ("embed", "write a trained model's vertex embeddings",
     "The output of one layer of a checkpoint's model over complete neighbourhoods (exact layer-wise "
     "inference); of a typed graph's, a vertex type's rows, over neighbourhoods sampled as its evaluation "
     "sampled them.", _add_embed_options),
    ("partition", "split a dataset into parts for partitioned training",
     "Assign every vertex to one of K parts (METIS, or at random) and write each part's vertices, in-edges, "
     "features, labels and splits as memory-mappable arrays, with a manifest (docs/distributed.md).",
     add_partition_options),
    ("info", "describe a dataset or a partition folder", None,
     lambda info: info.add_argument("dataset", help=f"dataset spec: {DATASET_SPEC_HELP}; or a folder written by "
                                                    f"`neutronorch partition`")),
)
