"""Whether served HTML is a script shell: a page whose links only a browser would see.

``render: auto`` renders a page when ``script_shell`` names a reason. The rule, on the served
HTML and nothing else (no request is made):

1. A page with ``SHELL_MAX_LINKS`` links or more is no shell: its links are there to read
   (server-rendered pages that also run scripts, the common case, are not rendered).
2. Otherwise it is a shell when one of these holds:
   - ``empty_mount``: an element a framework mounts into is empty (``id`` root, app, __next,
     __nuxt, ___gatsby, svelte, or ``ng-app`` / ``data-reactroot``);
   - ``noscript``: a ``<noscript>`` element (the page says it needs JavaScript);
   - ``script_heavy``: more script than text: inline script bytes above the visible text's, or
     external scripts and less than ``SHELL_MIN_TEXT`` characters of visible text.

A page that has a few links and none of these signs is a small page, not a shell.
"""

from __future__ import annotations

from typing import Final

from selectolax.lexbor import LexborHTMLParser

__all__ = ["SHELL_MAX_LINKS", "SHELL_MIN_TEXT", "script_shell"]

SHELL_MAX_LINKS: Final = 5
SHELL_MIN_TEXT: Final = 200  # characters of visible text
_MOUNT_IDS = ("root", "app", "__next", "__nuxt", "___gatsby", "svelte")
_MOUNTS = ", ".join([*(f"#{i}" for i in _MOUNT_IDS), "[ng-app]", "[data-reactroot]"])


def script_shell(html: bytes | str) -> str | None:
    """The reason ``html`` looks like a script shell (``empty_mount``, ``noscript``,
    ``script_heavy``), or None when its served links are worth reading as they are."""
    tree = LexborHTMLParser(html)
    if len(tree.css("a[href], area[href]")) >= SHELL_MAX_LINKS:
        return None
    for mount in tree.css(_MOUNTS):
        if mount.child is None or not (mount.text(deep=True).strip() or mount.css_first("*")):
            return "empty_mount"
    if tree.css_first("noscript") is not None:
        return "noscript"
    scripts = tree.css("script")
    inline = sum(len(s.text(deep=True)) for s in scripts if "src" not in s.attrs)
    external = sum(1 for s in scripts if "src" in s.attrs)
    tree.strip_tags(["script", "style", "template", "noscript"])
    body = tree.body
    text = len(" ".join(body.text(deep=True).split())) if body is not None else 0
    if inline > text or (external and text < SHELL_MIN_TEXT):
        return "script_heavy"
    return None
