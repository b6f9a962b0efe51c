"""Metadata a page embeds for machines: JSON-LD, OpenGraph and microdata, read from lexbor's tree.

The three are read from the tree the CSS fields already parsed, with orjson for JSON-LD, instead of
extruct (lxml, rdflib): the bench (``python -m bench extract``) compares both. What is malformed
(a JSON-LD block that is not JSON) is left out, as a browser would ignore it.

    json_ld    a list of the JSON-LD objects, ``@graph`` members as objects of their own
    opengraph  ``{"og:title": ..., "product:price:amount": ...}``; a repeated property: a list
    microdata  a list of the top-level items, ``{"type": ..., "id": ..., "properties": {...}}``;
               a repeated property is a list, a nested item is an object of the same shape
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urljoin

import orjson
from selectolax.lexbor import LexborHTMLParser, LexborNode

from jetcrawl.worker.extract.fields import collapse

__all__ = ["json_ld", "microdata", "opengraph"]

_OPENGRAPH_PREFIXES = ("og:", "article:", "product:", "book:", "profile:", "music:", "video:")
# Where a microdata property's value is, by element (the HTML standard's itemprop values).
_URL_ATTRIBUTE = {
    "a": "href",
    "area": "href",
    "link": "href",
    "audio": "src",
    "embed": "src",
    "iframe": "src",
    "img": "src",
    "source": "src",
    "track": "src",
    "video": "src",
    "object": "data",
}
_VALUE_ATTRIBUTE = {"meta": "content", "data": "value", "meter": "value", "time": "datetime"}


def json_ld(tree: LexborHTMLParser) -> list[Any]:
    found: list[Any] = []
    for script in tree.tags("script"):
        if (script.attrs.get("type") or "").strip().lower() != "application/ld+json":
            continue
        try:
            data = orjson.loads(script.text(deep=True))
        except orjson.JSONDecodeError:
            continue
        for obj in data if isinstance(data, list) else [data]:
            if not isinstance(obj, dict):
                continue  # JSON-LD describes things as objects: a bare value says nothing
            graph = obj.get("@graph")
            if isinstance(graph, list):
                found.extend(member for member in graph if isinstance(member, dict))
            else:
                found.append(obj)
    return found


def opengraph(tree: LexborHTMLParser) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for meta in tree.tags("meta"):
        name = meta.attrs.get("property") or ""
        content = meta.attrs.get("content")
        if content is None or not name.startswith(_OPENGRAPH_PREFIXES):
            continue
        if name not in found:
            found[name] = content
        elif isinstance(found[name], list):
            found[name].append(content)
        else:
            found[name] = [found[name], content]
    return found


def microdata(tree: LexborHTMLParser, page_url: str) -> list[dict[str, Any]]:
    return [
        _item(node, page_url)
        for node in tree.css("[itemscope]")
        if "itemprop" not in node.attrs or not _inside_item(node)
    ]


def _inside_item(node: LexborNode) -> bool:
    parent = node.parent
    while parent is not None and parent.is_element_node:
        if "itemscope" in parent.attrs:
            return True
        parent = parent.parent
    return False


def _item(scope: LexborNode, page_url: str) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    _collect(scope, page_url, properties)
    item: dict[str, Any] = {"type": scope.attrs.get("itemtype"), "properties": properties}
    if (item_id := scope.attrs.get("itemid")) is not None:
        item["id"] = item_id
    return item


def _collect(parent: LexborNode, page_url: str, properties: dict[str, Any]) -> None:
    """The properties under ``parent``, not descending into nested items."""
    for child in parent.iter(include_text=False):
        if not child.is_element_node:  # a comment
            continue
        names = (child.attrs.get("itemprop") or "").split()
        if names:
            value = _value(child, page_url)
            for name in names:
                _add(properties, name, value)
        if "itemscope" not in child.attrs:
            _collect(child, page_url, properties)


def _value(node: LexborNode, page_url: str) -> Any:
    if "itemscope" in node.attrs:
        return _item(node, page_url)
    tag = node.tag or ""
    if (attribute := _URL_ATTRIBUTE.get(tag)) is not None:
        return urljoin(page_url, node.attrs.get(attribute) or "")
    if (attribute := _VALUE_ATTRIBUTE.get(tag)) is not None:
        value = node.attrs.get(attribute)
        if value is not None:
            return value
    return collapse(node.text(deep=True))


def _add(properties: dict[str, Any], name: str, value: Any) -> None:
    if name not in properties:
        properties[name] = value
    elif isinstance(properties[name], list):
        properties[name].append(value)
    else:
        properties[name] = [properties[name], value]
