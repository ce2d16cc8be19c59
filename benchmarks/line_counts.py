"""The package's size: its total line count, by part, and its longest classes.

Counts every ``.py`` file of ``prefect_dask_profiling`` (physical lines, docstrings and
comments included, as ``wc -l`` does), what kind each line is (code, docstring, comment,
blank) and every class from its ``class`` line to its last line (the measure
``tests/test_architecture.py`` holds under ``MAX_CLASS_LINES``). Standard
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


KINDS = ("code", "docstring", "comment", "blank")


def _docstring_lines(tree: ast.Module) -> set[int]:
    """The line numbers of every module, class and function docstring of ``tree``."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                found.update(range(first.lineno, first.end_lineno + 1))
    return found


def line_kinds(root: Path = ROOT) -> Counter[str]:
    """``{kind: lines}`` over the package, each physical line counted once as one of
    :data:`KINDS`: blank (whitespace only), docstring (inside a module, class or function
    docstring), comment (starts with ``#``), else code."""
    kinds: Counter[str] = Counter(dict.fromkeys(KINDS, 0))
    for path in module_files(root):
        text = path.read_text()
        docs = _docstring_lines(ast.parse(text))
        for number, line in enumerate(text.splitlines(), 1):
            stripped = line.strip()
            kinds["blank" if not stripped else "docstring" if number in docs
                  else "comment" if stripped.startswith("#") else "code"] += 1
    return kinds


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
    kinds = line_kinds(root)
    out = [f"prefect_dask_profiling: {lines:,} lines in {files} files",
           "  " + ", ".join(f"{kinds[k]:,} {k}" for k in KINDS)
           + f"; {lines - kinds['blank']:,} not blank", "", "by part:"]
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
