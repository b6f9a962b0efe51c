"""The render: auto heuristic (worker/shell.py) on the pages real sites serve.

Each shell below is the index.html its framework's toolchain builds (Create React App, Vue CLI,
Angular CLI, Next.js without server rendering, a Gatsby loader); each page is a server-rendered
page of the kinds a crawl meets most (an article, a blog post with a script, a small page).
"""

from __future__ import annotations

import pytest

from jetcrawl.worker.shell import script_shell

CREATE_REACT_APP = """<!doctype html><html lang="en"><head><meta charset="utf-8"/>
<link rel="icon" href="/favicon.ico"/>
<meta name="viewport" content="width=device-width,initial-scale=1"/>
<meta name="theme-color" content="#000000"/><title>React App</title>
<script defer="defer" src="/static/js/main.4b2f5a9e.js"></script>
<link href="/static/css/main.073c9b0a.css" rel="stylesheet"></head>
<body><noscript>You need to enable JavaScript to run this app.</noscript>
<div id="root"></div></body></html>"""
VUE_CLI = """<!DOCTYPE html><html lang=""><head><meta charset="utf-8">
<meta http-equiv="X-UA-Compatible" content="IE=edge"><title>shop</title>
<script defer="defer" src="/js/chunk-vendors.5d8f1a7c.js"></script>
<script defer="defer" src="/js/app.9c1e2b3f.js"></script></head>
<body><div id="app"></div></body></html>"""
ANGULAR_CLI = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Dashboard</title>
<base href="/"><meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="styles.ef46db3751d8e999.css"></head>
<body><app-root></app-root>
<script src="runtime.c5e7a8d1.js" type="module"></script>
<script src="polyfills.2b4c6d8e.js" type="module"></script>
<script src="main.a1b2c3d4.js" type="module"></script></body></html>"""
NEXT_CSR = """<!DOCTYPE html><html><head><meta charSet="utf-8"/><title>Docs</title>
<script src="/_next/static/chunks/webpack-1234.js" defer=""></script>
<script src="/_next/static/chunks/main-5678.js" defer=""></script></head>
<body><div id="__next"></div>
<script id="__NEXT_DATA__" type="application/json">{"props":{"pageProps":{}},"page":"/docs",
"query":{},"buildId":"a1b2c3","nextExport":true,"autoExport":true,"isFallback":false}</script>
</body></html>"""
INLINE_APP = (
    """<html><head><title>Widget</title></head><body><p>Loading…</p><script>
"""
    + "var state = {items: []}; function render(){ /* draws the whole page */ }\n" * 40
    + """
</script></body></html>"""
)

ARTICLE = (
    "<html><head><title>Article</title><script src='/analytics.js' async></script></head><body>"
    "<nav>" + "".join(f"<a href='/section/{n}'>Section {n}</a>" for n in range(12)) + "</nav>"
    "<article><h1>On crawling</h1>"
    + "<p>Paragraphs of text a reader came for.</p>"
    * 30
    + "</article><footer><a href='/about'>About</a> <a href='/contact'>Contact</a></footer>"
    "</body></html>"
)
BLOG_WITH_SCRIPT = (
    "<html><head><title>Post</title></head><body><main><h1>A post</h1>"
    + "<p>Long enough text that a reader sees without any script running at all.</p>" * 8
    + "<a href='/prev'>previous</a> <a href='/next'>next</a></main>"
    "<script src='/comments.js'></script></body></html>"
)
SMALL_PAGE = (
    "<html><head><title>Hi</title></head><body><p>Hello.</p><a href='/'>home</a></body></html>"
)
SERVER_RENDERED_REACT = (
    "<html><head><title>Store</title><script src='/bundle.js' defer></script></head><body>"
    "<div id='root'><header>Store</header>"
    + "".join(f"<a href='/item/{n}'>Item {n}</a>" for n in range(20))
    + "</div></body></html>"
)


@pytest.mark.parametrize(
    ("html", "reason"),
    [
        (CREATE_REACT_APP, "empty_mount"),
        (VUE_CLI, "empty_mount"),
        (ANGULAR_CLI, "script_heavy"),
        (NEXT_CSR, "empty_mount"),
        (INLINE_APP, "script_heavy"),
    ],
    ids=["create-react-app", "vue-cli", "angular-cli", "next-csr", "inline-app"],
)
def test_script_shells_are_rendered(html: str, reason: str) -> None:
    assert script_shell(html.encode()) == reason


@pytest.mark.parametrize(
    "html",
    [ARTICLE, BLOG_WITH_SCRIPT, SMALL_PAGE, SERVER_RENDERED_REACT],
    ids=["article", "blog-with-script", "small-page", "server-rendered-react"],
)
def test_pages_whose_links_are_served_are_not(html: str) -> None:
    assert script_shell(html.encode()) is None


def test_a_noscript_warning_on_a_page_without_links_is_a_shell() -> None:
    html = b"<html><body><noscript>Please enable JavaScript.</noscript><p>x</p></body></html>"
    assert script_shell(html) == "noscript"
