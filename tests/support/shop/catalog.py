"""The shop's content and its pages, before it has a port: every answer rendered from one table.

Categories list their products three to a page (``?page=N``, with next/previous links); a product
page has its name, price (written as the shop's locale writes it), currency, SKU, availability,
tags, release date and a JSON-LD ``Product``; an article has its headline, byline date, body and
OpenGraph and microdata. Pages a job should not follow sit beside them: the cart, the login, the
search, and every listing again under ``?sort=``. ``responses(base)`` renders them all with
absolute URLs under ``base`` (``http://127.0.0.N:PORT``).
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import orjson

__all__ = [
    "ANY_QUERY",
    "ARTICLES",
    "CATEGORIES",
    "PER_PAGE",
    "PRODUCTS",
    "Article",
    "Product",
    "responses",
]

PER_PAGE = 3
ANY_QUERY = frozenset({"/cart", "/search"})  # pages that answer whatever their query
_MONTHS = "January February March April May June July August September October November December"


@dataclass(frozen=True, slots=True)
class Product:
    slug: str
    name: str
    category: str
    price: str  # as the page writes it, e.g. "1.299,00 €"
    amount: str  # the JSON-LD price, e.g. "1299.00"
    currency: str
    sku: str
    in_stock: bool
    tags: tuple[str, ...]
    released: str  # ISO date


@dataclass(frozen=True, slots=True)
class Article:
    slug: str
    headline: str
    published: str  # ISO date
    author: str
    paragraphs: tuple[str, ...]
    related: tuple[str, ...]  # slugs of other articles


CATEGORIES = {"kettles": "Kettles", "grinders": "Coffee grinders", "scales": "Kitchen scales"}

PRODUCTS = (
    Product(
        "aurora-kettle",
        "Aurora Kettle 1.7 L",
        "kettles",
        "€49.90",
        "49.90",
        "EUR",
        "KT-1001",
        True,
        ("steel", "electric"),
        "2025-03-14",
    ),
    Product(
        "boreal-kettle",
        "Boreal Gooseneck Kettle",
        "kettles",
        "€89.00",
        "89.00",
        "EUR",
        "KT-1002",
        True,
        ("gooseneck",),
        "2025-06-01",
    ),
    Product(
        "cirrus-kettle",
        "Cirrus Travel Kettle",
        "kettles",
        "$24.50",
        "24.50",
        "USD",
        "KT-1003",
        False,
        ("travel", "compact"),
        "2024-11-20",
    ),
    Product(
        "dune-kettle",
        "Dune Stovetop Kettle",
        "kettles",
        "£32.00",
        "32.00",
        "GBP",
        "KT-1004",
        True,
        (),
        "2023-09-09",
    ),
    Product(
        "ember-kettle",
        "Ember Smart Kettle",
        "kettles",
        "1.299,00 €",
        "1299.00",
        "EUR",
        "KT-1005",
        True,
        ("smart", "wifi", "electric"),
        "2026-01-15",
    ),
    Product(
        "fjord-grinder",
        "Fjord Burr Grinder",
        "grinders",
        "€129.00",
        "129.00",
        "EUR",
        "GR-2001",
        True,
        ("burr",),
        "2025-02-02",
    ),
    Product(
        "glacier-grinder",
        "Glacier Hand Grinder",
        "grinders",
        "$59.99",
        "59.99",
        "USD",
        "GR-2002",
        False,
        ("manual", "travel"),
        "2024-05-30",
    ),
    Product(
        "harbor-grinder",
        "Harbor Blade Grinder",
        "grinders",
        "€19.95",
        "19.95",
        "EUR",
        "GR-2003",
        True,
        ("blade",),
        "2022-12-12",
    ),
    Product(
        "isle-grinder",
        "Isle Espresso Grinder",
        "grinders",
        "$1,049.00",
        "1049.00",
        "USD",
        "GR-2004",
        True,
        ("burr", "espresso"),
        "2026-07-04",
    ),
    Product(
        "juniper-scale",
        "Juniper Pour-over Scale",
        "scales",
        "€39.00",
        "39.00",
        "EUR",
        "SC-3001",
        True,
        ("timer",),
        "2025-08-18",
    ),
    Product(
        "kestrel-scale",
        "Kestrel Pocket Scale",
        "scales",
        "£12.49",
        "12.49",
        "GBP",
        "SC-3002",
        False,
        ("compact",),
        "2024-02-29",
    ),
)

ARTICLES = (
    Article(
        "choosing-a-kettle",
        "Choosing a kettle that lasts",
        "2026-10-02",
        "Ada Brewer",
        (
            "A kettle is boiled thousands of times a year, so its lid, hinge and element "
            "matter more than its colour.",
            "Steel bodies outlive plastic ones, and a visible water window saves guessing.",
            "Look at the spout before you buy: a spout that pours in a thin, steady stream lets "
            "you wet coffee grounds evenly, while a wide one floods them. A lid that opens wide "
            "makes descaling easy, and limescale is what kills most kettles in hard-water towns.",
        ),
        ("grind-size-explained",),
    ),
    Article(
        "grind-size-explained",
        "Grind size, explained",
        "2026-11-11",
        "Ben Roaster",
        (
            "Finer grounds extract faster: espresso wants powder, a French press wants gravel.",
            "A burr grinder gives even particles; a blade grinder gives dust and boulders at once.",
            "Start in the middle and change one step at a time.",
            "Taste tells you where to go next: sour and thin means too coarse, bitter and dry "
            "means too fine. Write down the setting that worked for each coffee, because the "
            "same grinder behaves differently with a light roast and a dark one.",
        ),
        ("choosing-a-kettle", "weighing-your-brew"),
    ),
    Article(
        "weighing-your-brew",
        "Why weigh your brew",
        "2026-12-01",
        "Ada Brewer",
        (
            "Scoops lie: beans differ in density, and a scale does not.",
            "A brew ratio only means something when both sides are weighed: fifteen grams of "
            "coffee to two hundred and fifty grams of water is a fine start for a filter cup, "
            "and a scale with a timer lets you repeat a good cup the next morning.",
        ),
        (),
    ),
)


def responses(base: str) -> dict[str, tuple[int, str, bytes]]:
    """Path and query -> (status, content type, body) of every page, links under ``base``."""
    pages: dict[str, str] = {"/": _home(base), "/blog/": _blog_index(base)}
    for slug, title in CATEGORIES.items():
        products = [p for p in PRODUCTS if p.category == slug]
        count = (len(products) + PER_PAGE - 1) // PER_PAGE
        for number in range(1, count + 1):
            listing = products[(number - 1) * PER_PAGE : number * PER_PAGE]
            body = _category(base, slug, title, listing, number, count)
            pages[_category_path(slug, number)] = body
            pages[f"/category/{slug}?page={number}&sort=price"] = body  # not to follow
    for product in PRODUCTS:
        pages[f"/product/{product.slug}"] = _product(base, product)
    for article in ARTICLES:
        pages[f"/blog/{article.slug}"] = _article(base, article)
    pages["/cart"] = _plain(base, "Cart", "<p>Your cart is empty.</p>")
    pages["/account/login"] = _plain(base, "Log in", "<form><input name=user></form>")
    pages["/search"] = _plain(base, "Search", "<p>Type a query.</p>")
    answers = {
        path: (200, "text/html; charset=utf-8", body.encode()) for path, body in pages.items()
    }
    answers["/robots.txt"] = (200, "text/plain", b"User-agent: *\nDisallow:\n")
    return answers


def _category_path(slug: str, number: int) -> str:
    return f"/category/{slug}" if number == 1 else f"/category/{slug}?page={number}"


def _layout(base: str, title: str, main: str, head: str = "") -> str:
    nav = "".join(
        f'<li><a href="{base}/category/{s}">{html.escape(t)}</a></li>'
        for s, t in CATEGORIES.items()
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{html.escape(title)} | Brew Shop</title>{head}</head>"
        f'<body><header><a href="{base}/">Brew Shop</a><nav><ul>{nav}'
        f'<li><a href="{base}/blog/">Journal</a></li></ul></nav>'
        f'<a href="{base}/cart">Cart</a> <a href="{base}/account/login">Log in</a> '
        f'<a href="{base}/search?q=kettle">Search</a></header>'
        f"<main>{main}</main><footer><p>Brew Shop, 1 Bean Street. All prices include VAT.</p>"
        "</footer></body></html>"
    )


def _home(base: str) -> str:
    return _layout(
        base, "Home", "<h1>Everything for better coffee</h1><p>Kettles, grinders and scales.</p>"
    )


def _plain(base: str, title: str, main: str) -> str:
    return _layout(base, title, f"<h1>{title}</h1>{main}")


def _category(
    base: str, slug: str, title: str, listing: list[Product], number: int, count: int
) -> str:
    cards = "".join(
        f'<li class="card"><a href="{base}/product/{p.slug}">{html.escape(p.name)}</a> '
        f'<span class="price">{html.escape(p.price)}</span>'
        f' <a class="add" href="{base}/cart?add={p.sku}">Add to cart</a></li>'
        for p in listing
    )
    pager = f'<a href="{base}/category/{slug}?page={number}&sort=price">Sort by price</a>'
    if number > 1:
        pager += f' <a rel="prev" href="{base}{_category_path(slug, number - 1)}">Previous</a>'
    if number < count:
        pager += f' <a rel="next" href="{base}{_category_path(slug, number + 1)}">Next</a>'
    main = (
        f'<h1>{html.escape(title)}</h1><p class="page">Page {number} of {count}</p>'
        f'<ul class="products">{cards}</ul><nav class="pager">{pager}</nav>'
    )
    return _layout(base, title, main)


def _product(base: str, p: Product) -> str:
    availability = "InStock" if p.in_stock else "OutOfStock"
    ld = {
        "@context": "https://schema.org",
        "@type": "Product",
        "name": p.name,
        "sku": p.sku,
        "url": f"{base}/product/{p.slug}",
        "category": CATEGORIES[p.category],
        "offers": {
            "@type": "Offer",
            "price": p.amount,
            "priceCurrency": p.currency,
            "availability": f"https://schema.org/{availability}",
        },
    }
    head = f'<script type="application/ld+json">{orjson.dumps(ld).decode()}</script>'
    tags = "".join(f"<li>{html.escape(t)}</li>" for t in p.tags)
    stock = "In stock" if p.in_stock else "Out of stock"
    main = (
        f'<article class="product"><h1 class="product-name">{html.escape(p.name)}</h1>'
        f'<p><span class="price" data-currency="{p.currency}">{html.escape(p.price)}</span></p>'
        f'<p class="availability">Availability: <b>{stock}</b></p>'
        f'<dl class="specs"><dt>SKU</dt><dd data-spec="sku">{p.sku}</dd><dt>Released</dt>'
        f'<dd><time class="released" datetime="{p.released}">{p.released}</time></dd></dl>'
        f'<ul class="tags">{tags}</ul>'
        f'<p><a href="{base}/cart?add={p.sku}">Add to cart</a> '
        f'<a href="{base}/category/{p.category}">More {CATEGORIES[p.category].lower()}</a></p>'
        "</article>"
    )
    return _layout(base, p.name, main, head)


def _blog_index(base: str) -> str:
    items = "".join(
        f'<li><a href="{base}/blog/{a.slug}">{html.escape(a.headline)}</a></li>' for a in ARTICLES
    )
    return _layout(base, "Journal", f"<h1>Journal</h1><ul>{items}</ul>")


def _article(base: str, a: Article) -> str:
    head = (
        '<meta property="og:type" content="article">'
        f'<meta property="og:title" content="{html.escape(a.headline)}">'
        f'<meta property="article:published_time" content="{a.published}">'
        f'<meta property="article:author" content="{html.escape(a.author)}">'
    )
    body = "".join(f"<p>{html.escape(text)}</p>" for text in a.paragraphs)
    headlines = {x.slug: x.headline for x in ARTICLES}
    related = "".join(
        f'<li><a class="related" href="{base}/blog/{slug}">{html.escape(headlines[slug])}</a></li>'
        for slug in a.related
    )
    main = (
        '<article itemscope itemtype="https://schema.org/BlogPosting">'
        f'<h1 itemprop="headline">{html.escape(a.headline)}</h1>'
        f'<p class="byline">By <span itemprop="author">{html.escape(a.author)}</span>, '
        f'<time itemprop="datePublished" datetime="{a.published}">{_long_date(a.published)}'
        "</time></p>"
        f'<div class="body" itemprop="articleBody">{body}</div></article>'
        f"<aside><h2>Read next</h2><ul>{related}</ul></aside>"
    )
    return _layout(base, a.headline, main, head)


def _long_date(iso: str) -> str:
    year, month, day = iso.split("-")
    return f"{int(day)} {_MONTHS.split()[int(month) - 1]} {year}"
