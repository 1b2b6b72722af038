"""Lines of ``src/neutronorch`` at a revision (default: the working tree), split into docstrings, comments,
blank lines and code, so a change's size can be compared with another revision's.

    python bench/lines.py            # the working tree's tracked files
    python bench/lines.py e7cad6a    # a revision, read from git

A line counts once: a blank line inside a docstring counts as docstring, not blank.
"""

from __future__ import annotations

import argparse
import ast
import subprocess


def count(sources: list[str]) -> dict[str, int]:
    """Total, docstring, comment, blank and code lines of the Python ``sources``."""
    totals = dict.fromkeys(("total", "docstrings", "comments", "blank", "code"), 0)
    for source in sources:
        lines = source.splitlines()
        docs: set[int] = set()
        for node in ast.walk(ast.parse(source)):
            body = getattr(node, "body", None)
            if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                    and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                docs.update(range(body[0].lineno, body[0].end_lineno + 1))
        totals["total"] += len(lines)
        totals["docstrings"] += len(docs)
        rest = [line.strip() for number, line in enumerate(lines, 1) if number not in docs]
        totals["blank"] += sum(1 for line in rest if not line)
        totals["comments"] += sum(1 for line in rest if line.startswith("#"))
    totals["code"] = totals["total"] - totals["docstrings"] - totals["blank"] - totals["comments"]
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision", nargs="?", help="a git revision (default: the working tree)")
    args = parser.parse_args()
    git = ["git", "ls-tree", "-r", "--name-only", args.revision] if args.revision else ["git", "ls-files"]
    files = [f for f in subprocess.check_output([*git, "src/neutronorch"], text=True).split() if f.endswith(".py")]
    if args.revision:
        sources = [subprocess.check_output(["git", "show", f"{args.revision}:{f}"], text=True) for f in files]
    else:
        sources = [open(f, encoding="utf-8").read() for f in files]
    totals = count(sources)
    print(" ".join(f"{name} {value:,}" for name, value in totals.items()), f"({len(files)} files)")


if __name__ == "__main__":
    main()
