"""Bokeh pages drawn again and again from one layout: serialized once, then re-encoded in part.

A run draws the same pages every night (a performance report per stage, the trend page):
the same models, only their data differ. Walking every model's properties is most of
Bokeh's serialization time, and they do not change; :class:`FrozenPage` serializes a
layout once and afterwards re-encodes only the properties its owner says change.
:class:`LayoutPool` shares built layouts between the threads of a process (one layout is
filled and drawn by one thread at a time). Bokeh is imported only when a page is drawn.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = ["FrozenPage", "LayoutPool"]

Layout = TypeVar("Layout")


@dataclass
class _Frozen:
    """A document serialized once: its JSON, render items, JS bundle and objects by id."""

    docs_json: dict
    items: list
    bundle: Any
    objects: dict[str, dict]


class FrozenPage:
    """The standalone HTML page (Bokeh from its CDN) of ``root``, re-encoding only
    ``changed()`` after the first page.

    Parameters
    ----------
    root
        The layout's root model; its models must not change after the first page, only
        the properties ``changed`` lists.
    changed
        The (model, property name) pairs that differ from one page to the next.
    template
        A Jinja template for the page (default: Bokeh's ``file_html`` one).
    """

    def __init__(self, root: Any, changed: Callable[[], list[tuple[Any, str]]],
                 template: Any = None) -> None:
        self.root = root
        self.changed = changed
        self.template = template
        self._frozen: _Frozen | None = None

    def html(self, title: str) -> str:
        """The page of the models' current values.

        Bokeh's own serialization the first time; afterwards that document with only the
        changed properties encoded again.
        """
        from bokeh.embed.elements import html_page_for_render_items

        if self._frozen is None:
            self._frozen = _serialize(self.root)
        else:
            serializer = _serializer()
            for model, name in self.changed():
                entry = self._frozen.objects[model.id].setdefault("attributes", {})
                if _is_set(model, name):
                    entry[name] = serializer.encode(getattr(model, name))
                else:  # as Bokeh writes a model: a property never set is left out
                    entry.pop(name, None)
        frozen = self._frozen
        kwargs = {"template": self.template} if self.template is not None else {}
        return html_page_for_render_items(frozen.bundle, frozen.docs_json, frozen.items,
                                          title=title, **kwargs)


def _serializer() -> Any:
    """Bokeh's ``Serializer`` (not deferred), passing a list of strings through whole.

    Bokeh encodes a list item by item, and a string encodes as itself: a report's text
    columns (task names, colours, durations, keys: a row per task) cost more than the rest
    of the page. The output is the same; a list holding anything else is Bokeh's to encode.
    """
    return _string_list_serializer()(deferred=False)


@functools.cache
def _string_list_serializer() -> type:
    from bokeh.core.serialization import Serializer

    class StringListSerializer(Serializer):
        def _encode_list(self, obj: list[Any]) -> Any:
            if all(type(item) is str for item in obj):
                return list(obj)
            return super()._encode_list(obj)

    return StringListSerializer


def _is_set(model: Any, name: str) -> bool:
    """Whether Bokeh would write ``name`` of ``model`` (set, themed or an unstable default).

    Bokeh's ``properties_with_values(include_defaults=False)`` answers, but reads every
    property of the model (milliseconds a page); its own bookkeeping answers at once.
    """
    values = getattr(model, "_property_values", None)
    if values is None:  # another Bokeh: ask it the long way
        return name in model.properties_with_values(include_defaults=False)
    if name in values or name in getattr(model, "_unstable_default_values", {}):
        return True
    themed = model.themed_values()
    return themed is not None and name in themed


def _serialize(root: Any) -> _Frozen:
    from bokeh.embed.bundle import bundle_for_objs_and_resources
    from bokeh.embed.util import OutputDocumentFor, standalone_docs_json_and_render_items
    from bokeh.resources import CDN

    with OutputDocumentFor([root]) as doc:
        docs_json, items = standalone_docs_json_and_render_items([root])
        bundle = bundle_for_objs_and_resources([doc], CDN)
    objects: dict[str, dict] = {}
    stack: list[Any] = [docs_json]
    while stack:  # every serialized model, by id (each is written out in full once)
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "object" and "id" in node and "name" in node:
                objects[node["id"]] = node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return _Frozen(docs_json=docs_json, items=items, bundle=bundle, objects=objects)


@dataclass
class LayoutPool(Generic[Layout]):
    """Built layouts not in use, shared by every thread of the process.

    Parameters
    ----------
    build
        Makes a new layout when none is free (two pages drawn at once get two).
    """

    build: Callable[[], Layout]
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _free: list[Layout] = field(default_factory=list, init=False, repr=False)

    @property
    def idle(self) -> list[Layout]:
        """The layouts not in use now, the most recently used last."""
        with self._lock:
            return list(self._free)

    @contextmanager
    def layout(self) -> Iterator[Layout]:
        """A layout for this thread alone; back in the pool after, unless drawing it
        raised (possibly half-filled: never reused)."""
        with self._lock:
            layout = self._free.pop() if self._free else None
        layout = layout if layout is not None else self.build()
        yield layout  # an exception propagates and the layout is dropped
        with self._lock:
            self._free.append(layout)
