"""The commands: what each one runs and prints, and the log handler (the progress bar: ``progress.py``)."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import logging
import re
import signal
import sys
import threading
import time
from dataclasses import fields
from pathlib import Path

from neutronorch.cli.again import resume_command, to_console_log
from neutronorch.cli.convert import check_native_out, cmd_convert, write_dataset
from neutronorch.cli.info import dataset_info
from neutronorch.cli.options import RUN_FOLDER_KEYS, TEMPORAL_ONLY, build_parser
from neutronorch.cli.partition import cmd_partition
from neutronorch.cli.progress import ProgressBar
from neutronorch.config import TrainConfig
from neutronorch.config_keys import load_config_file
from neutronorch.data import (SyntheticSpec, dataset_paths, generate, is_typed_dataset, load_dataset,
                              load_typed_dataset, synthetic_temporal, synthetic_typed)
from neutronorch.environment import launcher_rank
from neutronorch.errors import ConfigError, Interrupted, NeutronorchError
from neutronorch.train.outputs import marked


_FIELD = re.compile(r"(?<!`)`([a-z][a-z0-9_]*)`(?!`)")


def as_flags(message: str) -> str:
    """The core's `field_name` references as the command line's --field-name flags."""
    known = set(TrainConfig.keys()) | {"layer", "nodes", "pairs", "out", "scratch_dir", "node_type",  # predict, embed
                                       "run_name", "no_save", "parts", "method",  # train's run folder, partition
                                       "label_column"}  # convert of your tables
    return _FIELD.sub(lambda m: "--" + m[1].replace("_", "-") if m[1] in known else m[0], message)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (it may be replaced after logging is set up): messages
    with flags for field names, warnings marked, each of their lines prefixed with ``prefix`` (the rank)."""

    _neutronorch_cli = True
    stream = property(lambda self: sys.stderr, lambda self, value: None)

    def __init__(self, prefix: str = ""):
        super().__init__()
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        text = marked(record, as_flags(record.getMessage()))
        return "\n".join(self.prefix + line for line in text.split("\n")) if self.prefix else text


def _configure_logging() -> None:
    """Log lines to stderr. Launched data parallel, rank 0 logs as one process does and the other ranks
    only their warnings and errors, each line prefixed with the rank."""
    logger = logging.getLogger("neutronorch")
    rank = launcher_rank()
    if not any(getattr(h, "_neutronorch_cli", False) for h in logger.handlers):
        logger.addHandler(_StderrHandler("" if rank is None else f"[rank {rank}] "))
    logger.setLevel(logging.INFO if not rank else logging.WARNING)


def _cmd_train(args: argparse.Namespace) -> int:
    given = [args.config] if getattr(args, "config", None) else []
    values = load_config_file(given[0], extra=dict.fromkeys(RUN_FOLDER_KEYS, "outputs")) if given else {}
    values.update({k: v for k, v in vars(args).items() if k not in ("command", "config", "words")})
    run_name, save = values.pop("run_name", None), values.pop("save", True)
    rank = launcher_rank()
    config, folder = _outputs(TrainConfig(**values), run_name, save, given, rank)
    try:
        return _train(config, folder, rank, getattr(args, "words", None))
    except BaseException as exc:
        # The console copy ends as the console did; not an earlier run's copy that --overwrite put back.
        if isinstance(exc, NeutronorchError) and not rank and not getattr(exc, "earlier_kept", False):
            to_console_log(config.console_log, f"neutronorch: error: {as_flags(str(exc))}")
        if folder is not None:
            folder.discard_if_empty()  # the run failed before writing anything: it leaves no folder
        raise


def _outputs(config: TrainConfig, run_name, save, config_file: list, rank: int | None) -> tuple:
    """The config with its outputs: what its output options name, else (unless --no-save) a run folder, made
    here (``train/outputs.py``); and that folder, or None."""
    from neutronorch.train.output_guard import check_distinct
    from neutronorch.train.outputs import RUNS, generated_run_name, names_outputs, open_run_folder, run_outputs

    if run_name is not None and not isinstance(run_name, str):
        raise ConfigError(f"`run_name` {run_name!r}: expected a string (a folder name).")
    if not isinstance(save, bool):
        raise ConfigError(f"`no_save` {save!r}: expected true or false.")
    if names_outputs(config) or not save:
        if run_name is not None:
            raise ConfigError(f"`run_name` {run_name}: names a run folder, which "
                              + ("`no_save` turns off" if not save else "is made only when no output option is "
                                 "given (`summary_json`, `checkpoint_dir`, the logs)")
                              + ". Give one or the other.")
        if config_file:  # train() checks its outputs against the dataset; the file is ours
            check_distinct({"config": config_file}, run_outputs(config))
        return config, None
    if rank:  # another rank of a data-parallel run: rank 0 makes the folder and writes what goes into it
        return dataclasses.replace(config, checkpoint_dir=str(RUNS / (run_name or generated_run_name(config)))), None
    return open_run_folder(config, run_name, {"config": config_file} if config_file else None)


def _train(config: TrainConfig, folder, rank: int | None, words: list[str] | None = None) -> int:
    from neutronorch.observe.report import peak_summary, reuse_summary
    from neutronorch.train.trainer import train

    bar = ProgressBar() if config.progress and not rank else None
    stop, received = threading.Event(), []

    def on_signal(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt(signum)  # a second signal: stop at once, exiting with 128 + its number
        received.append(signum)
        stop.set()
        logging.getLogger("neutronorch").warning(
            f"{signal.Signals(signum).name}: finishing the current step, then saving and stopping (send it "
            f"again to stop at once)")

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        summary = train(config, progress=bar, stop=stop)
    except Interrupted as exc:
        again = resume_command(None if rank is not None else words, folder.path.name if folder else None)
        saved = (f"results so far in {folder.path}/; continue it with {again}" if folder is not None else
                 f"continue it from {config.checkpoint_dir}/last.pt with {again}" if config.checkpoint_dir
                 else "nothing was saved (no --checkpoint-dir)")
        if config.checkpoint_dir and not (Path(config.checkpoint_dir) / "last.pt").is_file():
            saved = "it stopped before its first checkpoint: there is nothing to resume, start it again"
        if getattr(exc, "earlier_kept", False):  # --overwrite, stopped before this run's first checkpoint
            saved = "it stopped before its first checkpoint: the earlier run's results it was to replace are kept"
        if not rank:
            print(f"neutronorch: interrupted: {exc}; {saved}", file=sys.stderr)
            if not getattr(exc, "earlier_kept", False):
                to_console_log(config.console_log, f"neutronorch: interrupted: {exc}; {saved}")
        return 128 + (received[0] if received else signal.SIGTERM)  # a rank stopped by another's signal
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if bar is not None:
            bar.close()
    if rank:
        return 0  # rank 0 reports
    metric = summary["metric"]
    scores = (f"val {metric} {summary['val_acc']:.4f}, test {metric} {summary['test_acc']:.4f}, "
              if summary["test_acc"] is not None else "not evaluated, ")
    reuse = reuse_summary(summary)
    lines = [f"{summary['dataset']['name']}: mode {summary['mode']}, model {config.model}, {scores}epoch time median "
             f"{summary['epoch_seconds_median']:.2f}s, {peak_summary(summary)}"
             + (f"; {reuse}" if reuse else "") if summary["epochs"] else "no epochs run"]
    if config.curves and Path(config.curves).is_file():
        lines.append(f"training curves in {config.curves}")
    if folder is not None:
        lines.append(f"results in {folder.path}/")
    print("\n".join(lines))
    if config.console_log:  # the run's own copy of its lines: what was printed goes after them
        with open(config.console_log, "a", encoding="utf-8") as log:
            log.write("\n".join(lines) + "\n")
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    given = {f.name: getattr(args, f.name) for f in fields(SyntheticSpec) if getattr(args, f.name) is not None}
    if args.temporal:
        return _generate_temporal(args, given, t0)
    if only := [f"--{name}" for name in TEMPORAL_ONLY if getattr(args, name) is not None]:
        verb = "apply" if len(only) > 1 else "applies"
        raise ConfigError(f"{', '.join(only)} {verb} only to --temporal (a graph of timed interactions); add "
                          f"--temporal, or leave {', '.join(only)} out.")
    if args.typed and given.pop("classes", None) is not None:
        raise ConfigError("--classes does not apply to --typed: a typed graph's classes are pairs of topics "
                          "(16); leave --classes out, or call neutronorch.data.synthetic_typed(topics=...).")
    if not args.typed:  # synthetic_typed checks its arguments before it draws anything
        spec = SyntheticSpec(**given)
        spec.check("", where="generate synthetic")
    check_native_out("out", args.out, [], args.overwrite, typed=args.typed)
    return write_dataset(synthetic_typed(**given) if args.typed else generate(spec), args.out, args, t0)


def _generate_temporal(args: argparse.Namespace, given: dict, t0: float) -> int:
    """``generate synthetic --temporal``: synthetic_temporal's graph, its arguments checked before the folder."""
    from neutronorch.data.synthetic_temporal import check_arguments

    if args.typed:
        raise ConfigError("--temporal and --typed: the typed generator draws no times, and the temporal one "
                          "draws a homogeneous graph; leave out one of them.")
    taken = inspect.signature(synthetic_temporal).parameters
    if unused := [f"--{name}" for name in given if name not in taken]:
        verb = "do" if len(unused) > 1 else "does"
        raise ConfigError(f"{', '.join(unused)} {verb} not apply to --temporal: its graph is drawn from "
                          f"interactions (--events), with noise features and meaningless labels (docs/temporal.md); "
                          f"leave {', '.join(unused)} out.")
    given |= {name: getattr(args, name) for name in TEMPORAL_ONLY if getattr(args, name) is not None}
    options = {name: p.default for name, p in taken.items()} | given
    check_arguments(**options)
    check_native_out("out", args.out, [], args.overwrite)
    return write_dataset(synthetic_temporal(**options), args.out, args, t0)


def _inference(args: argparse.Namespace, pairs: bool | None = None) -> tuple:
    """predict's (``pairs``: whether --pairs is given) and embed's shared part, ordered so that a wrong
    request fails before a large dataset is read. Returns the checkpoint, the graph, --nodes as predict and
    embed take it (``given_ids``) and the call's options."""
    from neutronorch.cli.ids import given_ids
    from neutronorch.cli.table_out import TEXT_OUT, is_text_out
    from neutronorch.train.checkpoint import HOMOGENEOUS, TYPED, load_checkpoint
    from neutronorch.train.predict import check_asked, check_task
    from neutronorch.train.prediction_io import NODE_SETS, check_output_path
    from neutronorch.train.resources import resolve_device

    typed, device = is_typed_dataset(args.dataset), resolve_device(args.device)
    scratch = None if args.scratch_dir == "memory" else args.scratch_dir
    if not pairs:  # what the graph's kind cannot honour, said before anything is read
        check_asked("typed" if typed else "homogeneous", scratch=scratch, embedding=pairs is None,
                    layer=getattr(args, "layer", None), node_type=getattr(args, "node_type", None))
    given = getattr(args, "pairs", None)
    reads = {"checkpoint": [args.checkpoint], "dataset": dataset_paths(args.dataset),
             "nodes": [] if args.nodes in (None, *NODE_SETS) else [args.nodes], "pairs": [given] if given else []}
    check_output_path(args.out, scratch, reads, args.overwrite, TEXT_OUT)
    # Read once, here, so a bad file fails before the data loads (your tables' ids where convert renumbered them).
    nodes, options = given_ids(args)
    checkpoint = load_checkpoint(args.checkpoint, kind=TYPED if typed else HOMOGENEOUS)
    if pairs is not None:
        check_task(checkpoint, pairs)
    graph = (load_typed_dataset if typed else load_dataset)(args.dataset)
    # A text table is written from the rows in memory, once they are all computed (table_out.py).
    options.update(device=str(device), out=None if is_text_out(args.out) else args.out, scratch=scratch,
                   overwrite=args.overwrite,
                   progress=ProgressBar("layer", "vertex") if args.progress else None)
    return checkpoint, graph, nodes, options


def _cmd_predict(args: argparse.Namespace) -> int:
    from neutronorch.cli.table_out import is_text_out, write_pair_scores, write_predictions
    from neutronorch.train.link_predict import score_pairs
    from neutronorch.train.predict import predict, prediction_score
    from neutronorch.train.prediction_io import select_nodes

    t0, pairs = time.perf_counter(), args.pairs is not None
    if pairs and args.nodes is not None:
        raise ConfigError(f"`nodes` {args.nodes} and `pairs` {args.pairs}: give one. `pairs` scores vertex "
                          f"pairs with a link checkpoint; `nodes` chooses the vertices a node-classification "
                          f"checkpoint classifies.")
    args.nodes = "test" if args.nodes is None and not pairs else args.nodes
    checkpoint, graph, nodes, options = _inference(args, pairs=pairs)
    if pairs:  # a link checkpoint's score of each pair: its logit, or --probabilities
        out = score_pairs(checkpoint, graph, probabilities=args.probabilities, **options)
        if is_text_out(args.out):
            write_pair_scores(args.out, args.dataset, options["pairs"], out, args.probabilities)
        what = "probabilities" if args.probabilities else "logits"
        print(f"scored {out.shape[0]:,} pair{'' if out.shape[0] == 1 else 's'} of {graph.name} ({what}), wrote them to {args.out} in "
              f"{time.perf_counter() - t0:.1f}s")
        return 0
    out = predict(checkpoint, graph, nodes, args.probabilities, **options)
    if is_text_out(args.out):
        write_predictions(args.out, args.dataset, select_nodes(graph, nodes), out, args.probabilities)
    line = f"wrote {out.shape[0]:,} predictions of {graph.name} to {args.out} in {time.perf_counter() - t0:.1f}s"
    if args.nodes in ("test", "val", "train"):
        metric, value = prediction_score(graph, args.nodes, out, args.probabilities)
        line += f"; {args.nodes} {metric} {value:.4f}"
    print(line)
    return 0


def _cmd_embed(args: argparse.Namespace) -> int:
    from neutronorch.cli.table_out import is_text_out, write_embeddings
    from neutronorch.train.predict import embed
    from neutronorch.train.prediction_io import select_nodes

    t0 = time.perf_counter()
    checkpoint, graph, nodes, options = _inference(args)
    out = embed(checkpoint, graph, args.layer, nodes, node_type=args.node_type, **options)
    if is_text_out(args.out):
        write_embeddings(args.out, args.dataset, select_nodes(graph, nodes, args.node_type), out)
    which = ("the last hidden layer" if args.layer is None else f"layer {args.layer}") + (
        f", vertex type {args.node_type}" if args.node_type else "")
    print(f"wrote {out.shape[0]:,} x {out.shape[1]} embeddings ({which}) of {graph.name} to {args.out} in "
          f"{time.perf_counter() - t0:.1f}s")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    print(json.dumps(dataset_info(args.dataset), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "train":  # its words, for the command that continues a stopped run
        words = list(sys.argv[1:] if argv is None else argv)
        args.words = words[words.index("train") + 1:]
    handlers = {"train": _cmd_train, "convert": cmd_convert, "generate": _cmd_generate, "info": _cmd_info,
                "partition": cmd_partition, "predict": _cmd_predict, "embed": _cmd_embed}
    _configure_logging()
    terminated = []
    own_term = args.command != "train" and threading.current_thread() is threading.main_thread()
    if own_term:
        # SIGTERM unwinds like Ctrl-C, so the partial files of a write in progress are removed on the way
        # out (train has its own handler: it finishes the step and saves).
        def on_term(signum, frame):
            terminated.append(signum)
            raise KeyboardInterrupt
        previous = signal.signal(signal.SIGTERM, on_term)
    try:
        return handlers[args.command](args)
    except NeutronorchError as exc:
        rank = launcher_rank()
        where = "" if rank is None else f" (rank {rank})"
        print(f"neutronorch: error{where}: {as_flags(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # train's second signal carries its number
        print("neutronorch: interrupted" + ("; stopped at once, writing nothing more (a last.pt is as it was)"
                                            if args.command == "train" else "; nothing was written"), file=sys.stderr)
        return 128 + (terminated[0] if terminated else exc.args[0] if exc.args else signal.SIGINT)
    finally:
        if own_term:
            signal.signal(signal.SIGTERM, previous)
