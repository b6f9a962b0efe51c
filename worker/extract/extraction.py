"""A job's extraction: its compiled rules run over one page, giving the page's items.

``compile_extraction`` checks the ``extract`` section of a job spec once (``SpecError`` with the
field's path); ``Extraction.run`` is then pure and never raises for what a page holds. The first
rule whose ``match`` regex finds a match in the page's URL applies; it gives one item, keyed by
the value of its ``key`` field or ``"page"``. A page whose key field has no value gives none, and
a page that is not HTML gives nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parsel import Selector
from selectolax.lexbor import LexborHTMLParser

from jetcrawl.contract.items import ITEM_KEY_MAX
from jetcrawl.contract.plugin import ItemOut, Output, Page
from jetcrawl.worker.extract.content import main_content, require_content
from jetcrawl.worker.extract.fields import css_strings, typed, xpath_strings
from jetcrawl.worker.extract.metadata import json_ld, microdata, opengraph
from jetcrawl.worker.extract.spec import PAGE_KEY, Rule, compile_rules
from jetcrawl.worker.parse import DEPTH_SCAN_TAGS, depth_end

__all__ = ["HTML_TYPES", "Extraction", "compile_extraction"]

HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})


def compile_extraction(doc: Any, path: str = "extract") -> Extraction:
    """The extraction the ``extract`` section ``doc`` describes; raises ``SpecError``."""
    rules = compile_rules(doc, path)
    for at, rule in enumerate(rules):
        if rule.content is not None:
            require_content(f"{path}.rules[{at}].content")
    return Extraction(rules)


@dataclass(frozen=True, slots=True)
class Extraction:
    rules: tuple[Rule, ...]

    def rule_for(self, url: str) -> Rule | None:
        return next((rule for rule in self.rules if rule.match.search(url)), None)

    def run(self, page: Page) -> Output:
        """The items the first rule matching ``page.url`` takes from the page."""
        rule = self.rule_for(page.url)
        if rule is None or page.content_type not in HTML_TYPES:
            return Output()
        text = _readable(page.text)
        trees = _Trees(text)
        data: dict[str, Any] = {}
        for field in rule.fields:
            if field.css is not None:
                strings = css_strings(trees.lexbor, field)
            else:
                strings = xpath_strings(trees.parsel, field)
            data[field.name] = typed(field, strings)
        if rule.key == PAGE_KEY:
            key = PAGE_KEY
        elif (value := data[rule.key]) is None or value == "":
            return Output()
        else:
            key = str(value)[:ITEM_KEY_MAX]
        if "json-ld" in rule.metadata:
            data["json_ld"] = json_ld(trees.lexbor)
        if "opengraph" in rule.metadata:
            data["opengraph"] = opengraph(trees.lexbor)
        if "microdata" in rule.metadata:
            data["microdata"] = microdata(trees.lexbor, page.final_url)
        if rule.content is not None:
            data["content"] = main_content(text, page.final_url, rule.content)
        return Output(items=(ItemOut(key, data),))


def _readable(text: str) -> str:
    """``text`` up to where it nests deeper than ``MAX_DEPTH`` elements, as the worker's parse
    reads it: lexbor takes time growing with the square of a tree's depth, and a hostile page
    must not hold a worker."""
    if text.count("<") <= DEPTH_SCAN_TAGS:
        return text
    html = text.encode()
    end = depth_end(html)
    return text if end is None else html[:end].decode(errors="ignore")


class _Trees:
    """The page parsed by each engine once, when a field first needs it."""

    __slots__ = ("_lexbor", "_parsel", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._lexbor: LexborHTMLParser | None = None
        self._parsel: Selector | None = None

    @property
    def lexbor(self) -> LexborHTMLParser:
        if self._lexbor is None:
            self._lexbor = LexborHTMLParser(self.text)
        return self._lexbor

    @property
    def parsel(self) -> Selector:
        if self._parsel is None:
            self._parsel = Selector(text=self.text, type="html")
        return self._parsel
