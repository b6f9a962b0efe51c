"""``example-articles``: article pages into items with headline and word count, plus related links.

A jetcrawl plugin is a function ``(Page) -> Output`` that says which major version of the plugin
API it was built for in its ``jetcrawl_api`` attribute; the package publishes it under the
entry-point group ``jetcrawl.plugins`` (see pyproject.toml).
"""

from __future__ import annotations

from urllib.parse import urljoin

from selectolax.lexbor import LexborHTMLParser

from jetcrawl.contract.plugin import ItemOut, LinkOut, Output, Page

__all__ = ["articles"]


def articles(page: Page) -> Output:
    """One item per article page (``og:type`` article): its headline, author and word count; and
    the page's related articles as links, each carrying the headline it was found under."""
    tree = LexborHTMLParser(page.text)
    kind = tree.css_first('meta[property="og:type"]')
    if kind is None or kind.attrs.get("content") != "article":
        return Output()
    article = tree.css_first("article")
    heading = article.css_first("h1") if article is not None else None
    if article is None or heading is None:
        return Output()
    headline = " ".join(heading.text().split())
    words = sum(len(p.text().split()) for p in article.css("p"))
    author = tree.css_first('meta[property="article:author"]')
    item = ItemOut(
        key="article",
        data={
            "headline": headline,
            "words": words,
            "author": author.attrs.get("content") if author is not None else None,
        },
    )
    links = tuple(
        LinkOut(urljoin(page.final_url, href), meta={"related_to": headline})
        for node in tree.css("a.related")
        if (href := node.attrs.get("href"))
    )
    return Output(items=(item,), links=links)


articles.jetcrawl_api = 1  # type: ignore[attr-defined]  # the plugin API's major version
