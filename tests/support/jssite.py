"""A website whose links appear only after JavaScript runs, on a ``BadSite`` (its access log).

``/`` is a script shell (an empty ``#root`` and a script): ``/app.js`` fetches ``/links.json``
and writes one link per entry into the page, then asks for what a page should not get: an
image, a script robots.txt disallows, a script on another host (``elsewhere``), and whatever
``forbidden`` URLs the test names (an address the SSRF guard refuses). The linked pages are
plain server-rendered HTML. ``robots.txt`` disallows ``/private/``.
"""

from __future__ import annotations

import orjson

from tests.support.badsite import BadSite

__all__ = ["JS_PAGES", "js_site"]

JS_PAGES = tuple(f"/js/p{n}" for n in range(5))
SHELL = """<!doctype html><html><head><title>app</title></head>
<body><noscript>You need to enable JavaScript to run this app.</noscript>
<div id="root"></div><script src="/app.js"></script></body></html>"""
APP_JS = """
(async () => {
  const links = await (await fetch('/links.json')).json();
  const root = document.getElementById('root');
  for (const href of links) {
    const a = document.createElement('a'); a.href = href; a.textContent = href;
    root.appendChild(a);
  }
  document.title = 'rendered';
  const img = new Image(); img.src = '/logo.png';
  for (const url of ['/private/secret.js', ...%(others)s]) {
    try { await fetch(url, {mode: 'no-cors'}); } catch (e) {}
  }
})();
"""
ARTICLE = "<title>{title}</title><p>" + "Plain server-rendered text. " * 20 + "</p>"


def js_site(site: BadSite, elsewhere: str, forbidden: tuple[str, ...] = ()) -> None:
    """Fill ``site`` with the JavaScript site; ``elsewhere`` is a URL on another host."""
    site.add("/", SHELL)
    others = orjson.dumps([elsewhere, *forbidden]).decode()
    site.add("/app.js", APP_JS % {"others": others}, content_type="text/javascript")
    site.add("/links.json", orjson.dumps(list(JS_PAGES)), content_type="application/json")
    site.add("/logo.png", b"\x89PNG", content_type="image/png")
    site.add("/private/secret.js", "1", content_type="text/javascript")
    site.add("/robots.txt", "User-agent: *\nDisallow: /private/\n", content_type="text/plain")
    for path in JS_PAGES:
        site.add(path, ARTICLE.format(title=path))
