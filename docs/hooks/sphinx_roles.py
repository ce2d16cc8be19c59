"""MkDocs hook: show the Sphinx roles of the numpydoc docstrings as plain code.

The docstrings cross-reference with Sphinx roles (``:class:`~a.b.C```), which mkdocstrings
renders literally (``:class:<code>~a.b.C</code>``). This keeps the code span and drops the
role; a leading ``~`` shows the last name only, as Sphinx does.
"""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):(?:<code>([^<]*)</code>|`([^`]*)`)")


def _short(match: re.Match[str]) -> str:
    target = match.group(1) if match.group(1) is not None else match.group(2)
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"<code>{target}</code>"


def on_page_content(html: str, **kwargs: Any) -> str:
    """Replace every rendered role by its code span."""
    return ROLE.sub(_short, html)
