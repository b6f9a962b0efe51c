"""Job specs: what a named crawl follows, how far, and what it takes from its pages.

A spec is a JSON or YAML document, stored versioned in KV ``crawl_specs`` under its name
(``jetcrawl job put``). The dispatcher applies its link rules, filters and limits when it admits
a URL; the worker applies its content types, extraction and plugins to a fetched page. Reading is
strict: an unknown field, a wrong type or a bad regex is a :class:`SpecError` naming its path
(``links.allow[2]``), so a typo is refused at ``job put`` instead of crawling the wrong thing.

A new section is a new top-level field of this
document: one name in ``FIELDS``, one reader, and an attribute of :class:`JobSpec`.

The stored record (:class:`StoredSpec`) is the document as given plus its version, which counts
the puts that changed it: 1, 2, 3, ...
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

import orjson

from jetcrawl.contract.errors import MessageError, SpecError
from jetcrawl.contract.fetchpolicy import FetchPolicy
from jetcrawl.contract.filetypes import (
    EXTENSION_RE,
    MEDIA_TYPE_RE,
    ExtensionRule,
    extension_rule,
    media_types,
)
from jetcrawl.contract.messages import JOB_RE, check_priority
from jetcrawl.contract.wire import WIRE_VERSION, json_object, typed

__all__ = [
    "FIELDS",
    "PLUGIN_NAME_RE",
    "JobSpec",
    "LinkRules",
    "Priority",
    "StoredSpec",
    "canonical_doc",
]

FIELDS = frozenset(
    {
        "name",  # the job's name: what seeds say in "job"
        "links",  # allow and deny regexes on URLs, optionally per domain
        "content_types",  # media types whose bodies are read, extracted and followed
        "extensions",  # URL path extensions followed ("allow"), refused ("deny"), "default" list
        "max_depth",  # link depth from the seeds, at most (and at most the seed's own)
        "max_pages",  # URLs admitted for the job in all
        "recrawl_after_s",  # a URL of the job may be admitted again after this long
        "extract",  # declarative extraction (worker/extract.py compiles it)
        "plugins",  # entry-point names in the group jetcrawl.plugins
        "fetch",  # render, proxies, User-Agent, soft blocks (contract/fetchpolicy.py)
        "priority",  # the job's level, its share against other jobs, levels per URL regex
        "max_pages_per_s",  # pages fetched per second across the mesh, at most
    }
)
LINK_FIELDS = frozenset({"allow", "deny", "domains"})
DOMAIN_FIELDS = frozenset({"allow", "deny"})
EXTENSION_FIELDS = frozenset({"allow", "deny", "default"})
PRIORITY_FIELDS = frozenset({"default", "weight", "rules"})
PRIORITY_RULE_FIELDS = frozenset({"match", "level"})
MAX_JOB_WEIGHT = 1000
DEFAULT_CONTENT_TYPES = ("text/html", "application/xhtml+xml")
PLUGIN_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_DOMAIN = re.compile(r"^[a-z0-9.-]{1,253}$")


# ---------------------------------------------------------------- reading a document


def _expect(value: Any, kind: type | tuple[type, ...], path: str, what: str) -> Any:
    # bool is an int in Python, never in a spec
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise SpecError(path, f"must be {what}, got a boolean")
    if not isinstance(value, kind):
        raise SpecError(path, f"must be {what}, got {_json_type(value)}")
    return value


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    for kind, name in names.items():
        if isinstance(value, kind):
            return name
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return "a number"
    return type(value).__name__


def _object(value: Any, path: str, known: frozenset[str]) -> dict[str, Any]:
    obj: dict[str, Any] = _expect(value, dict, path, "an object")
    for key in obj:
        if key not in known:
            where = f"{path}.{key}" if path else str(key)
            raise SpecError(where, f"unknown field (known: {', '.join(sorted(known))})")
    return obj


def _strings(value: Any, path: str) -> list[str]:
    items = _expect(value, list, path, "a list of strings")
    for i, item in enumerate(items):
        _expect(item, str, f"{path}[{i}]", "a string")
    return list(items)


def _patterns(value: Any, path: str) -> tuple[re.Pattern[str], ...]:
    out = []
    for i, text in enumerate(_strings(value, path)):
        try:
            out.append(re.compile(text))
        except re.error as e:
            raise SpecError(f"{path}[{i}]", f"not a regular expression: {e}") from e
    return tuple(out)


def _limit(value: Any, path: str, minimum: int) -> int:
    number: int = _expect(value, int, path, "a whole number")
    if number < minimum:
        raise SpecError(path, f"must be at least {minimum}, got {number}")
    return number


# ---------------------------------------------------------------- the spec


@dataclass(frozen=True, slots=True)
class Priority:
    """A job's priority section: its level (None: the seed's, else the settings'), its weight
    against the other jobs of a level on a shard, and a level per URL regex (first match)."""

    default: int | None = None
    weight: int = 1
    rules: tuple[tuple[re.Pattern[str], int], ...] = ()

    @classmethod
    def read(cls, value: Any, path: str = "priority") -> Self:
        obj = _object(value, path, PRIORITY_FIELDS)
        default = _level(obj["default"], f"{path}.default") if "default" in obj else None
        weight = _limit(obj["weight"], f"{path}.weight", 1) if "weight" in obj else 1
        if weight > MAX_JOB_WEIGHT:
            raise SpecError(f"{path}.weight", f"must be at most {MAX_JOB_WEIGHT}, got {weight}")
        rules = []
        for i, rule in enumerate(_expect(obj.get("rules", []), list, f"{path}.rules", "a list")):
            where = f"{path}.rules[{i}]"
            rule = _object(rule, where, PRIORITY_RULE_FIELDS)
            for key in PRIORITY_RULE_FIELDS:
                if key not in rule:
                    raise SpecError(f"{where}.{key}", "missing")
            (pattern,) = _patterns([rule["match"]], f"{where}.match")
            rules.append((pattern, _level(rule["level"], f"{where}.level")))
        return cls(default, weight, tuple(rules))

    def level_of(self, url: str) -> int | None:
        """The level of the first rule matching ``url``; None if none does."""
        for pattern, level in self.rules:
            if pattern.search(url):
                return level
        return None


def _level(value: Any, path: str) -> int:
    try:
        return check_priority(value, "a priority level")
    except MessageError as e:
        raise SpecError(path, e.detail) from None


@dataclass(frozen=True, slots=True)
class Rules:
    """Allow and deny regexes (searched anywhere in the URL); deny wins, no allow allows all."""

    allow: tuple[re.Pattern[str], ...] = ()
    deny: tuple[re.Pattern[str], ...] = ()

    @classmethod
    def read(cls, obj: dict[str, Any], path: str) -> Self:
        allow = _patterns(obj["allow"], f"{path}.allow") if "allow" in obj else ()
        deny = _patterns(obj["deny"], f"{path}.deny") if "deny" in obj else ()
        return cls(allow, deny)


@dataclass(frozen=True, slots=True)
class LinkRules:
    """Which URLs a job follows: its rules, and a domain's own rules for the URLs of that
    domain and its subdomains (the longest matching domain's; they add to the job's)."""

    everywhere: Rules = field(default_factory=Rules)
    domains: Mapping[str, Rules] = field(default_factory=dict)

    @classmethod
    def read(cls, value: Any, path: str = "links") -> Self:
        obj = _object(value, path, LINK_FIELDS)
        domains: dict[str, Rules] = {}
        listed = _expect(obj.get("domains", {}), dict, f"{path}.domains", "an object")
        for name, rules in listed.items():
            where = f"{path}.domains[{name}]"
            if not _DOMAIN.match(name) or name.strip(".") != name:
                raise SpecError(where, "not a lowercase host or domain name")
            domains[name] = Rules.read(_object(rules, where, DOMAIN_FIELDS), where)
        return cls(Rules.read(obj, path), domains)

    def allows(self, url: str, host: str) -> bool:
        """Whether the canonical ``url`` (whose host is ``host``) may be followed."""
        rules = [self.everywhere]
        domain = self._domain_of(host)
        if domain is not None:
            rules.append(self.domains[domain])
        if any(p.search(url) for r in rules for p in r.deny):
            return False
        allows = [p for r in rules for p in r.allow]
        return not allows or any(p.search(url) for p in allows)

    def _domain_of(self, host: str) -> str | None:
        best = None
        for domain in self.domains:
            if (host == domain or host.endswith(f".{domain}")) and (
                best is None or len(domain) > len(best)
            ):
                best = domain
        return best


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job's spec, read and checked; ``doc`` is the document as given."""

    name: str
    doc: Mapping[str, Any]
    links: LinkRules = field(default_factory=LinkRules)
    content_types: tuple[str, ...] = DEFAULT_CONTENT_TYPES
    extensions_allow: frozenset[str] = frozenset()  # empty: every extension
    extensions_deny: frozenset[str] = frozenset()
    extensions_default: bool = True  # the crawl's ignored_extensions apply too
    max_depth: int | None = None
    max_pages: int | None = None
    recrawl_after_s: float | None = None
    extract: Any = None  # the raw section: worker/extract.py compiles it
    plugins: tuple[str, ...] = ()
    fetch: FetchPolicy | None = None  # None: the workers' settings
    priority: Priority = field(default_factory=Priority)
    max_pages_per_s: float | None = None  # None: no cap but politeness

    @classmethod
    def read(cls, doc: Any) -> Self:
        """The spec ``doc`` (a decoded JSON or YAML document) holds; raises :class:`SpecError`."""
        obj = _object(doc, "", FIELDS)
        if "name" not in obj:
            raise SpecError("name", "missing: a spec names its job")
        name = _expect(obj["name"], str, "name", "a string")
        if not JOB_RE.match(name):
            raise SpecError("name", f"must match {JOB_RE.pattern}, got {name[:80]!r}")
        allow, deny, default = cls._extensions(obj.get("extensions"))
        recrawl = obj.get("recrawl_after_s")
        if recrawl is not None:
            _expect(recrawl, (int, float), "recrawl_after_s", "a number of seconds")
            if recrawl < 1:
                raise SpecError("recrawl_after_s", f"must be at least 1 second, got {recrawl}")
        extract = obj.get("extract")
        if extract is not None:
            _expect(extract, dict, "extract", "an object")
        return cls(
            name=name,
            doc=obj,
            links=LinkRules.read(obj["links"]) if "links" in obj else LinkRules(),
            content_types=cls._content_types(obj.get("content_types")),
            extensions_allow=allow,
            extensions_deny=deny,
            extensions_default=default,
            max_depth=_limit(obj["max_depth"], "max_depth", 0) if "max_depth" in obj else None,
            max_pages=_limit(obj["max_pages"], "max_pages", 1) if "max_pages" in obj else None,
            recrawl_after_s=None if recrawl is None else float(recrawl),
            extract=extract,
            plugins=cls._plugins(obj.get("plugins")),
            fetch=FetchPolicy.from_doc(obj["fetch"], "fetch") if "fetch" in obj else None,
            priority=Priority.read(obj["priority"]) if "priority" in obj else Priority(),
            max_pages_per_s=cls._rate(obj.get("max_pages_per_s")),
        )

    @staticmethod
    def _rate(value: Any) -> float | None:
        if value is None:
            return None
        _expect(value, (int, float), "max_pages_per_s", "a number of pages per second")
        if not value > 0:
            raise SpecError("max_pages_per_s", f"must be more than 0, got {value}")
        return float(value)

    @staticmethod
    def _content_types(value: Any) -> tuple[str, ...]:
        if value is None:
            return DEFAULT_CONTENT_TYPES
        types = _strings(value, "content_types")
        for i, media_type in enumerate(types):
            if not MEDIA_TYPE_RE.match(media_type):
                raise SpecError(
                    f"content_types[{i}]",
                    f"not a lowercase media type (or type/*, */*): {media_type!r}",
                )
        return tuple(types)

    @staticmethod
    def _extensions(value: Any) -> tuple[frozenset[str], frozenset[str], bool]:
        if value is None:
            return frozenset(), frozenset(), True
        obj = _object(value, "extensions", EXTENSION_FIELDS)
        out = []
        for key in ("allow", "deny"):
            names = _strings(obj.get(key, []), f"extensions.{key}")
            for i, name in enumerate(names):
                if not EXTENSION_RE.match(name):
                    raise SpecError(
                        f"extensions.{key}[{i}]",
                        "an extension is lowercase letters and digits (dots between, as "
                        f"tar.gz), no dot first: {name!r}",
                    )
            out.append(frozenset(names))
        default = _expect(obj.get("default", True), bool, "extensions.default", "true or false")
        return out[0], out[1], default

    @staticmethod
    def _plugins(value: Any) -> tuple[str, ...]:
        if value is None:
            return ()
        names = _strings(value, "plugins")
        for i, name in enumerate(names):
            if not PLUGIN_NAME_RE.match(name):
                raise SpecError(f"plugins[{i}]", f"not an entry-point name: {name!r}")
        if len(set(names)) != len(names):
            raise SpecError("plugins", "names a plugin twice")
        return tuple(names)

    # ------------------------------------------------------------ the rules

    def follows(self, url: str, host: str, ignored: tuple[str, ...] = ()) -> bool:
        """Whether the job admits the canonical ``url``: its link rules and extensions, with
        ``ignored`` the crawl's default list of extensions (the ``ignored_extensions`` setting)."""
        return self.extensions(ignored).follows(url) and self.links.allows(url, host)

    def extensions(self, ignored: tuple[str, ...] = ()) -> ExtensionRule:
        """The job's extension rule, ``ignored`` being the crawl's default list."""
        return extension_rule(
            self.extensions_allow, self.extensions_deny, ignored if self.extensions_default else ()
        )

    def processes(self, content_type: str | None) -> bool:
        """Whether a response of ``content_type`` is read, extracted and its links followed."""
        return (content_type or "") in media_types(self.content_types)


def canonical_doc(doc: Mapping[str, Any]) -> bytes:
    """The document as canonical JSON (sorted keys): two puts of one spec compare equal."""
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


# ---------------------------------------------------------------- stored


@dataclass(frozen=True, slots=True)
class StoredSpec:
    """A job spec as KV ``crawl_specs`` holds it under the job's name."""

    version: int  # 1 for the first put, one more for each put that changed the document
    put_at: float  # unix time of the put
    spec: JobSpec

    @property
    def name(self) -> str:
        return self.spec.name

    def to_wire(self) -> bytes:
        return orjson.dumps(
            {
                "v": WIRE_VERSION,
                "version": self.version,
                "put_at": self.put_at,
                "spec": dict(self.spec.doc),
            }
        )

    @classmethod
    def from_wire(cls, data: bytes) -> Self:
        """Raises :class:`MessageError` for a record that is not a readable spec."""
        obj = json_object(data)
        version = typed(obj, "version", int)
        if version < 1:
            raise MessageError("wrong_type", f"version must be >= 1, got {version}")
        try:
            spec = JobSpec.read(typed(obj, "spec", dict))
        except SpecError as e:
            raise MessageError("bad_spec", str(e)) from e
        return cls(version, float(typed(obj, "put_at", (int, float))), spec)
