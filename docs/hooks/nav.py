"""MkDocs hook: pages of docs/ that the nav of mkdocs.yml does not list go under "More".

A page is then never left out of the site (and a nav entry is never written for a page that
does not exist yet): to place a page, list it in ``nav`` under its section.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _listed(entries: Any) -> set[str]:
    """Every page path named anywhere in a nav (nested lists and dicts of titles)."""
    if isinstance(entries, str):
        return {entries}
    if isinstance(entries, list):
        return set().union(*(_listed(e) for e in entries)) if entries else set()
    if isinstance(entries, dict):
        return set().union(*(_listed(v) for v in entries.values())) if entries else set()
    return set()


def on_config(config: Any) -> Any:
    """Append the unlisted pages, sorted by path, as a "More" section."""
    docs = Path(config["docs_dir"])
    listed = _listed(config["nav"] or [])
    extra = sorted(p.relative_to(docs).as_posix() for p in docs.rglob("*.md")
                   if not p.relative_to(docs).as_posix().startswith("hooks/"))
    extra = [page for page in extra if page not in listed]
    if extra and config["nav"] is not None:
        config["nav"].append({"More": extra})
    return config
