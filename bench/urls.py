"""``python -m bench urls``: canonicalizers timed on one URL corpus (tests/support/urlcorpus.py).

Every implementation reads the same entries (link, base) in the same run, several passes each,
interleaved; the table gives the median CPU microseconds per URL by part of the corpus and the ratio
to the RFC 3986 canonicalizer that WHATWG parsing replaced (read from git at ``RFC3986_COMMIT``;
the row is left out, with the reason, where git or that commit is missing).

    rfc3986      the canonicalizer before ada, our own splitter and resolver (fingerprint scheme 1)
    canonicalize the current one: a fast path for plain absolute links, ada for the rest
    ada+rules    ada for every URL, then our rules (no fast path)
    ada alone    ada's href only, without our rules: the parser's floor
    links        LinkCanonicalizer, as the worker reads a page's links (cached per origin)
"""

from __future__ import annotations

import gc
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from ada_url import join_url, normalize_url

from jetcrawl.contract.errors import UrlError
from jetcrawl.contract.urls import (
    DEFAULT_TRACKING,
    LinkCanonicalizer,
    UrlRules,
    _canonical_href,
    canonicalize,
)
from tests.support.urlcorpus import generated, site_links, whatwg_inputs

__all__ = ["UrlBench", "measure_urls", "urls_markdown"]

RFC3986_COMMIT = "7a1d590"  # main before WHATWG parsing
Entry = tuple[str, "str | None"]
Canonicalizer = Callable[[str, "str | None"], object]


@dataclass(slots=True)
class UrlBench:
    parts: dict[str, int]  # part of the corpus -> entries
    us_per_url: dict[str, dict[str, float]] = field(default_factory=dict)  # impl -> part -> µs
    missing: dict[str, str] = field(default_factory=dict)  # impl -> why it was not measured
    passes: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "parts": self.parts,
            "us_per_url": self.us_per_url,
            "missing": self.missing,
            "passes": self.passes,
        }


def _quiet(function: Callable[[str, str | None], object]) -> Canonicalizer:
    def call(link: str, base: str | None) -> object:
        try:
            return function(link, base)
        except (UrlError, ValueError):
            return None

    return call


def _ada_alone(link: str, base: str | None) -> object:
    return normalize_url(link) if base is None else join_url(base, link)


def _ada_and_rules(link: str, base: str | None) -> object:
    href = _ada_alone(link, base)
    return _canonical_href(href, link, DEFAULT_TRACKING)  # type: ignore[arg-type]


def _links() -> Canonicalizer:
    links = LinkCanonicalizer(UrlRules())

    def call(link: str, base: str | None) -> object:
        return links.link(link, base) if base is not None else links.link(link, "http://x.test/")

    return call


def _rfc3986_module() -> ModuleType | str:
    """The canonicalizer of ``RFC3986_COMMIT``, imported from git; or why it cannot be."""
    root = Path(__file__).resolve().parent.parent
    try:
        source = subprocess.run(
            ["git", "show", f"{RFC3986_COMMIT}:jetcrawl/contract/urls.py"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        return f"git show {RFC3986_COMMIT} failed: {e}"
    path = Path(tempfile.mkdtemp()) / "rfc3986_urls.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("bench_rfc3986_urls", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    except ImportError as e:  # it needs the idna package, which jetcrawl no longer requires
        return f"its imports fail: {e}"
    return module


def _implementations() -> tuple[dict[str, Callable[[], Canonicalizer]], dict[str, str]]:
    found: dict[str, Callable[[], Canonicalizer]] = {}
    missing: dict[str, str] = {}
    old = _rfc3986_module()
    if isinstance(old, str):
        missing["rfc3986"] = old
    else:
        found["rfc3986"] = lambda: _quiet(old.canonicalize)
    found["canonicalize"] = lambda: _quiet(canonicalize)
    found["ada+rules"] = lambda: _quiet(_ada_and_rules)
    found["ada alone"] = lambda: _quiet(_ada_alone)
    found["links"] = _links  # a fresh cache per pass: it fills as a worker's would
    return found, missing


def measure_urls(passes: int = 5, limit: int | None = None) -> UrlBench:
    """Every implementation over the corpus (its first ``limit`` entries of each part)."""
    parts: dict[str, list[Entry]] = {
        "site links": site_links()[:limit],
        "WHATWG inputs": whatwg_inputs()[:limit],
        "generated": generated()[:limit],
    }
    parts["all"] = [entry for entries in parts.values() for entry in entries]
    implementations, missing = _implementations()
    bench = UrlBench({name: len(entries) for name, entries in parts.items()}, missing=missing)
    bench.passes = passes
    samples: dict[str, dict[str, list[float]]] = {
        name: {part: [] for part in parts} for name in implementations
    }
    for _ in range(passes):
        for name, make in implementations.items():  # interleaved: drift hits all alike
            for part, entries in parts.items():
                samples[name][part].append(_time_one(make(), entries))
    for name, by_part in samples.items():
        bench.us_per_url[name] = {
            part: statistics.median(times) * 1e6 / len(parts[part])
            for part, times in by_part.items()
        }
    return bench


def _time_one(function: Canonicalizer, entries: list[Entry]) -> float:
    """CPU seconds of this process for one pass: on a shared machine, others' load stretches
    wall time far more than it does our CPU time."""
    gc.collect()
    start = time.process_time()
    for link, base in entries:
        function(link, base)
    return time.process_time() - start


def urls_markdown(bench: UrlBench) -> str:
    parts = list(bench.parts)
    baseline = bench.us_per_url.get("rfc3986")
    lines = [
        "## URL canonicalization (python -m bench urls)",
        "",
        f"Median CPU µs per URL over {bench.passes} interleaved passes; in brackets, the ratio "
        "to rfc3986 (below 1: faster).",
        "",
        "| implementation | " + " | ".join(f"{p} ({bench.parts[p]:,})" for p in parts) + " |",
        "|---|" + "---|" * len(parts),
    ]
    for name, by_part in bench.us_per_url.items():
        cells = []
        for part in parts:
            cell = f"{by_part[part]:.2f}"
            if baseline is not None and name != "rfc3986":
                cell += f" ({by_part[part] / baseline[part]:.2f}x)"
            cells.append(cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.extend(f"\n{name}: not measured, {why}" for name, why in bench.missing.items())
    return "\n".join(lines) + "\n"
