"""A field's value on a page: the strings its selector finds, then its type applied to them.

CSS runs on selectolax's lexbor tree and XPath on parsel's lxml tree (each parsed only when a
field needs it): lexbor answers CSS fields in well under half of parsel's time, and has no XPath.
A node's text is its whole text content with whitespace collapsed, in both engines. A value that
is absent or does not read as its type (no number in the text, a date that does not parse) is
``None``: one odd page is data, not an error.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

from parsel import Selector
from selectolax.lexbor import LexborHTMLParser

from jetcrawl.worker.extract.spec import Field

__all__ = ["collapse", "css_strings", "parse_date", "parse_number", "typed", "xpath_strings"]

_NUMBER = re.compile(r"[-+]?\d(?:[\d,.'\u00a0\u202f ]*\d)?")
_GROUPING = str.maketrans("", "", "'\u00a0\u202f ")


def collapse(text: str) -> str:
    return " ".join(text.split())


def css_strings(tree: LexborHTMLParser, field: Field) -> list[str]:
    """The text (or ``field.attr``) of every node ``field.css`` selects, in document order."""
    assert field.css is not None
    nodes = tree.css(field.css) if _wants_all(field) else [tree.css_first(field.css)]
    if field.attr is None:
        return [collapse(node.text(deep=True)) for node in nodes if node is not None]
    return [
        value
        for node in nodes
        if node is not None and (value := node.attrs.get(field.attr)) is not None
    ]


def xpath_strings(selector: Selector, field: Field) -> list[str]:
    """The strings ``field.xpath`` selects: text and attribute results as they are, elements by
    their text (or ``field.attr``)."""
    assert field.xpath is not None
    found = selector.xpath(field.xpath)
    strings: list[str] = []
    for result in found if _wants_all(field) else found[:1]:
        root = result.root
        if isinstance(root, str):
            strings.append(collapse(root) if field.attr is None else root)
        elif isinstance(root, bool | int | float):  # count(), boolean(): the value itself
            strings.append(str(root))
        elif field.attr is not None:
            if (value := root.get(field.attr)) is not None:
                strings.append(value)
        else:
            strings.append(collapse(result.xpath("string(.)").get("")))
    return strings


def typed(field: Field, strings: list[str]) -> Any:
    """The value of ``field`` from the strings its selector found."""
    if field.type == "list":
        return [s for s in strings if s]
    if field.type == "regex":
        assert field.pattern is not None
        for string in strings:
            if (found := field.pattern.search(string)) is not None:
                return found.group(1) if field.pattern.groups else found.group(0)
        return None
    first = strings[0] if strings else ""
    if not first:
        return None
    if field.type == "number":
        return parse_number(first)
    if field.type == "date":
        return parse_date(first, field.date_format)
    return first  # text, attribute


def parse_number(text: str) -> int | float | None:
    """The first number written in ``text``: ``"€1,299.50"`` -> 1299.5, ``"1.299,50 €"`` ->
    1299.5, ``"12 items"`` -> 12. Of ``,`` and ``.`` the last one is the decimal mark when both
    appear; alone, ``.`` is one, and ``,`` is one unless three digits follow it."""
    found = _NUMBER.search(text)
    if found is None:
        return None
    number = found.group(0).translate(_GROUPING)
    comma, dot = number.rfind(","), number.rfind(".")
    if comma >= 0 and dot >= 0:
        decimal = "," if comma > dot else "."
    elif comma >= 0:
        decimal = "," if number.count(",") == 1 and len(number) - comma - 1 != 3 else ""
    elif dot >= 0:
        decimal = "." if number.count(".") == 1 else ""
    else:
        decimal = ""
    whole, _, fraction = number.rpartition(decimal) if decimal else (number, "", "")
    whole = whole.replace(",", "").replace(".", "")
    if not fraction:
        return int(whole)
    return float(f"{whole}.{fraction}")


def parse_date(text: str, date_format: str | None = None) -> str | None:
    """``text`` as an ISO 8601 date or date-time, read by ``date_format`` (strptime) or as ISO
    8601; None if it does not read."""
    text = text.strip()
    try:
        if date_format is not None:
            parsed = datetime.datetime.strptime(text, date_format)
            if not any(directive in date_format for directive in ("%H", "%I", "%M", "%S")):
                return parsed.date().isoformat()
            return parsed.isoformat()
        if len(text) == 10:
            return datetime.date.fromisoformat(text).isoformat()
        return datetime.datetime.fromisoformat(text).isoformat()
    except ValueError:
        return None


def _wants_all(field: Field) -> bool:
    return field.type in ("list", "regex")
