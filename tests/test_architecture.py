"""The package's shape: imports run one way, no cycles, Prefect only where it belongs.

An ``ast`` walk of every module of ``prefect_dask_profiling``. Every import counts — at the
top, inside functions and under ``TYPE_CHECKING`` — because an import deferred into a
function still couples the two modules (and is how cycles hide). Edges are module → module:

* ``import a.b.c`` and ``from a.b import c`` (``c`` a module) point at ``a.b.c``;
  ``from a.b import name`` (``name`` not a module) points at ``a.b`` — for a package, its
  ``__init__``, which then counts with its own (re-export) imports;
* importing a submodule also runs its package's ``__init__`` at run time; that implicit step
  is not an edge (otherwise every module would depend on every parent package);
* the top-level ``prefect_dask_profiling/__init__.py`` reaches Prefect lazily through
  ``__getattr__`` and import strings, which are not imports: the subprocess check below
  proves that importing the package leaves Prefect out.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

import prefect_dask_profiling

PACKAGE = "prefect_dask_profiling"
ROOT = Path(prefect_dask_profiling.__file__).parent

# The layers, lowest first: a part may import its own modules and any part listed before it
# in LAYERS; ``bench`` (the benchmark protocol) stands aside and imports only BENCH_USES.
# ``options`` (the runner's frozen options and their checks) sits right above the parts it
# checks its values with (cost rates, deadlines, store URLs, the rules) and below every part
# that reads them.
LAYERS = ["errors", "_util", "environment", "timing", "stages", "summary", "cost", "forecast",
          "store", "reports", "regression", "options", "diagnosis", "export", "run", "otel",
          "prefect", "cli"]
BENCH_USES = {"errors", "_util", "environment", "timing", "summary", "diagnosis"}
ALLOWED: dict[str, set[str]] = {part: set(LAYERS[:i]) for i, part in enumerate(LAYERS)}
ALLOWED["bench"] = BENCH_USES
ALLOWED["cli"] |= {"bench"}
ALLOWED["__init__"] = set(LAYERS) - {"prefect", "cli"}  # the public face; Prefect lazily
# Distributions that import Prefect when imported.
PREFECT_DISTS = {"prefect", "prefect_dask"}
PREFECT_PARTS = {"prefect", "cli"}
# The scheduler plugin is shipped by value to schedulers without this package, with its client
# API (whose functions run on the scheduler): they and every package module they import may
# import the standard library, Dask/distributed (and what they bring) and each other only.
PLUGIN = f"{PACKAGE}.timing.plugin"
PLUGIN_CLIENT = f"{PACKAGE}.timing.client"
ON_A_BARE_SCHEDULER = {"dask", "distributed", "tornado", "cloudpickle"}
# No class of the package is longer than this (``class`` line to its last, docstring
# included): one class per role, as timing/ has it (the plugin and one class per stream).
MAX_CLASS_LINES = 350
# Known classes over the limit, each at its length when the rule came (issue 57): it may not
# grow, and its entry goes when it is split. Add none.
LONG_CLASSES: dict[str, int] = {}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} (line {self.line})"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def discover() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


MODULES = discover()


def is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def resolve(name: str) -> str | None:
    """The package module ``name`` is, or the nearest package module containing it."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def absolute(node: ast.ImportFrom, source: str) -> str:
    """The module an ``ImportFrom`` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = source.split(".")
    if not is_package(source):
        base = base[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def imports(source: str) -> list[tuple[str, int]]:
    """Every imported module name (absolute) in module ``source``, with its line."""
    return imports_in(MODULES[source].read_text(), source)


def imports_in(text: str, source: str) -> list[tuple[str, int]]:
    """Every imported module name (absolute) in ``text`` of module ``source``; any nesting."""
    tree = ast.parse(text)
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = absolute(node, source)
            for alias in node.names:
                child = f"{module}.{alias.name}"
                found.append((child if child in MODULES else module, node.lineno))
    return found


def edges() -> list[Edge]:
    """Module -> module edges inside the package."""
    out = set()
    for source in MODULES:
        for name, line in imports(source):
            if name == PACKAGE or name.startswith(PACKAGE + "."):
                target = resolve(name)
                if target is not None and target != source:
                    out.add(Edge(source, target, line))
    return sorted(out, key=lambda e: (e.source, e.target, e.line))


def part(module: str) -> str:
    """The part a module belongs to: the first name under the package (``__init__``: root)."""
    rest = module[len(PACKAGE) + 1:] if module != PACKAGE else ""
    return rest.split(".")[0] if rest else "__init__"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


# ------------------------------------------------------------------------------ the checks
def test_every_part_has_a_layer():
    unknown = sorted({part(m) for m in MODULES} - set(ALLOWED))
    assert not unknown, f"parts without a layer in ALLOWED (add them): {unknown}"


def test_no_import_cycles():
    graph: dict[str, set[str]] = defaultdict(set)
    for edge in edges():
        graph[edge.source].add(edge.target)
    for module in MODULES:
        graph.setdefault(module, set())
    found = cycles(graph)
    details = []
    for component in found:
        members = set(component)
        inside = [str(e) for e in edges() if e.source in members and e.target in members]
        details.append(" | ".join(inside))
    assert not found, "import cycles:\n" + "\n".join(details)


def test_imports_follow_the_layers():
    wrong = [f"{e}: {part(e.source)} may not import {part(e.target)}" for e in edges()
             if part(e.source) != part(e.target)
             and part(e.target) not in ALLOWED.get(part(e.source), set())]
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def imports_prefect(text: str) -> bool:
    """Whether ``text`` imports Prefect (``import prefect...``/``from prefect... import``)
    anywhere: at the top, inside a function, under ``TYPE_CHECKING``."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import) and any(
                alias.name.split(".")[0] in PREFECT_DISTS for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level \
                and (node.module or "").split(".")[0] in PREFECT_DISTS:
            return True
    return False


def test_every_module_of_prefect_imports_prefect():
    """prefect/ holds what needs Prefect, and nothing else: a module of it that does not
    import Prefect belongs to the part of its concept (the Prefect-free flow engine is
    run/). The package's ``__init__`` (a docstring) is not a module of code."""
    package = f"{PACKAGE}.prefect"
    wrong = [source for source in MODULES if part(source) == "prefect" and source != package
             and not imports_prefect(MODULES[source].read_text())]
    assert not wrong, ("modules of prefect/ that do not import Prefect (move them to the "
                       "part of their concept):\n" + "\n".join(wrong))
    body = ast.parse(MODULES[package].read_text()).body
    assert len(body) == 1 and isinstance(body[0], ast.Expr), \
        "prefect/__init__.py holds more than its docstring: it must import Prefect too"


def test_the_prefect_import_check_sees_an_import():
    assert imports_prefect("def f():\n    from prefect.logging import get_run_logger\n")
    assert imports_prefect("import prefect_dask.task_runners\n")
    assert not imports_prefect("from prefect_dask_profiling.run import stages\n"
                               "import prefect_dask_profiling.prefect.runner\n")


def test_prefect_is_imported_only_by_the_prefect_parts():
    wrong = [f"{source} imports {name} (line {line})"
             for source in MODULES if part(source) not in PREFECT_PARTS
             for name, line in imports(source) if name.split(".")[0] in PREFECT_DISTS]
    assert not wrong, "Prefect imported outside prefect/ and cli/:\n" + "\n".join(wrong)


def shipped() -> set[str]:
    """The package modules the scheduler runs: the plugin, its client API, and every package
    module they import (at any depth, ``TYPE_CHECKING`` imports included)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for edge in edges():
        graph[edge.source].add(edge.target)
    found, todo = set(), [PLUGIN, PLUGIN_CLIENT]
    while todo:
        module = todo.pop()
        if module not in found:
            found.add(module)
            todo.extend(graph[module])
    return found


# Where a timing/ module runs, when the scheduler does not run it: in its name.
RUNTIMES = ("client", "worker", "scheduler")


def test_every_timing_module_is_shipped_or_named_for_where_it_runs():
    """timing/ is the scheduler's side, shipped by value to schedulers without the package;
    a module of it that the scheduler does not run says in its name where it runs instead
    (``worker_io``: each worker; ``io_client``: the flow process) (issue 57)."""
    modules = shipped()
    elsewhere = [m for m in MODULES if part(m) == "timing" and not is_package(m)
                 and m not in modules]
    unnamed = [m for m in elsewhere if not any(r in m.rsplit(".", 1)[1] for r in RUNTIMES)]
    assert not unnamed, f"timing/ modules the scheduler does not run, named for no runtime: " \
                        f"{unnamed}"
    assert elsewhere, "the check sees the worker and client modules"


def test_the_scheduler_plugin_imports_only_what_a_bare_scheduler_has():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    modules = shipped()
    wrong = [f"{source} imports {name} (line {line})" for source in sorted(modules)
             for name, line in imports(source)
             if name.split(".")[0] not in stdlib | ON_A_BARE_SCHEDULER and name not in modules]
    assert not wrong, ("the plugin's modules import more than stdlib/distributed:\n"
                       + "\n".join(wrong))
    assert all(part(m) == "timing" for m in modules), sorted(modules)


def test_every_module_the_scheduler_runs_is_sent_by_value():
    """install() registers :data:`timing.client.BY_VALUE` by value: all of :func:`shipped`."""
    from prefect_dask_profiling.timing.client import BY_VALUE

    assert set(BY_VALUE) == shipped()


def long_classes(text: str, limit: int) -> list[str]:
    """Classes of ``text`` longer than ``limit`` lines (``class`` line to its last line)."""
    return [f"{node.name} {node.end_lineno - node.lineno + 1} lines (line {node.lineno})"
            for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.ClassDef)
            and node.end_lineno - node.lineno + 1 > limit]


def class_lines(text: str) -> dict[str, int]:
    """Every class of ``text`` (nested ones too), by name: its lines."""
    return {node.name: node.end_lineno - node.lineno + 1 for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.ClassDef)}


def test_no_class_is_too_long():
    """One class per role: none of the package over the limit but the known ones, which may
    not grow."""
    wrong = []
    for source in MODULES:
        for name, lines in class_lines(MODULES[source].read_text()).items():
            known = LONG_CLASSES.get(f"{source}.{name}")
            if lines > MAX_CLASS_LINES and (known is None or lines > known):
                wrong.append(f"{source}.{name}: {lines} lines"
                             + (f" (listed at {known})" if known else ""))
    assert not wrong, (f"classes over {MAX_CLASS_LINES} lines (split them by role; a known "
                       "one may not grow):\n" + "\n".join(wrong))


def test_every_known_long_class_is_still_long():
    """An entry of LONG_CLASSES goes when its class is split (or gone)."""
    found = {f"{source}.{name}": lines for source in MODULES
             for name, lines in class_lines(MODULES[source].read_text()).items()}
    stale = [name for name in LONG_CLASSES if found.get(name, 0) <= MAX_CLASS_LINES]
    assert not stale, f"known long classes no longer over {MAX_CLASS_LINES} lines: {stale}"


def test_the_class_length_check_sees_a_long_class():
    text = "class Big:\n" + "    x = 1\n" * 5 + "class Small:\n    pass\n"
    assert long_classes(text, 5) == ["Big 6 lines (line 1)"]


def test_importing_the_package_leaves_prefect_out():
    """Every Prefect-free module imported in a fresh interpreter: no ``prefect`` module."""
    free = sorted(m for m in MODULES if part(m) not in PREFECT_PARTS)
    code = ("import sys\n"
            + "".join(f"import {m}\n" for m in free)
            + "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
              f"{sorted(PREFECT_DISTS)!r})\n"
            + "print(','.join(bad))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"imported Prefect modules: {done.stdout.strip()}"


# The options travel inside the runner to every Dask worker, which unpickles them around every
# Prefect task: importing their module loads none of these.
OPTIONS = f"{PACKAGE}.options"
NOT_ON_THE_WORKERS = ("pandas", "numpy", "prefect", "prefect_dask")


def test_the_options_import_no_pandas_numpy_or_prefect():
    code = (f"import sys\nimport {OPTIONS}\n"
            f"{OPTIONS}.ProfilingOptions(store='memory://x', cost={{'worker_hour': 1.0}}, "
            "deadline='06:00 UTC').rules\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            f"{NOT_ON_THE_WORKERS!r})\n"
            "print(','.join(bad))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"the options loaded: {done.stdout.strip()}"


# A flow script is ``__main__``: cloudpickle pickles its functions by value, with every
# global they use, the package module among them (issue 55). The names are read after the
# submodules that once shadowed one of them (``stage``) were imported.
MAIN_USES_THE_PACKAGE = """
import pickle, sys, types
import cloudpickle
import prefect_dask_profiling as pdp
import prefect_dask_profiling.stages, prefect_dask_profiling.prefect.runner
from prefect_dask_profiling import stage

def flow_body():
    return pdp.__name__, pdp.stage.__name__, pdp.profiled.__name__, stage.__name__

assert flow_body.__module__ == "__main__"
assert type(pdp) is types.ModuleType, type(pdp)
again = pickle.loads(cloudpickle.dumps(flow_body))
assert again() == ("prefect_dask_profiling", "stage", "profiled", "stage"), again()
print("ok")
"""


def test_a_main_function_using_the_package_as_a_module_pickles_by_value():
    """The face stays a plain module that user code pickled by value can carry."""
    done = subprocess.run([sys.executable, "-c", MAIN_USES_THE_PACKAGE], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


# ------------------------------------------------------------------------------ the tool
@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
])
def test_the_cycle_finder_finds_cycles(graph, expected):
    assert cycles(graph) == expected


def test_function_level_and_type_checking_imports_count():
    text = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from prefect_dask_profiling.store.runs import RunStore\n"
        "def f():\n"
        "    from prefect_dask_profiling.regression import history\n"
        "    import prefect_dask_profiling.summary.record\n"
        "class C:\n"
        "    def g(self):\n"
        "        from . import rule\n"
        "        from ..summary import RunRecord\n")
    found = {name for name, _ in imports_in(text, f"{PACKAGE}.regression.verdict")}
    assert {f"{PACKAGE}.store.runs", f"{PACKAGE}.regression.history",
            f"{PACKAGE}.summary.record", f"{PACKAGE}.regression.rule",
            f"{PACKAGE}.summary"} <= found


# The rules of a night are applied in one place: the judge. These names are the one-night and
# drift rules and their loaders; only the judge (and the modules defining them) may use them.
JUDGE = f"{PACKAGE}.regression.judge"
# The verdict families the judge loops over (one module each) apply their own rule.
FAMILIES = f"{PACKAGE}.regression.families"
RULE_FUNCTIONS = {
    f"{PACKAGE}.regression.verdict": {"detect_regressions", "run_outcome"},
    f"{PACKAGE}.regression.drift": {"detect_drift", "load_series", "merge_drift"},
    f"{PACKAGE}.regression.baseline": {"load_baseline"},
    f"{PACKAGE}.regression.memory": {"detect_memory"},
    f"{PACKAGE}.regression.requests": {"detect_requests"},
    f"{PACKAGE}.regression.confirm": {"confirm_verdicts"},
}


def rule_uses(text: str, source: str) -> list[tuple[str, int]]:
    """Names of the rule functions that module ``source`` imports or reaches as attributes."""
    tree = ast.parse(text)
    every = set().union(*RULE_FUNCTIONS.values())
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = absolute(node, source)
            found.extend((f"{module}.{a.name}", node.lineno) for a in node.names
                         if a.name in RULE_FUNCTIONS.get(module, ()))
        elif isinstance(node, ast.Attribute) and node.attr in every:
            found.append((node.attr, node.lineno))
    return found


def test_only_the_judge_applies_the_rules():
    offenders = [f"{source}: {name} (line {line})"
                 for source in MODULES
                 if source != JUDGE and not source.startswith(FAMILIES)
                 and source not in RULE_FUNCTIONS
                 and part(source) != "__init__"
                 for name, line in rule_uses(MODULES[source].read_text(), source)]
    assert not offenders, ("the one-night and drift rules are applied only by "
                           f"{JUDGE} and its families; found:\n" + "\n".join(offenders))


def test_the_rule_check_sees_a_direct_call():
    """The check above can fail: a module importing ``detect_drift`` is caught."""
    text = ("from prefect_dask_profiling.regression.drift import detect_drift\n"
            "from prefect_dask_profiling.regression import verdict\n"
            "verdict.detect_regressions(a, b)\n")
    names = [n for n, _ in rule_uses(text, f"{PACKAGE}.cli.history")]
    assert names == [f"{PACKAGE}.regression.drift.detect_drift", "detect_regressions"]


# ------------------------------------------------------------------ the judge names no family
def family_words() -> set[str]:
    """What names a built-in verdict family: its name, metrics, stored table and event, its
    class and its module."""
    from prefect_dask_profiling.regression.families import REGISTRY

    words: set[str] = set()
    for family in REGISTRY:
        words |= {family.name, type(family).__name__, type(family).__module__.rsplit(".", 1)[1]}
        words |= set(family.metrics)
        words |= {w for w in (family.table, family.event) if w}
    return words


# ``rules.regression`` is the one-night rule every family reads (its settings), not the time
# family, whose stored table happens to share the name.
SHARED_RULE = "regression"


def family_mentions(text: str, source: str, words: set[str]) -> list[str]:
    """The places of ``text`` (module ``source``) that name a family in ``words``: a string
    (docstrings aside), an attribute, or an import of a family's module or class."""
    tree = ast.parse(text)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docstrings and node.value in words:
            found.append(f"{node.value!r} (line {node.lineno})")
        elif isinstance(node, ast.Attribute) and node.attr in words \
                and node.attr != SHARED_RULE:
            found.append(f".{node.attr} (line {node.lineno})")
        elif isinstance(node, ast.ImportFrom):
            module = absolute(node, source)
            family_module = module.startswith(f"{FAMILIES}.") and module != f"{FAMILIES}.base"
            found.extend(f"import {module}.{a.name} (line {node.lineno})" for a in node.names
                         if family_module or (module == FAMILIES and a.name in words))
    return found


def test_the_judge_names_no_family():
    """The judge loops over the registry: adding a family changes no line of it."""
    wrong = family_mentions(MODULES[JUDGE].read_text(), JUDGE, family_words())
    assert not wrong, (f"{JUDGE} names verdict families (it should only loop over "
                       "families.REGISTRY):\n" + "\n".join(wrong))


def test_the_family_check_sees_a_family():
    text = ('"""The drift family is named here, in a docstring: allowed."""\n'
            "from prefect_dask_profiling.regression.families.drift import DriftFamily\n"
            "from prefect_dask_profiling.regression.families import memory\n"
            "rows = tables['request_verdicts']\n"
            "threshold = rules.drift.min_ratio\n")
    found = family_mentions(text, JUDGE, family_words())
    assert len(found) == 4, found


# ------------------------------------------------------------------ one home for the z test
STATS = f"{PACKAGE}.regression.stats"
Z_TEST_NAMES = {"MAD_TO_SIGMA"}
Z_TEST_CONSTANTS = {1.4826}


def z_test_copies(text: str) -> list[str]:
    """The robust z test's constant written out (``1.4826``) or a ``MAD_TO_SIGMA`` of its own
    (defined, imported or used): the places that compute the test outside its helper."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, float) \
                and node.value in Z_TEST_CONSTANTS:
            found.append(f"{node.value!r} (line {node.lineno})")
        elif isinstance(node, ast.Name) and node.id in Z_TEST_NAMES:
            found.append(f"{node.id} (line {node.lineno})")
        elif isinstance(node, ast.Attribute) and node.attr in Z_TEST_NAMES:
            found.append(f".{node.attr} (line {node.lineno})")
        elif isinstance(node, ast.alias) and node.name in Z_TEST_NAMES:
            found.append(f"import {node.name}")
    return found


def test_the_statistics_helper_is_the_only_home_of_the_z_test():
    assert STATS in MODULES
    wrong = [f"{source}: {hit}" for source in MODULES if source != STATS
             for hit in z_test_copies(MODULES[source].read_text())]
    assert not wrong, (f"the robust ratio + z test lives in {STATS} (median_mad, "
                       "robust_spread, robust_z, ratio); found outside it:\n" + "\n".join(wrong))


def test_the_z_test_check_sees_a_copy():
    text = ("MAD_TO_SIGMA = 1.4826\n"
            "from prefect_dask_profiling.regression.stats import MAD_TO_SIGMA\n"
            "spread = stats.MAD_TO_SIGMA * mad\n"
            "sigma = 1.4826 * mad  # docstrings and comments may say 1.4826\n")
    assert len(z_test_copies(text)) == 5


# ------------------------------------------------- threads only in the one background service
# Calls that start a thread (or a pool of them). Nothing but ``prefect/`` and the flow
# process's one background service (``run/background.py``, Prefect-free) may make one.
THREAD_STARTERS = {"Thread", "Timer", "ThreadPoolExecutor", "start_new_thread", "to_thread",
                   "run_in_executor"}
# Known starters outside prefect/, each with why it is there. Remove an entry when its
# thread goes; add none.
THREADS_ALLOWED = {
    # The flow process's one background service: the thread everything after the verdict,
    # the stage reports and the live ETA run on.
    f"{PACKAGE}.run.background": "the flow process's one background service",
    # A benchmark fault (the "slow worker" plugin) burning CPU inside a Dask worker process
    # it is installed in: not the flow process, and the point of the workload.
    f"{PACKAGE}.bench.workloads": "worker-side CPU burners of the slow-worker fault",
}


def thread_starts(text: str) -> list[str]:
    """Calls of ``THREAD_STARTERS`` (plain or as attributes) and classes deriving ``Thread``."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else \
                func.attr if isinstance(func, ast.Attribute) else None
            if name in THREAD_STARTERS:
                found.append(f"{name}( (line {node.lineno})")
        elif isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = base.id if isinstance(base, ast.Name) else \
                    base.attr if isinstance(base, ast.Attribute) else None
                if name in {"Thread", "Timer"}:
                    found.append(f"class {node.name}({name}) (line {node.lineno})")
    return found


def test_nothing_outside_prefect_starts_a_thread():
    wrong = [f"{source}: {hit}" for source in MODULES
             if part(source) != "prefect" and source not in THREADS_ALLOWED
             for hit in thread_starts(MODULES[source].read_text())]
    assert not wrong, ("threads are started only in prefect/ and the flow process's one "
                       "background service, run/background.py; found:\n"
                       + "\n".join(wrong))


def test_the_thread_check_sees_a_thread():
    text = ("import threading\nfrom concurrent.futures import ThreadPoolExecutor\n"
            "threading.Thread(target=f).start()\n"
            "pool = ThreadPoolExecutor(2)\n"
            "class Worker(threading.Thread):\n    pass\n"
            "lock = threading.Lock()\n")
    assert len(thread_starts(text)) == 3


BENCHMARK_ROOT = Path(__file__).parents[1] / "benchmarks"
#: the targets, and the one-off investigations (benchmarks/investigations/)
BENCHMARKS = sorted([*BENCHMARK_ROOT.glob("*.py"), *BENCHMARK_ROOT.glob("investigations/*.py")])


IMPORT_EACH = """
import importlib, json, traceback
failed = {}
for name in NAMES:
    try:
        importlib.import_module("benchmarks." + name)
    except BaseException:
        failed[name] = traceback.format_exc()
print(json.dumps(failed))
"""


@pytest.fixture(scope="module")
def benchmark_imports() -> dict[str, str]:
    """Every benchmark imported in one fresh interpreter (Prefect, Dask and pandas are
    imported once for all of them): the traceback of each import that failed, by name."""
    names = [_dotted(path) for path in BENCHMARKS]
    done = subprocess.run([sys.executable, "-c", f"NAMES = {names!r}\n{IMPORT_EACH}"],
                          cwd=BENCHMARK_ROOT.parent, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _dotted(path: Path) -> str:
    """A benchmark's module name under ``benchmarks``: ``scale``, ``investigations.x``."""
    return ".".join(path.relative_to(BENCHMARK_ROOT).with_suffix("").parts)


@pytest.mark.parametrize("path", BENCHMARKS, ids=_dotted)
def test_every_benchmark_imports(path, benchmark_imports):
    """A benchmark that no longer imports is a figure nobody can re-measure (scale.py
    imported ``load_baseline`` from a module it had left)."""
    name = _dotted(path)
    assert name not in benchmark_imports, benchmark_imports[name][-2000:]


# ------------------------------------------------------------- bad input: the error tree
# Bad input raises the package's error tree (:mod:`prefect_dask_profiling.errors`): a value
# the caller gave is ``InvalidInput`` (a ``ValueError`` still), a malformed stored file
# ``DamagedRecord``... (issue 57). These builtins are never raised bare, except here:
BARE_RAISES = {"ValueError", "TypeError", "KeyError"}
BARE_ALLOWED = {
    # The scheduler runs these modules, sent by value to schedulers without the package:
    # they may import no package module outside timing/ (the checks above), errors.py
    # included. Their callers catch these builtins (``KeyError``: no such plugin).
    f"{PACKAGE}.timing.client": {"ValueError", "KeyError"},
    f"{PACKAGE}.timing.sketch": {"ValueError"},
}


def bare_raises(text: str) -> list[tuple[str, int]]:
    """``raise ValueError(...)`` (or ``TypeError``, ``KeyError``; called or not) in ``text``."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id in BARE_RAISES:
                found.append((exc.id, node.lineno))
    return found


def test_bad_input_raises_the_error_tree_not_a_bare_builtin():
    wrong = [f"{source}: raise {name} (line {line})" for source in MODULES
             for name, line in bare_raises(MODULES[source].read_text())
             if name not in BARE_ALLOWED.get(source, set())]
    assert not wrong, ("raise the package's errors (errors.py: InvalidInput for a value the "
                       "caller gave, DamagedRecord for a malformed stored file...), not bare "
                       "builtins:\n" + "\n".join(wrong))


def test_the_bare_raise_allow_list_is_needed_and_shipped():
    """Each allowed module runs on the scheduler, and still raises what it is allowed."""
    assert set(BARE_ALLOWED) <= shipped()
    for source, names in BARE_ALLOWED.items():
        assert {n for n, _ in bare_raises(MODULES[source].read_text())} == names, source


def test_the_bare_raise_check_sees_a_bare_raise():
    text = ("def f(x):\n"
            "    if x:\n        raise ValueError(f'bad {x}')\n"
            "    raise TypeError\n"
            "    raise InvalidInput('fine')\n"
            "    raise RuntimeError('internal')\n"
            "    raise errors.KeyError('an attribute: not the builtin')\n")
    assert sorted(bare_raises(text), key=lambda hit: hit[1]) == [("ValueError", 3),
                                                              ("TypeError", 4)]


# ------------------------------------------------------------------ the package's size
def load_line_counts():
    """``benchmarks/line_counts.py`` (stdlib only), loaded from its file."""
    import importlib.util

    path = Path(__file__).parents[1] / "benchmarks" / "line_counts.py"
    spec = importlib.util.spec_from_file_location("line_counts", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_line_counts_cover_the_package(capsys):
    """``benchmarks/line_counts.py`` (the figures of docs/architecture.md) counts every
    module and every class the checks above see; its report is printed (``pytest -s``)."""
    counts = load_line_counts()
    files, lines, by_part = counts.line_counts(ROOT)
    assert files == len(MODULES)
    assert lines == sum(p.read_bytes().count(b"\n") for p in MODULES.values())
    kinds = counts.line_kinds(ROOT)
    assert sum(kinds.values()) == lines and all(kinds[k] > 0 for k in counts.KINDS)
    assert {name.removesuffix(".py") for name in by_part} == {part(m) for m in MODULES}
    longest = counts.class_lengths(ROOT)
    assert {name for n, name in longest if n > MAX_CLASS_LINES} == set(LONG_CLASSES)
    with capsys.disabled():
        print("\n" + counts.report(5, ROOT))
