"""The command line's parser: list options whose value starts with a negative number; --help on one screen,
--help-all with every option, each of which parses and reaches the config as before."""

import json
import re

import pytest

from neutronorch.cli.options import build_parser
from neutronorch.config import TrainConfig


@pytest.mark.parametrize("args, field, value", [
    (["--fanouts", "-1,10"], "fanouts", "-1,10"),
    (["--fanouts=-1,10"], "fanouts", "-1,10"),
    (["--fanouts", "-1"], "fanouts", "-1"),
    (["--fanouts", "15,-1,5"], "fanouts", "15,-1,5"),
    (["--eval-fanouts", "-1,-1"], "eval_fanouts", "-1,-1"),
    (["--eval-fanouts", "-1,10", "--eval-every", "-1"], "eval_fanouts", "-1,10"),
])
def test_list_options_take_values_that_start_with_a_negative_number(args, field, value):
    parsed = build_parser().parse_args(["train", *args])
    assert getattr(parsed, field) == value
    TrainConfig(**{k: v for k, v in vars(parsed).items() if k not in ("command", "config")}).validate()


def test_a_negative_fanout_list_is_not_taken_for_a_flag_after_other_options():
    parsed = build_parser().parse_args(["train", "--epochs", "1", "--fanouts", "-1,10", "--hidden", "8"])
    assert (parsed.epochs, parsed.fanouts, parsed.hidden) == (1, "-1,10", 8)


def test_other_options_still_reject_a_missing_value(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--hidden", "--epochs", "1"])
    assert "expected one argument" in capsys.readouterr().err


# ----- --help on one screen, --help-all with everything -------------------------------------------------

@pytest.mark.parametrize("args, option", [
    (["train", "--dataset", "synthetic:nodes=300", "--summary-json", ""], "--summary-json"),
    (["train", "--dataset", "synthetic:nodes=300", "--config", " "], "--config"),
    (["train", "--dataset", "", "--no-save"], "--dataset"),
    (["convert", "synthetic:nodes=300", ""], "out_dir"),
    (["predict", "--checkpoint", "c.pt", "--dataset", "synthetic", "--out", ""], "--out"),
    (["info", ""], "dataset"),
])
def test_an_empty_value_is_refused_never_read_as_the_current_folder_or_as_not_given(args, option, capsys):
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(args)
    assert caught.value.code == 2
    assert f"argument {option}: an empty value" in capsys.readouterr().err


import argparse  # noqa: E402
from dataclasses import fields  # noqa: E402

from neutronorch.cli import main  # noqa: E402
from neutronorch.config_keys import load_config_file  # noqa: E402

# Tuning and diagnostic knobs: listed by --help-all only, in its advanced group.
ADVANCED = ["--snapshot-lead", "--hot-error-budget", "--hot-set", "--cache-policy", "--read-order",
            "--host-cache-gb", "--host-cache-dir", "--embedding-storage", "--embedding-dir", "--sampler-threads",
            "--host-threads", "--threads", "--prefetch", "--log-every", "--timeline", "--timeline-steps",
            "--device-sampling", "--dist-timeout", "--no-progress", "--no-stage-table"]
# What a first run needs: the options --help lists.
ESSENTIAL = ["--dataset", "--split", "--task", "--model", "--hidden", "--fanouts", "--epochs", "--batch-size", "--lr",
             "--seed", "--mode", "--device", "--precision", "--gpu-memory-gb", "--hot-ratio", "--super-batch",
             "--run-name", "--no-save", "--summary-json", "--checkpoint-dir", "--resume", "--overwrite", "--config"]


def _subcommand(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")}


def _help(argv: list[str], capsys, monkeypatch, columns: int = 100) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    return capsys.readouterr().out


def _listed(text: str) -> set[str]:
    """The flags a help text lists as options (at the start of an indented line)."""
    return {m for line in text.splitlines() if line.startswith("  --") or line.startswith("  -h")
            for m in re.findall(r"--[a-z][a-z0-9-]*", line.split("  ")[1])}


def test_train_help_fits_on_one_screen_and_lists_only_what_a_first_run_needs(capsys, monkeypatch):
    text = _help(["train", "--help"], capsys, monkeypatch)
    lines = text.splitlines()
    assert len(lines) <= 40, f"{len(lines)} lines:\n{text}"
    assert max(map(len, lines)) <= 100
    listed = _listed(text)
    assert set(ESSENTIAL) <= listed, set(ESSENTIAL) - listed
    assert not listed & set(ADVANCED), listed & set(ADVANCED)
    assert len(listed) <= 25, sorted(listed)
    for title in ("data:", "model:", "training:", "mode:", "outputs:"):
        assert title in lines, title
    assert "advanced:" not in text
    assert "--help-all" in lines[-1] and "--config" in lines[-1], lines[-1]
    assert re.search(r"--mode \{exact,device,neutronorch,auto\}", text)  # bench/regime.py reads the modes here


COMMANDS = ["train", "convert", "generate", "predict", "embed", "partition", "info"]


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_every_short_help_fits_on_one_screen(command, capsys, monkeypatch):
    lines = _help([command, "--help"] if command else ["--help"], capsys, monkeypatch).splitlines()
    assert len(lines) <= 40 and max(map(len, lines)) <= 100, "\n".join(lines)
    # and on an 80-column terminal, where the help texts wrap: at most 45 lines, none wider than the screen
    lines = _help([command, "--help"] if command else ["--help"], capsys, monkeypatch, columns=80).splitlines()
    assert len(lines) <= 45 and max(map(len, lines)) <= 80, f"{len(lines)} lines:\n" + "\n".join(lines)


def test_train_help_at_80_columns_keeps_its_groups_and_an_option_a_line(capsys, monkeypatch):
    text = _help(["train", "--help"], capsys, monkeypatch, columns=80)
    lines = text.splitlines()
    assert len(lines) <= 42, f"{len(lines)} lines:\n{text}"
    for title in ("data:", "model:", "training:", "mode:", "outputs:"):
        assert title in lines, title
    assert set(ESSENTIAL) <= _listed(text)
    wrapped = [line for line in lines if line.startswith(" " * 28)]  # a help text's second line
    assert len(wrapped) <= 2, wrapped  # --mode's (its choices take the first line) and --split's


def test_the_screen_check_covers_every_command():
    parser = build_parser()
    assert list(next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices) == COMMANDS


def test_train_help_all_lists_every_option_the_advanced_ones_in_their_group(capsys, monkeypatch):
    text = _help(["train", "--help-all"], capsys, monkeypatch)
    assert _listed(text) == _flags(_subcommand("train")), _flags(_subcommand("train")) ^ _listed(text)
    advanced = text[text.index("\nadvanced:"):]
    assert set(ADVANCED) <= _listed(advanced), set(ADVANCED) - _listed(advanced)
    assert not set(ESSENTIAL) & _listed(advanced)


@pytest.mark.parametrize("command", ["generate", "predict", "embed"])
def test_other_commands_keep_their_advanced_options_for_help_all(command, capsys, monkeypatch):
    advanced = {"generate": {"--power", "--homophily", "--noise", "--train", "--val"},
                "predict": {"--scratch-dir", "--no-progress"}, "embed": {"--scratch-dir", "--no-progress"}}[command]
    short = _help([command, "--help"], capsys, monkeypatch)
    assert not _listed(short) & advanced and "--help-all" in _listed(short)
    assert _listed(_help([command, "--help-all"], capsys, monkeypatch)) == _flags(_subcommand(command))


def test_every_config_field_has_exactly_one_flag():
    dests = [a.dest for a in _subcommand("train")._actions if a.option_strings and a.dest != argparse.SUPPRESS]
    assert sorted(d for d in dests if d not in ("help", "config", "run_name", "save")) == sorted(TrainConfig.keys())


# Every option --help leaves out, with a value other than its default, and the config value it must give.
NOT_SHORT = [
    (["--split-index", "3"], "split_index", 3),
    (["--partitions", "parts"], "partitions", "parts"),
    (["--deal-by", "parts"], "deal_by", "parts"),
    (["--times"], "times", True),
    (["--normalize-features", "row"], "normalize_features", "row"),
    (["--layers", "2"], "layers", 2),
    (["--link-head", "mlp"], "link_head", "mlp"),
    (["--negatives", "4"], "negatives", 4),
    (["--eval-negatives", "50"], "eval_negatives", 50),
    (["--link-direction", "directed"], "link_direction", "directed"),
    (["--link-relation", "paper/cites/paper"], "link_relation", "paper/cites/paper"),
    (["--temporal-strategy", "last"], "temporal_strategy", "last"),
    (["--heads", "8"], "heads", 8),
    (["--gcn-norm", "mean"], "gcn_norm", "mean"),
    (["--residual"], "residual", True),
    (["--norm", "layer"], "norm", "layer"),
    (["--architecture", "blocks"], "architecture", "blocks"),
    (["--weight-decay", "0.01"], "weight_decay", 0.01),
    (["--dropout", "0.5"], "dropout", 0.5),
    (["--patience", "3"], "patience", 3),
    (["--metric", "rocauc"], "metric", "rocauc"),
    (["--eval-every", "2"], "eval_every", 2),
    (["--eval-fanouts", "-1,5"], "eval_fanouts", [-1, 5]),
    (["--eval-batch-size", "128"], "eval_batch_size", 128),
    (["--eval-max-nodes", "50"], "eval_max_nodes", 50),
    (["--staleness-bound", "20"], "staleness_bound", 20),
    (["--hot-grad", "stop"], "hot_grad", "stop"),
    (["--gpu-cache-gb", "1.5"], "gpu_cache_gb", 1.5),
    (["--checkpoint-every", "5", "--checkpoint-dir", "ck"], "checkpoint_every", 5),
    (["--log-jsonl", "m.jsonl"], "log_jsonl", "m.jsonl"),
    (["--log-csv", "m.csv"], "log_csv", "m.csv"),
    (["--tensorboard", "tb"], "tensorboard", "tb"),
    (["--snapshot-lead", "3"], "snapshot_lead", 3),
    (["--hot-error-budget", "0.05"], "hot_error_budget", 0.05),
    (["--hot-set", "node"], "hot_set", "node"),
    (["--device-sampling", "off"], "device_sampling", "off"),
    (["--cache-policy", "degree"], "cache_policy", "degree"),
    (["--read-order", "file"], "read_order", "file"),
    (["--host-cache-gb", "0"], "host_cache_gb", 0.0),
    (["--host-cache-dir", "scratch"], "host_cache_dir", "scratch"),
    (["--embedding-storage", "mmap"], "embedding_storage", "mmap"),
    (["--embedding-dir", "tables"], "embedding_dir", "tables"),
    (["--threads", "2"], "threads", 2),
    (["--sampler-threads", "1"], "sampler_threads", 1),
    (["--host-threads", "1"], "host_threads", 1),
    (["--prefetch", "4"], "prefetch", 4),
    (["--timeline", "t.png"], "timeline", "t.png"),
    (["--console-log", "c.log"], "console_log", "c.log"),
    (["--curves", "c.png"], "curves", "c.png"),
    (["--timeline-steps", "10"], "timeline_steps", 10),
    (["--log-every", "5"], "log_every", 5),
    (["--no-progress"], "progress", False),
    (["--no-stage-table"], "stage_table", False),
    (["--dist-timeout", "30"], "dist_timeout", 30.0),
]


def test_the_cases_cover_every_option_help_leaves_out():
    covered = {args[0] for args, _, _ in NOT_SHORT}
    assert covered == _flags(_subcommand("train")) - set(ESSENTIAL) - {"--help", "--help-all"}


@pytest.mark.parametrize("args, field, value", NOT_SHORT, ids=[args[0] for args, _, _ in NOT_SHORT])
def test_options_help_leaves_out_still_parse_and_reach_the_config(args, field, value, tmp_path):
    parsed = build_parser().parse_args(["train", *args])
    config = TrainConfig(**{k: v for k, v in vars(parsed).items() if k not in ("command", "config")}).validate()
    assert getattr(config, field) == value
    # ... and a config file takes them under the same names (the switches under their flags' names too).
    key, word = args[0][2:], "true" if args[0].startswith("--no-") else json.dumps(value)
    (tmp_path / "run.yaml").write_text(f"{key}: {word}\n" + ("checkpoint_dir: ck\n" if "--checkpoint-dir" in args
                                                             else ""))
    assert getattr(TrainConfig(**load_config_file(tmp_path / "run.yaml")).validate(), field) == value


def test_defaults_stay_out_of_the_parsed_options():
    """Only options given on the command line are set, so a --config file's values are not overridden."""
    assert vars(build_parser().parse_args(["train"])) == {"command": "train"}


def test_a_config_file_takes_sections_named_after_the_configs_parts(tmp_path, capsys):
    from neutronorch.errors import ConfigError

    (tmp_path / "run.toml").write_text('dataset = "synthetic:nodes=500"\n[network]\nhidden = 64\n'
                                       '[sampling]\nfanouts = [5, 3]\nbatch-size = 32\n[logging]\nno_progress = true\n'
                                       '[outputs]\nrun_name = "a"\n')
    values = load_config_file(tmp_path / "run.toml", extra={"run_name": "outputs"})
    assert values == {"dataset": "synthetic:nodes=500", "hidden": 64, "fanouts": [5, 3], "batch_size": 32,
                      "progress": False, "run_name": "a"}
    assert set(TrainConfig.sections()) == {"network", "sampling", "optimization", "evaluation", "link",
                                           "neutronorch", "placement", "outputs", "logging"}
    (tmp_path / "wrong.yaml").write_text("network:\n  epochs: 3\n")
    with pytest.raises(ConfigError, match=r"'epochs' is under \[network\], but belongs under \[optimization\]"):
        load_config_file(tmp_path / "wrong.yaml")
    (tmp_path / "top.yaml").write_text("sampling:\n  dataset: cora\n")  # the run's own settings have no section
    with pytest.raises(ConfigError, match=r"'dataset' is under \[sampling\], but belongs at the top level"):
        load_config_file(tmp_path / "top.yaml")
    (tmp_path / "twice.yaml").write_text("hidden: 8\nnetwork:\n  hidden: 16\n")
    with pytest.raises(ConfigError, match="earlier key sets too"):
        load_config_file(tmp_path / "twice.yaml")
    # The command line reads its config file with the same sections, and says what is misplaced.
    assert main(["train", "--config", str(tmp_path / "wrong.yaml")]) != 0
    assert "belongs under [optimization]" in capsys.readouterr().err


def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    """`neutronorch info DIR | head -1` and the like: the reader has gone, so the command stops as a Unix
    tool stopped by SIGPIPE does (status 141), with no traceback, and what it wrote to disk stays."""
    import os
    import subprocess
    import sys

    def run(*argv):
        read, write = os.pipe()
        os.close(read)  # the reader has gone before the command writes
        try:
            done = subprocess.run([sys.executable, "-m", "neutronorch", *argv], stdout=write, stderr=subprocess.PIPE,
                                  text=True, timeout=120)
        finally:
            os.close(write)
        return done

    out = tmp_path / "g"
    done = run("generate", "synthetic", "--nodes", "200", "--out", str(out))
    assert done.returncode == 141 and "Traceback" not in done.stderr, done.stderr
    assert (out / "meta.json").is_file()
    done = run("info", str(out))
    assert done.returncode == 141 and done.stderr == "", done.stderr


BAD_ENVIRONMENT = [("NEUTRONORCH_DEVICE_SAMPLER", "bogus", "auto, torch, triton"),
                   ("NEUTRONORCH_EDGE_SOFTMAX", "fast", "kernels, torch"), ("NEUTRONORCH_SYSTEM_MALLOC", "yes", "0, 1"),
                   ("NUMBA_THREADING_LAYER", "bogus", "default, omp, tbb"),
                   ("NUMBA_THREADING_LAYER", "workqueue", "cannot run numba kernels from several threads"),
                   ("NUMBA_NUM_THREADS", "0", "whole number from 1"), ("NUMBA_NUM_THREADS", "four", "whole number from 1"),
                   ("WORLD_SIZE", "two", "whole number from 1"), ("LOCAL_RANK", "-1", "whole number from 0")]


@pytest.mark.parametrize("name, value, allowed", BAD_ENVIRONMENT)
@pytest.mark.parametrize("command", [["train", "--dataset", "synthetic:nodes=200", "--epochs", "1", "--no-save"],
                                     ["info", "synthetic:nodes=200"]])
def test_a_bad_environment_variable_is_one_line_naming_it_and_its_values(name, value, allowed, command, capsys,
                                                                          monkeypatch):
    monkeypatch.setenv(name, value)
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"neutronorch: error: {name}=") and value in err and allowed in err, err
    assert err.count("\n") == 1, err


def test_a_triton_device_sampler_that_cannot_run_is_refused_before_the_run(capsys, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("Triton runs on this machine's GPU")
    monkeypatch.setenv("NEUTRONORCH_DEVICE_SAMPLER", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert main(["train", "--dataset", "synthetic:nodes=200", "--epochs", "1", "--no-save", "--mode", "device"]) == 2
    err = capsys.readouterr().err
    assert "NEUTRONORCH_DEVICE_SAMPLER=triton" in err and "torch or auto" in err and "loaded" not in err, err


@pytest.mark.parametrize("variable", ["NUMBA_NUM_THREADS=0", "NUMBA_THREADING_LAYER=forksafe"])
def test_numba_variables_that_fail_its_import_or_its_threads_are_one_line(variable, tmp_path):
    """numba reads NUMBA_NUM_THREADS when it is imported (0 fails the import); forksafe gives, on Linux,
    the workqueue layer the pipeline cannot use, met only when the threads start."""
    import os
    import subprocess
    import sys

    name, value = variable.split("=")
    environ = {**os.environ, name: value}
    done = subprocess.run([sys.executable, "-m", "neutronorch", "train", "--dataset", "synthetic:nodes=200", "--epochs",
                           "1", "--no-save"], capture_output=True, text=True, env=environ, timeout=300, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith(f"neutronorch: error: {name}="), done.stderr
    assert "Traceback" not in done.stderr
    if name == "NUMBA_NUM_THREADS":  # and from Python, where numba is first imported: the public names
        done = subprocess.run([sys.executable, "-c", "from neutronorch import train"], capture_output=True, text=True,
                              env=environ, timeout=300)
        assert "ConfigError: NUMBA_NUM_THREADS='0' is not a whole number from 1" in done.stderr, done.stderr
