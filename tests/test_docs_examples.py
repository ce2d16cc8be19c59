"""Every ```python example of README.md and docs/*.md runs, so no example drifts from the code.

Each block runs as a script of its own (``python example.py``) in a fresh folder, with this
checkout first on ``PYTHONPATH``, pointed at the session's real Prefect server, with the
default store (``./.dask-profiling`` in that folder) and its own spool. A comment line just
above a block changes that:

- ``<!-- example: skip (why) -->`` — a fragment that cannot run by itself; the reason is
  required and said in the test report.
- ``<!-- example: after-previous -->`` — runs after the block above it in the same file, in
  the same folder (the tutorial's "then read what the run stored").

The package face is checked here too: ``__all__`` is exactly the names the package serves, and
docs/api.md documents every one of them (the docs build fails on a name that does not
resolve; this test fails on a public name left out of the reference).
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.processes import stop_process_group

import prefect_dask_profiling

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TIMEOUT_S = 240
FENCE = re.compile(r"^```python[ \t]*\n(?P<code>.*?)^```[ \t]*$", re.M | re.S)
OPENING = re.compile(r"^```python", re.M)
MARKER = re.compile(r"<!--\s*example:\s*(?P<kind>[\w-]+)\s*(?:\((?P<reason>[^)]*)\))?\s*-->\s*$")
KINDS = ("skip", "after-previous")


@dataclass(frozen=True)
class Example:
    """One fenced python block: where it is, its code, and its marker (if any)."""

    page: Path
    line: int
    code: str
    kind: str | None
    reason: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def examples(page: Path) -> list[Example]:
    """The python blocks of ``page``, each with the marker on the line above it."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        above = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(above)
        found.append(Example(page, line, match.group("code"),
                             marker.group("kind") if marker else None,
                             (marker.group("reason") or "").strip() if marker else ""))
    if len(found) != len(OPENING.findall(text)):
        raise AssertionError(f"{page.name}: a ```python block is not closed by a ``` line")
    return found


def chains(pages: list[Path]) -> list[list[Example]]:
    """Blocks to run, grouped: an ``after-previous`` block joins the chain above it."""
    result: list[list[Example]] = []
    for page in pages:
        previous: list[Example] | None = None
        for example in examples(page):
            if example.kind == "skip":
                previous = None
                continue
            if example.kind == "after-previous":
                if previous is None:
                    raise AssertionError(f"{example.name}: after-previous follows no block")
                previous.append(example)
                continue
            previous = [example]
            result.append(previous)
    return result


ALL = [example for page in PAGES for example in examples(page)]
CHAINS = chains(PAGES)


def test_there_are_examples_and_every_marker_is_known_and_every_skip_says_why() -> None:
    assert len(CHAINS) >= 3, [c[0].name for c in CHAINS]
    for example in ALL:
        assert example.kind in (None, *KINDS), f"{example.name}: unknown marker {example.kind!r}"
        if example.kind == "skip":
            assert example.reason, f"{example.name}: a skipped example needs (a reason)"


def test_the_marker_parser_reads_what_the_pages_write(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- example: skip (a fragment) -->\n```python\nx = 1\n```\n\n"
                    "```python\ny = 2\n```\n<!-- example: after-previous -->\n```python\n"
                    "z = 3\n```\n<!-- example: skip -->\n```python\nw\n```\n")
    found = examples(page)
    assert [(e.kind, e.reason) for e in found] == [("skip", "a fragment"), (None, ""),
                                                   ("after-previous", ""), ("skip", "")]
    assert [[e.code for e in chain] for chain in chains([page])] == [["y = 2\n", "z = 3\n"]]
    page.write_text("```python\nx = 1\n")
    with pytest.raises(AssertionError, match="not closed"):
        examples(page)


def _run(chain: list[Example], folder: Path, env: dict[str, str]) -> None:
    for index, example in enumerate(chain):
        script = folder / f"example_{index}.py"
        script.write_text(example.code, encoding="utf-8")
        proc = subprocess.Popen([sys.executable, script.name], cwd=folder, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            stop_process_group(proc)
            output, _ = proc.communicate()
            pytest.fail(f"{example.name} did not finish in {TIMEOUT_S} s:\n{output[-4000:]}")
        finally:
            stop_process_group(proc)
        assert proc.returncode == 0, f"{example.name} exited {proc.returncode}:\n{output[-4000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("chain", CHAINS, ids=[chain[0].name for chain in CHAINS])
def test_example_runs(chain: list[Example], prefect_server, tmp_path: Path) -> None:
    env = prefect_server.client_env()
    env.pop("DASK_PROFILING_STORE", None)
    env.pop("DASK_PROFILING_STORAGE_OPTIONS", None)
    env["DASK_PROFILING_SPOOL"] = str(tmp_path / "spool")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    _run(chain, tmp_path, env)


def test_the_package_face_is_all_and_the_api_page_documents_it() -> None:
    eager = {"install", "stage", "uninstall"}
    face = set(prefect_dask_profiling.__all__)
    assert face == eager | set(prefect_dask_profiling._LAZY)
    assert "TaskTimings" not in face and not hasattr(prefect_dask_profiling, "TaskTimings")
    documented = set()
    for path in re.findall(r"^::: (prefect_dask_profiling[\w.]*)\s*$",
                           (ROOT / "docs" / "api.md").read_text(), re.M):
        module, _, name = path.rpartition(".")
        if name in face and getattr(importlib.import_module(module), name) is getattr(
                prefect_dask_profiling, name):  # at the root, or at its home module
            documented.add(name)
    assert face <= documented, f"not in docs/api.md: {sorted(face - documented)}"


def test_importing_the_package_loads_neither_prefect_nor_pandas() -> None:
    code = ("import sys, prefect_dask_profiling as p; p.stage; p.install; "
            "print(sorted(m for m in ('prefect', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True).stdout
    assert out.strip() == "[]"


def test_readme_links_resolve_to_files_of_the_checkout() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((?!https?://|#)([^)#\s]+)(?:#[^)]*)?\)", text)
    assert links, "README.md links into docs/"
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_the_cli_page_lists_every_command_and_no_other() -> None:
    from typer.main import get_command

    from prefect_dask_profiling.cli import app

    group = get_command(app)
    commands = set()
    for name, command in group.commands.items():
        subcommands = getattr(command, "commands", None)
        commands |= {f"{name} {sub}" for sub in subcommands} if subcommands else {name}
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([a-z-]+(?: [a-z][a-z-]*)?)", page, re.M)
    listed = {row for row in rows if row != "command"}
    assert listed == commands, (f"docs/cli.md lists {sorted(listed - commands)} that do not "
                                f"exist; misses {sorted(commands - listed)}")


def test_the_configuration_page_lists_every_runner_option_and_check_option() -> None:
    """The page's tables are drawn from the options' docstrings when the site is built
    (``docs/hooks/options_table.py``): every field, each with its default and meaning."""
    import importlib.util
    from dataclasses import fields

    from prefect_dask_profiling.prefect.runner import ProfilingOptions
    from prefect_dask_profiling.regression.rule import CHECK_OPTION_KEYS

    spec = importlib.util.spec_from_file_location(
        "options_table", ROOT / "docs" / "hooks" / "options_table.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    source = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    page = hook.on_page_markdown(source)
    assert "options-table" not in page
    rows = re.findall(r"^\| `([a-z_]+)` \| `([^`]+)` \| (.+) \|$", page, re.M)
    listed = {name for name, _, _ in rows}
    expected = {f.name for f in fields(ProfilingOptions)} | set(CHECK_OPTION_KEYS)
    assert listed == expected, (f"docs/configuration.md lists {sorted(listed - expected)} "
                                f"that do not exist; misses {sorted(expected - listed)}")
    assert all(len(meaning) > 20 for _, _, meaning in rows)
    defaults = {name: default for name, default, _ in rows}
    assert defaults["threshold"] == "2.0" and defaults["on_regression"] == '"fail"'
    assert defaults["memory_min_bytes"] == "268435456"
