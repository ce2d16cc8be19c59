"""MkDocs hook: the tables of options, drawn from the docstrings of the classes that own them.

An option's name, default and meaning live once, in its class: the field and its entry in
the numpydoc ``Parameters`` of :class:`~prefect_dask_profiling.options.ProfilingOptions`
(the runner's keywords) or of :class:`~prefect_dask_profiling.regression.rule.RegressionRule`
(the keys of ``check_options``). A page asks for a table with a marker line::

    <!-- options-table: prefect_dask_profiling.options.ProfilingOptions -->
    <!-- options-table: prefect_dask_profiling.regression.rule.RegressionRule check_options -->

The second form keeps only the fields named by the class's ``CHECK_OPTION_KEYS``. So a new
option is a field and its docstring entry, and the page follows (griffe parses the
docstring, as mkdocstrings does for the API page).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from typing import Any

import griffe

MARKER = re.compile(r"^<!-- options-table: ([\w.]+)( check_options)? -->$", re.M)
_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):`~?([^`]*)`")
_DOC_PAGE = re.compile(r"docs/([\w-]+)\.md(#[\w-]+)?")


def _markdown(text: str) -> str:
    """One table cell from a docstring's text: code spans, short roles, links to pages."""
    text = _ROLE.sub(lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", text)
    text = text.replace("``", "`")
    text = _DOC_PAGE.sub(lambda m: f"[{m.group(1)}]({m.group(1)}.md{m.group(2) or ''})", text)
    return " ".join(text.split()).replace("|", "\\|")


def _default(option: dataclasses.Field) -> str:
    """The option's default as a code span (strings quoted as a script writes them)."""
    if option.default_factory is not dataclasses.MISSING:
        value: Any = option.default_factory()
    else:
        value = option.default
    return f'`"{value}"`' if isinstance(value, str) else f"`{value!r}`"


def _described(cls: type) -> dict[str, str]:
    """Each documented parameter of ``cls`` and its description (a ``a, b`` entry for both)."""
    # the types are the fields', not the docstring's: no warning for their absence (a
    # warning fails the strict build)
    sections = griffe.Docstring(inspect.getdoc(cls) or "").parse("numpy",
                                                                 warn_missing_types=False)
    described = {}
    for section in sections:
        if section.kind is griffe.DocstringSectionKind.parameters:
            for parameter in section.value:
                for name in parameter.name.split(","):
                    described[name.strip()] = parameter.description
    return described


def options_table(path: str, check_options: bool = False) -> str:
    """The markdown table of the fields of the class at ``path``: name, default, meaning.

    Raises ``ValueError`` naming a field its docstring does not describe, so the build
    (strict) fails instead of showing an empty cell.
    """
    module, name = path.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    options = dataclasses.fields(cls)
    if check_options:
        keys = importlib.import_module(module).CHECK_OPTION_KEYS
        options = [option for option in options if option.name in keys]
    described = _described(cls)
    missing = [option.name for option in options if option.name not in described]
    if missing:
        raise ValueError(f"{path}'s docstring does not describe {missing}")
    rows = [f"| `{option.name}` | {_default(option)} | {_markdown(described[option.name])} |"
            for option in options]
    head = "| key | default | meaning |" if check_options else "| argument | default | meaning |"
    return "\n".join([head, "|---|---|---|", *rows])


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Replace every marker line by its table."""
    return MARKER.sub(lambda m: options_table(m.group(1), bool(m.group(2))), markdown)
