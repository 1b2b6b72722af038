"""The documentation against the command line: every option is documented, and every command README.md
shows parses as written and runs (in a smoke form: a tiny graph, one epoch, temporary outputs).

README's commands are read from its code blocks, so a new command or flag there is checked without this
file changing; a placeholder it does not know (an upper-case word such as SPEC) fails until it is added
to ``PLACEHOLDERS``.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

import pytest

from neutronorch.cli import main
from neutronorch.cli.options import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOC_FILES = [README, *sorted((ROOT / "docs").glob("*.md"))]

SPEC = "synthetic:nodes=300,degree=5"  # the smoke runs' graph (a few seconds in all)
# README's placeholders, and the values that stand for them in the parse check (paths: see PATH_FLAGS).
PLACEHOLDERS = {"SPEC": SPEC, "SOURCE": SPEC, "N": "2", "LR": "0.01", "S": "0", "G": "1", "K": "1",
                "NAME": "readme-run"}
# Options whose value is a path: every run gets a fresh one in its temporary folder.
PATH_FLAGS = {"--summary-json": "summary.json", "--checkpoint-dir": "checkpoints", "--host-cache-dir": "host-cache",
              "--log-jsonl": "log.jsonl", "--log-csv": "log.csv", "--tensorboard": "tensorboard",
              "--timeline": "run.png", "--config": "run.yaml", "--out": "out.npy", "--checkpoint": "best.pt",
              "--pairs": "pairs.txt",
              ("generate", "--out"): "dataset", ("partition", "--out"): "partition"}
# Values written as `...` in README (the rest of an option shown in full on an earlier line).
ELLIPSIS = {"--nodes": "all", "--scratch-dir": "auto"}
# The smoke form: sizes that keep each run to about a second, by (command, option).
SMALL = {("train", "--dataset"): SPEC, ("train", "--fanouts"): "5,5", ("train", "--hidden"): "16",
         ("train", "--layers"): "2", ("train", "--batch-size"): "64", ("train", "--epochs"): "1",
         ("predict", "--dataset"): SPEC, ("embed", "--dataset"): SPEC, ("embed", "--layer"): "1",
         ("generate", "--nodes"): "300", ("generate", "--degree"): "5", ("generate", "--features"): "16",
         ("generate", "--classes"): "4", ("generate", "--events"): "2000"}
# Options a smoke run leaves out when the optional package they need is not installed (parsed all the same).
NEEDS = {"--timeline": "matplotlib", "--tensorboard": "tensorboard"}
COMMAND_WORDS = ("neutronorch", "torchrun", "make")


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"]


def _code_blocks(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S)


def _joined_lines(body: str) -> list[str]:
    """A block's lines with backslash continuations joined and trailing `# comments` dropped."""
    lines, current = [], ""
    for raw in body.splitlines():
        current += raw.strip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        line = re.sub(r"\s+#\s.*$", "", current).strip()
        if line:
            lines.append(line)
        current = ""
    return lines


def _units(text: str) -> list[str]:
    """Where a mention counts: each prose paragraph, and each command line of a code block on its own."""
    units = []
    for part in re.split(r"^```\w*\n.*?^```", text, flags=re.M | re.S):
        units += [p for p in re.split(r"\n\s*\n", part) if p.strip()]
    for _, body in _code_blocks(text):
        units += _joined_lines(body)
    return units


def _mentions(unit: str, flag: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", unit) is not None


def test_every_option_of_every_command_is_documented():
    units = [u for f in DOC_FILES for u in _units(f.read_text())]
    missing = []
    for command, parser in _subcommands().items():
        # train's options are documented anywhere; another command's where that command is named too
        # (`neutronorch convert ...`, `convert --float16`), since several share names with train's.
        named = re.compile(rf"neutronorch {command}\b|`{command}\b|\b{command} --")
        for flag in _options(parser):
            if not any(_mentions(u, flag) and (command == "train" or named.search(u)) for u in units):
                missing.append(f"{command} {flag}")
    assert not missing, f"options in `neutronorch ... --help` but in no doc (README.md, docs/*.md): {missing}"


def readme_commands() -> list[str]:
    """The command lines of README's shell code blocks; any other line in such a block fails."""
    commands = []
    for lang, body in _code_blocks(README.read_text()):
        if lang not in ("", "sh", "bash", "console"):
            continue
        lines = _joined_lines(body)
        shown = [line for line in lines if line.split()[0] in COMMAND_WORDS]
        if shown:
            unknown = [line for line in lines if line not in shown]
            assert not unknown, f"README code block lines this test cannot run or check: {unknown}"
            commands += shown
    return commands


def _value(command: str, flag: str, word: str, tmp: Path, small: bool) -> str:
    path = PATH_FLAGS.get((command, flag), PATH_FLAGS.get(flag))
    if path is not None:
        return str(tmp / path)
    if small and (command, flag) in SMALL:
        return SMALL[(command, flag)]
    if word == "...":
        return ELLIPSIS[flag]
    if word.startswith("{"):
        return word.strip("{}").split(",")[0]
    if "|" in word:
        return word.split("|")[0]
    if re.fullmatch(r"[A-Z][A-Z_0-9]*", word):
        assert word in PLACEHOLDERS, f"README placeholder {word} (after {flag}) has no value in PLACEHOLDERS"
        return PLACEHOLDERS[word]
    return word


def to_argv(line: str, tmp: Path, small: bool = False) -> list[list[str]]:
    """The argument lists a README command line stands for, placeholders replaced: one per choice of its
    `A | B` alternatives. ``small``: with the smoke sizes of ``SMALL``."""
    words = line.split()
    if words[0] == "torchrun":
        words = words[words.index("-m") + 1:]
    assert words[0] == "neutronorch", line
    command, words = words[1], [w.strip("[]") for w in words[2:]]
    words = [w for w in words if w]
    parser = _subcommands()[command]
    takes_value = {s: a.nargs != 0 for a in parser._actions for s in a.option_strings}
    variants: list[list[str]] = [[command]]
    positionals = 0
    i = 0
    while i < len(words):
        word = words[i]
        if word == "|":  # `--a | --b`: a second variant with --b in --a's place
            flag = words[i + 1]
            alternative = variants[-1][:-1] + [flag]
            variants.append(alternative)
            i += 2
            continue
        if word.startswith("--"):
            assert word in takes_value, f"README shows `neutronorch {command} {word}`, which the parser does not know"
            args = [word]
            if takes_value[word]:
                args.append(_value(command, word, words[i + 1], tmp, small))
                i += 1
            for v in variants:
                v.extend(args)
        elif word != "...":  # a positional argument (`train ...` in the torchrun line stands for the options)
            positionals += 1
            value = (str(tmp / f"dataset-{positionals}") if word == "OUT_DIR"
                     else PLACEHOLDERS.get(word, word))
            for v in variants:
                v.append(value)
        i += 1
    return variants


def test_readme_shows_commands_of_every_kind():
    shown = {line.split()[1] if line.startswith("neutronorch") else line.split()[0] for line in readme_commands()}
    assert {"train", "predict", "embed", "convert", "generate", "info", "torchrun", "make"} <= shown, shown


def test_every_readme_command_parses_as_written(tmp_path):
    parser = build_parser()
    for line in readme_commands():
        if line.startswith("make"):
            target = line.split()[1]
            assert re.search(rf"^{re.escape(target)}:", (ROOT / "Makefile").read_text(), flags=re.M), line
            continue
        for argv in to_argv(line, tmp_path):
            try:
                parser.parse_args(argv)
            except SystemExit as exc:
                pytest.fail(f"README command does not parse: {line}\n(as {argv}: exit {exc.code})")


@pytest.mark.slow
def test_every_readme_command_runs_in_a_smoke_form(tmp_path, monkeypatch):
    """Each `neutronorch ...` line of README, tiny: train (then resumed, where README shows --resume), then
    the other commands, predict and embed reading the checkpoint the train line wrote. In a folder of its
    own: a train line that names no output keeps its results in runs/ there."""
    monkeypatch.chdir(tmp_path)
    lines = [line for line in readme_commands() if line.startswith("neutronorch")]
    checkpoint = None
    for n, line in enumerate(lines):
        for k, argv in enumerate(to_argv(line, Path("@tmp@"), small=True)):
            folder = tmp_path / f"{n}-{k}"  # each run its own outputs: none is there before it
            folder.mkdir()
            argv = [a.replace("@tmp@", str(folder)) for a in argv]
            for flag, module in NEEDS.items():
                if flag in argv and importlib.util.find_spec(module) is None:
                    i = argv.index(flag)
                    del argv[i:i + 2]
            if "--config" in argv:
                Path(argv[argv.index("--config") + 1]).write_text("seed: 0\n")
            if argv[0] in ("predict", "embed"):
                assert checkpoint is not None, f"README shows {argv[0]} before any train line with --checkpoint-dir"
                argv[argv.index("--checkpoint") + 1] = checkpoint
            if argv[0] == "convert" and argv[1].endswith(".csv"):  # your own tables: a ring of 20 named vertices
                names = [f"n{i}" for i in range(20)]
                table = {argv[1]: "src,dst\n" + "".join(f"{a},{names[i - 1]}\n" for i, a in enumerate(names))}
                for flag, row in (("--features", "{a},{i},1\n"), ("--labels", "{a},{c}\n")):  # each optional
                    if flag in argv:
                        table[argv[argv.index(flag) + 1]] = "".join(row.format(a=a, i=i, c=i % 2)
                                                                    for i, a in enumerate(names))
                for path, text in table.items():
                    Path(path).write_text(text)
                if "--split" in argv:
                    Path(argv[argv.index("--split") + 1]).write_text("".join(
                        f"{a},{('train', 'val', 'test')[i % 3]}\n" for i, a in enumerate(names)))
            if "--pairs" in argv:  # pairs are scored by a link checkpoint: one trained here, two pairs to score
                Path(argv[argv.index("--pairs") + 1]).write_text("0 1\n2 3\n")
                argv[argv.index("--checkpoint") + 1] = _link_checkpoint(folder / "link")
            runs = [argv]
            if "--resume" in argv:  # the first run writes the checkpoint the second continues, one epoch longer
                runs = [[a for a in argv if a != "--resume"], argv + ["--epochs", "2"]]
            for run in runs:
                assert main(run + ["--no-progress"] * (run[0] in ("train", "predict", "embed"))) == 0, \
                    f"README command failed in its smoke form: {line}\n(run as {run})"
            if argv[0] == "train" and "--checkpoint-dir" in argv:
                checkpoint = str(Path(argv[argv.index("--checkpoint-dir") + 1]) / "best.pt")


def _link_checkpoint(folder: Path) -> str:
    assert main(["train", "--task", "link", "--dataset", SPEC, "--fanouts", "5,5", "--hidden", "16", "--epochs", "1",
                 "--checkpoint-dir", str(folder), "--no-progress"]) == 0
    return str(folder / "best.pt")


def test_readme_layout_lists_the_source_tree():
    """README's "Layout" block names every package and top-level module of src/neutronorch, and nothing else."""
    text = README.read_text()
    block = re.search(r"^## Layout\n+```\n(.*?)^```", text, flags=re.M | re.S)
    assert block, "README has no Layout code block"
    listed = set(re.findall(r"^ {2}(\S+)", block[1], flags=re.M))  # `  data/`, `  config.py` (packages' entries)
    listed |= {f"orchestration/{name}" for name in re.findall(r"^ {4}(\S+/)", block[1], flags=re.M)}
    source = ROOT / "src" / "neutronorch"
    real = {p.name + "/" for p in source.iterdir() if (p / "__init__.py").is_file()}
    real |= {p.name for p in source.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    real |= {f"orchestration/{p.name}/" for p in (source / "orchestration").iterdir() if (p / "__init__.py").is_file()}
    assert listed == real, f"README Layout lists {sorted(listed - real)} that do not exist and misses {sorted(real - listed)}"


def _short_help_options(command: str) -> set[str]:
    """The options `neutronorch COMMAND --help` lists (the others are listed by --help-all only)."""
    parser = _subcommands()[command]
    return {s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings
            if s.startswith("--") and s != "--help"}


def test_readme_train_command_is_the_short_help():
    """README's `neutronorch train` lines show what `train --help` lists, and nothing it leaves to --help-all
    (those are documented in prose and docs/, where they are explained)."""
    shown = {w.strip("[]") for line in readme_commands() if line.startswith("neutronorch train")
             for w in line.split() if w.strip("[]").startswith("--")}
    short = _short_help_options("train") - {"--help-all"}
    assert shown == short, f"README shows {sorted(shown - short)} that --help leaves out; misses {sorted(short - shown)}"


# --- Reference docs state what is true now; docs/results/ keeps the history --------------------------------

RESULTS = ROOT / "docs" / "results"
# Phrases of a lab log: what the code or a default was at some time, or how a figure compares with past code.
# A reference doc says what is true now and names the file in docs/results/ that holds the rest.
HISTORY = [r"\buntil 20\d\d-\d\d", r"\bbefore 20\d\d-\d\d", r"\bsince 20\d\d-\d\d", r"\bbefore this (?:change|work)",
           r"\bafter this change", r"\bthe defaults? then\b", r"\bthe code before\b", r"\bdefault since\b",
           r"\bnow the defaults?\b", r"\ban earlier (?:run|version|set|invocation)\b(?!'s)",
           r"\bprevious version of this page\b", r"\bthe old defaults?\b", r"\bbefore the change\b",
           r"\bthe first runs used\b", r"\bit used to\b", r"\bbefore the rewrite\b", r"\bmeasured since\b"]


def test_reference_docs_hold_no_history():
    found = []
    for path in DOC_FILES:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{number}: {m.group(0)!r}" for pattern in HISTORY
                      for m in re.finditer(pattern, line, flags=re.I)]
    assert not found, ("reference docs read as a lab log (say what is true now; move the history to "
                       f"docs/results/): {found}")


def _results_paths(text: str, relative_to: Path) -> list[str]:
    """The docs/results/ paths a text names: `docs/results/...` anywhere, and markdown links `](results/...)`
    or `](file.md)` relative to the file (placeholders such as `gpu-<date>-...` left out)."""
    named = re.findall(r"docs/results/[^\s`'\"()]*", text)
    for link in re.findall(r"\]\(([^)#\s]+)", text):
        if "://" in link:
            continue
        target = (relative_to / link).resolve()
        if RESULTS in (target, *target.parents):
            named.append(str(target.relative_to(ROOT)))
    return [n.rstrip(".,;:") for n in named if "<" not in n]


def test_every_results_file_a_doc_names_exists():
    missing = []
    for path in [*DOC_FILES, *sorted(RESULTS.glob("*.md"))]:
        for name in _results_paths(path.read_text(), path.parent):
            if not any(ROOT.glob(name.rstrip("/"))):
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, f"docs name results that are not in docs/results/: {missing}"


def test_the_results_index_lists_every_result():
    index = (RESULTS / "README.md").read_text()
    unlisted = [p.name for p in sorted(RESULTS.iterdir()) if p.name != "README.md" and p.name not in index]
    assert not unlisted, f"docs/results/README.md does not list {unlisted}"


# A dated measurement in a reference doc names the file in docs/results/ that holds it (with its command and
# date); checked in the docs that were rewritten to that rule, where a paragraph that gives a date names one.
DATED_DOCS = ["../README.md", "accuracy.md", "benchmarks.md", "datasets.md", "distributed.md", "gpu.md",
              "heterogeneous.md", "link-prediction.md", "memory.md", "neutronorch.md", "performance.md"]


def test_dated_figures_name_their_results_file():
    unnamed = []
    for name in DATED_DOCS:
        text = (ROOT / "docs" / name).read_text()
        for paragraph in re.split(r"\n\s*\n", re.sub(r"^```\w*\n.*?^```", "", text, flags=re.M | re.S)):
            if re.search(r"\b20\d\d-\d\d-\d\d\b", paragraph) and not _results_paths(paragraph, ROOT / "docs"):
                unnamed.append(f"docs/{name}: {paragraph.strip()[:80]!r}")
    assert not unnamed, f"dated figures that name no file in docs/results/: {unnamed}"


# Options of other programs that a doc names in a paragraph that does not name the program: the program.
OTHER_PROGRAMS = {"--out-md": "bench/harness.py", "--out-json": "bench/harness.py", "--plot-dir": "bench/harness.py",
                  "--budget-s": "bench/regime.py", "--no-eval": "bench/neutronorch_vs_exact.py",
                  "--ops": "bench/step_profile.py", "--host-cache": "bench/larger_than_memory.py",
                  "--shm-size": "docker", "--ulimit": "docker"}
NOT_OPTIONS = {"--flags"}  # a word: "maps `field` names to --flags"
NAMES_ANOTHER_PROGRAM = re.compile(r"bench/|examples/|\bpython3?\b|torchrun|\bsrun\b|SBATCH|docker|\bgit\b")


def test_every_option_a_doc_names_exists():
    """Every `--flag` README.md and docs/*.md name is an option of a neutronorch command, unless its paragraph
    names another program (a bench script, torchrun, ...); the few other programs' options named alone are in
    ``OTHER_PROGRAMS``, checked against the script that defines them."""
    known = {s for parser in _subcommands().values() for a in parser._actions for s in a.option_strings}
    unknown = []
    for path in DOC_FILES:
        for unit in _units(path.read_text()):
            if NAMES_ANOTHER_PROGRAM.search(unit):
                continue
            for flag in set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", unit)) - known - NOT_OPTIONS:
                if flag not in OTHER_PROGRAMS:
                    unknown.append(f"{path.relative_to(ROOT)}: {flag}")
    assert not unknown, f"docs name options no neutronorch command has: {sorted(set(unknown))}"
    for flag, program in OTHER_PROGRAMS.items():
        if program.startswith("bench/"):
            assert f'"{flag}"' in (ROOT / program).read_text(), f"{program} has no {flag}"


def _paragraph(text: str, marker: str) -> str:
    found = [p for p in re.split(r"\n\s*\n", text) if marker in p]
    assert len(found) == 1, f"{len(found)} paragraphs hold {marker!r}"
    return found[0]


def _sentence(text: str, marker: str) -> str:
    """The sentence of ``text`` from ``marker`` on: up to the first full stop outside parentheses."""
    text = text[text.index(marker):]
    depth = 0
    for i, char in enumerate(text):
        depth = max(0, depth + {"(": 1, ")": -1}.get(char, 0))  # the marker may sit inside parentheses
        if char == "." and depth == 0 and text[i + 1:i + 2] in (" ", ""):
            return text[:i]
    return text


def test_readme_names_the_config_sections_and_top_level_keys():
    """README's `--config` paragraph: the sections are TrainConfig's parts, the keys it says belong at the top
    level only are the settings of no part, and every key it names is one a config file takes."""
    from neutronorch.cli.options import RUN_FOLDER_KEYS
    from neutronorch.config import TrainConfig

    text = _sentence(" ".join(_paragraph(README.read_text(), "`--config run.yaml`").split()), "`--config run.yaml`")
    sections = TrainConfig.sections()
    assert list(dict.fromkeys(re.findall(r"`\[(\w+)\]`", text))) == list(sections)
    top = re.search(r";\s*((?:`\w+`,?\s*)+)at the top level only", text)
    assert top, "README's --config paragraph does not say which keys belong at the top level only"
    parts = {key for keys in sections.values() for key in keys}
    assert set(re.findall(r"`(\w+)`", top[1])) == set(TrainConfig.keys()) - parts
    keys = set(TrainConfig.keys()) | set(RUN_FOLDER_KEYS) | {"no_save"}
    named = set(re.findall(r"`([a-z]+(?:_[a-z]+)+|[a-z]+)`", text)) - {"network"} - set(sections)
    assert named <= keys, f"README's --config paragraph names keys a config file does not take: {named - keys}"


# What the resume lists may say without naming each option.
RESUME_GROUPS = {"logs": {"log_jsonl", "log_csv", "tensorboard"}, "progress": {"progress"},
                 "stage table": {"stage_table"}, "dataset spec": {"dataset"}}


@pytest.mark.parametrize("path, marker", [(README, "A resumed run may change only"),
                                          (ROOT / "docs" / "checkpoints.md", "resume_may_change()")])
def test_the_settings_a_resume_may_change_are_listed(path, marker):
    """README's and docs/checkpoints.md's list of what a resume may change names each such setting (as its
    option, or as a group: the logs, the progress bar and stage table) and nothing else."""
    from neutronorch.config import TrainConfig

    text = _sentence(" ".join(_paragraph(path.read_text(), marker).split()), marker)
    may = set(TrainConfig.resume_may_change())
    named = {flag[2:].replace("-", "_") for flag in re.findall(r"`(--[a-z][a-z0-9-]*)", text)}
    assert named <= may, f"{path.name} says a resume may change {sorted(named - may)}, which it refuses"
    grouped = {key for group, keys in RESUME_GROUPS.items() if group in text for key in keys}
    missing = may - named - grouped - {"resume"}
    assert not missing, f"{path.name} leaves out settings a resume may change: {sorted(missing)}"


def test_the_table_of_what_runs_is_the_one_the_code_reads():
    """docs/architecture.md's tables of what runs where are capabilities.markdown() as the code renders it."""
    from neutronorch.capabilities import markdown

    text = (ROOT / "docs" / "architecture.md").read_text()
    shown = re.search(r"<!-- generated: capabilities.markdown\(\) -->\n(.*?)<!-- end of the generated tables -->",
                      text, flags=re.S)
    assert shown is not None and shown.group(1) == markdown()
