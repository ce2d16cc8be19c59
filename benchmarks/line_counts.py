"""The package's size: its total line count, by part, and its longest classes.

Counts every ``.py`` file of ``prefect_dask_profiling`` (physical lines, docstrings and
comments included, as ``wc -l`` does) and every class from its ``class`` line to its last
line (the measure ``tests/test_architecture.py`` holds under ``MAX_CLASS_LINES``). Standard
library only; reads the files, imports nothing of the package. The figures in
``docs/architecture.md`` come from here.

Run with::

    .venv/bin/python -m benchmarks.line_counts [--classes 10]
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "prefect_dask_profiling"


def module_files(root: Path = ROOT) -> list[Path]:
    """Every module of the package, sorted."""
    return sorted(root.rglob("*.py"))


def lines_of(path: Path) -> int:
    """Physical lines of ``path`` (``wc -l``: its newlines)."""
    return path.read_bytes().count(b"\n")


def line_counts(root: Path = ROOT) -> tuple[int, int, dict[str, int]]:
    """``(files, lines, {part: lines})``: a part is the first name under the package
    (``cost``, ``timing``, ``stages.py``...)."""
    by_part: Counter[str] = Counter()
    files = module_files(root)
    for path in files:
        by_part[path.relative_to(root).parts[0]] += lines_of(path)
    return len(files), sum(by_part.values()), dict(by_part)


def class_lengths(root: Path = ROOT) -> list[tuple[int, str]]:
    """``(lines, "module.Class")`` of every class of the package (nested ones too), longest
    first."""
    found = []
    for path in module_files(root):
        rel = path.relative_to(root.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                found.append((node.end_lineno - node.lineno + 1, f"{module}.{node.name}"))
    return sorted(found, key=lambda item: (-item[0], item[1]))


def report(classes: int = 10, root: Path = ROOT) -> str:
    """The text :func:`main` prints."""
    files, lines, by_part = line_counts(root)
    out = [f"prefect_dask_profiling: {lines:,} lines in {files} files", "", "by part:"]
    out += [f"  {part:<16} {n:>7,}" for part, n in sorted(by_part.items(),
                                                           key=lambda kv: (-kv[1], kv[0]))]
    out += ["", f"the {classes} longest classes:"]
    out += [f"  {n:>5}  {name}" for n, name in class_lengths(root)[:classes]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, default=10, help="how many classes to list")
    args = parser.parse_args(argv)
    print(report(args.classes))


if __name__ == "__main__":
    main()
