"""The nats-py hang after a failed TLS upgrade, which jetcrawl's connect works around, is still
there (tests/upstream/nats_tls_failed_upgrade.py). The day a release ends ``connect`` on its
own, this fails: the workaround in jetcrawl/plumbing/bus.py ``connect`` may then go."""

from __future__ import annotations

import ssl
from pathlib import Path

from tests.upstream.nats_tls_failed_upgrade import reproduce

FIXED = (
    "nats-py {} ends connect() after a failed TLS upgrade now: the error_cb workaround in "
    "jetcrawl/plumbing/bus.py connect may go"
)


async def test_a_failed_tls_upgrade_leaves_connect_waiting(tmp_path: Path) -> None:
    seen = await reproduce(tmp_path)
    assert isinstance(seen.tls_error, ssl.SSLCertVerificationError), seen
    assert not seen.connect_ended, FIXED.format(seen.nats_py)
