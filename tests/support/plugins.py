"""Plugins for the tests, installed as a real distribution: a ``.dist-info`` with entry points
in the group ``jetcrawl.plugins`` and the module beside it, on ``sys.path`` for one test.

items    one item per page (key: the path), a link the page does not show, and a link of
         another job (``other``) on the home page
raises   raises ValueError on /boom
bad      returns a dict, not an Output, on /bad
future   built for plugin API 2: refused at load
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

MODULE = "jc_test_plugins"
NAMES = ("items", "raises", "bad", "future")

SOURCE = """
from urllib.parse import urlsplit

from jetcrawl.contract.plugin import ItemOut, LinkOut, Output


def items(page):
    path = urlsplit(page.url).path
    links = (LinkOut("/hidden"),)
    if path == "/":
        links += (LinkOut("/elsewhere", job="other"),)
    return Output(
        items=(ItemOut(path, {"path": path, "spec_version": page.spec_version}),), links=links
    )


def raises(page):
    if page.url.endswith("/boom"):
        raise ValueError("boom on purpose")
    return Output()


def bad(page):
    if page.url.endswith("/bad"):
        return {"items": []}
    return Output()


def future(page):
    return Output()


for plugin in (items, raises, bad):
    plugin.jetcrawl_api = 1
future.jetcrawl_api = 2
"""


def install(directory: Path) -> None:
    """Write the distribution into ``directory`` and put it on ``sys.path``."""
    (directory / f"{MODULE}.py").write_text(SOURCE)
    info = directory / f"{MODULE}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {MODULE}\nVersion: 1.0\n")
    entries = "".join(f"{name} = {MODULE}:{name}\n" for name in NAMES)
    (info / "entry_points.txt").write_text(f"[jetcrawl.plugins]\n{entries}")
    sys.path.insert(0, str(directory))
    importlib.invalidate_caches()


def uninstall(directory: Path) -> None:
    sys.path.remove(str(directory))
    sys.modules.pop(MODULE, None)
    importlib.invalidate_caches()
