"""The ``extract`` section of a job spec, checked and compiled: rules of fields, metadata, content.

``compile_rules`` reads the section (already parsed from JSON or YAML) into frozen :class:`Rule`
and :class:`Field` objects, compiling every regex, CSS selector and XPath expression once, so a
spec that would fail on a page fails here instead, with a :class:`SpecError` naming the field's
path (``extract.rules[1].fields.price.css``). Every mapping is closed: an unknown key is refused,
as a misspelt option silently ignored would be worse than none.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

from cssselect import SelectorError
from cssselect import parse as parse_css
from lxml import etree
from selectolax.lexbor import LexborHTMLParser, SelectolaxError

from jetcrawl.contract.errors import SpecError

__all__ = [
    "CONTENT_FORMATS",
    "FIELD_TYPES",
    "METADATA_KINDS",
    "PAGE_KEY",
    "RESERVED_NAMES",
    "Field",
    "Rule",
    "compile_rules",
]

FieldType = Literal["text", "attribute", "list", "regex", "number", "date"]
FIELD_TYPES: Final = get_args(FieldType)
MetadataKind = Literal["json-ld", "opengraph", "microdata"]
METADATA_KINDS: Final = get_args(MetadataKind)
ContentFormat = Literal["markdown", "text"]
CONTENT_FORMATS: Final = get_args(ContentFormat)
PAGE_KEY: Final = (
    "page"  # a rule's default key: one item per page (its fingerprint tells pages apart)
)
# Where a rule puts its metadata and content in the item: no field may take these names.
RESERVED_NAMES: Final = frozenset({"json_ld", "opengraph", "microdata", "content"})

_SECTION_KEYS = ("rules",)
_RULE_KEYS = ("match", "key", "fields", "metadata", "content")
_FIELD_KEYS = ("css", "xpath", "type", "attr", "pattern", "format")
_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")  # no ".": it would blur a path
_PROBE = LexborHTMLParser("<html><body></body></html>")  # runs a selector once, to check it


@dataclass(frozen=True, slots=True)
class Field:
    """One value an item takes from a page."""

    name: str
    css: str | None  # exactly one of css and xpath
    xpath: str | None  # checked by lxml; run by parsel
    type: FieldType
    attr: str | None  # read this attribute instead of the text
    pattern: re.Pattern[str] | None  # type "regex": the first group (or the match) is the value
    date_format: str | None  # type "date": a strptime format; None: ISO 8601


@dataclass(frozen=True, slots=True)
class Rule:
    """What to take from pages whose URL ``match`` finds a match in."""

    match: re.Pattern[str]
    key: str  # PAGE_KEY or the name of one of ``fields``
    fields: tuple[Field, ...]
    metadata: frozenset[MetadataKind]
    content: ContentFormat | None


def compile_rules(doc: Any, path: str) -> tuple[Rule, ...]:
    """The rules of the ``extract`` section ``doc`` at ``path``; raises ``SpecError``."""
    section = _mapping(doc, path, _SECTION_KEYS)
    rules = section.get("rules", [])
    if not isinstance(rules, list):
        raise SpecError(f"{path}.rules", f"must be a list of rules, got {_kind(rules)}")
    return tuple(_rule(rule, f"{path}.rules[{at}]") for at, rule in enumerate(rules))


def _rule(doc: Any, path: str) -> Rule:
    rule = _mapping(doc, path, _RULE_KEYS)
    if "match" not in rule:
        raise SpecError(f"{path}.match", "missing: a regex the page URL must match")
    match = _regex(rule["match"], f"{path}.match")
    fields_doc = rule.get("fields", {})
    if not isinstance(fields_doc, Mapping):
        raise SpecError(
            f"{path}.fields", f"must be a mapping of names to fields, got {_kind(fields_doc)}"
        )
    fields = tuple(_field(name, spec, f"{path}.fields.{name}") for name, spec in fields_doc.items())
    metadata = _metadata(rule.get("metadata", []), f"{path}.metadata")
    content = rule.get("content")
    if content is not None and content not in CONTENT_FORMATS:
        raise SpecError(
            f"{path}.content", f"must be one of {_choices(CONTENT_FORMATS)}, got {content!r}"
        )
    if not (fields or metadata or content):
        raise SpecError(path, "takes nothing: give it fields, metadata or content")
    key = rule.get("key", PAGE_KEY)
    by_name = {field.name: field for field in fields}
    if not isinstance(key, str) or (key != PAGE_KEY and key not in by_name):
        names = _choices([PAGE_KEY, *by_name])
        raise SpecError(f"{path}.key", f"must be {names}, got {key!r}")
    if key in by_name and by_name[key].type == "list":
        raise SpecError(f"{path}.key", f"field {key!r} is a list: a key is one value")
    return Rule(match, key, fields, metadata, content)


def _field(name: Any, doc: Any, path: str) -> Field:
    if not isinstance(name, str) or not _FIELD_NAME.fullmatch(name):
        raise SpecError(
            path, "a field name is a letter or _, then up to 63 letters, digits, _ or -"
        )
    if name in RESERVED_NAMES:
        raise SpecError(path, f"{name!r} is where a rule puts its metadata or content: rename it")
    field = _mapping(doc, path, _FIELD_KEYS)
    if ("css" in field) == ("xpath" in field):
        raise SpecError(path, "give exactly one of css and xpath")
    kind = field.get("type", "text")
    if kind not in FIELD_TYPES:
        raise SpecError(f"{path}.type", f"must be one of {_choices(FIELD_TYPES)}, got {kind!r}")
    attr = _optional_str(field, "attr", path)
    if kind == "attribute" and attr is None:
        raise SpecError(f"{path}.attr", "missing: type attribute reads the attribute named here")
    if kind == "regex":
        if "pattern" not in field:
            raise SpecError(f"{path}.pattern", "missing: type regex takes its value by this regex")
        pattern = _regex(field["pattern"], f"{path}.pattern")
    elif "pattern" in field:
        raise SpecError(f"{path}.pattern", f"only type regex takes a pattern (this is {kind})")
    else:
        pattern = None
    date_format = _optional_str(field, "format", path)
    if date_format is not None and kind != "date":
        raise SpecError(f"{path}.format", f"only type date takes a format (this is {kind})")
    css = _css(field["css"], f"{path}.css") if "css" in field else None
    xpath = _xpath(field["xpath"], f"{path}.xpath") if "xpath" in field else None
    return Field(name, css, xpath, kind, attr, pattern, date_format)


def _metadata(doc: Any, path: str) -> frozenset[MetadataKind]:
    if not isinstance(doc, list):
        raise SpecError(path, f"must be a list of {_choices(METADATA_KINDS)}, got {_kind(doc)}")
    for at, kind in enumerate(doc):
        if kind not in METADATA_KINDS:
            raise SpecError(
                f"{path}[{at}]", f"must be one of {_choices(METADATA_KINDS)}, got {kind!r}"
            )
    return frozenset(doc)


def _css(selector: Any, path: str) -> str:
    if not isinstance(selector, str) or not selector.strip():
        raise SpecError(path, f"must be a CSS selector, got {selector!r}")
    try:
        _PROBE.css(selector)  # the engine that runs it must take it
    except SelectolaxError as exc:  # it says only that it cannot: cssselect says where
        raise SpecError(
            path, f"invalid CSS selector {selector!r}: {_css_problem(selector, exc)}"
        ) from None
    return selector


def _css_problem(selector: str, exc: SelectolaxError) -> str:
    try:
        parse_css(selector)
    except SelectorError as described:
        return str(described)
    if "::" in selector:
        return (
            "no pseudo-elements (::text, ::attr() are parsel's): the field's attr says what to read"
        )
    return str(exc)


def _xpath(expression: Any, path: str) -> str:
    if not isinstance(expression, str) or not expression.strip():
        raise SpecError(path, f"must be an XPath expression, got {expression!r}")
    try:
        etree.XPath(expression)
    except etree.XPathSyntaxError as exc:
        raise SpecError(path, f"invalid XPath {expression!r}: {exc}") from None
    return expression


def _regex(pattern: Any, path: str) -> re.Pattern[str]:
    if not isinstance(pattern, str):
        raise SpecError(path, f"must be a regex (a string), got {_kind(pattern)}")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise SpecError(path, f"invalid regex {pattern!r}: {exc}") from None


def _mapping(doc: Any, path: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise SpecError(path, f"must be a mapping, got {_kind(doc)}")
    for key in doc:
        if key not in keys:
            raise SpecError(f"{path}.{key}", f"unknown field; known: {', '.join(keys)}")
    return doc


def _optional_str(doc: Mapping[str, Any], key: str, path: str) -> str | None:
    value = doc.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise SpecError(f"{path}.{key}", f"must be a non-empty string, got {value!r}")
    return value


def _choices(values: Any) -> str:
    return ", ".join(repr(v) for v in values)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
