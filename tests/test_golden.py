"""Golden fingerprints: a large URL corpus keeps the canonical form it had, URL by URL.

A fingerprint is the seen set's key and a task's ``Nats-Msg-Id``: if one URL's fingerprint
changes under a running crawl, that URL is crawled again, and results lose their identity. The
file ``tests/golden/fingerprints.jsonl`` was written by ``python -m tests.support.urlcorpus``
(every link of a bench site, WHATWG's test inputs, and generated real-looking links). A change
of the canonical rules is allowed only with a new ``FINGERPRINT_SCHEME`` and a file written anew.
"""

from __future__ import annotations

import orjson

from jetcrawl.contract.urls import FINGERPRINT_SCHEME, canonicalize, fingerprint
from tests.support.urlcorpus import GOLDEN, outcome


def _golden() -> tuple[dict[str, int], list[tuple[str, str | None, str]]]:
    header, *lines = GOLDEN.read_bytes().splitlines()
    return orjson.loads(header), [tuple(orjson.loads(line)) for line in lines]  # type: ignore[misc]


def test_the_golden_file_is_of_the_current_scheme_and_large() -> None:
    header, entries = _golden()
    assert header == {"scheme": FINGERPRINT_SCHEME}, "new rules: bump FINGERPRINT_SCHEME, rewrite"
    assert len(entries) > 15_000
    accepted = sum(1 for *_, expected in entries if not expected.startswith("!"))
    assert accepted > 0.8 * len(entries)


def test_every_url_keeps_its_fingerprint() -> None:
    _, entries = _golden()
    changed = []
    for link, base, expected in entries:
        got = outcome(link, base)
        if got != expected:
            changed.append(f"{link!r} on {base!r}: {expected} -> {got}")
    assert not changed, f"{len(changed)} changed, e.g.:\n" + "\n".join(changed[:20])


def test_other_rules_would_be_caught() -> None:
    """The check can fail: keeping tracking parameters, a one-rule change, moves hundreds."""
    _, entries = _golden()
    moved = 0
    for link, base, expected in entries:
        if expected.startswith("!"):
            continue
        canonical = canonicalize(link, base, tracking_params=frozenset({"unused"}))
        moved += fingerprint(canonical) != expected
    assert moved > 300
