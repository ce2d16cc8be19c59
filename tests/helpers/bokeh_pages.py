"""Reading the Bokeh document out of a standalone page (``file_html`` and our frozen pages)."""

from __future__ import annotations

import json
import re


def page_document(page: str) -> dict:
    """The Bokeh document JSON embedded in a standalone page (its random doc id dropped)."""
    found = re.search(r'<script type="application/json" id="[^"]+">\s*(.*?)\s*</script>',
                      page, re.S)
    assert found is not None, "no Bokeh document in the page"
    return list(json.loads(found.group(1)).values())[0]
