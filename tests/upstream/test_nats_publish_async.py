"""The nats-py publish_async bug that jetcrawl's Outbox works around is still there.

tests/upstream/nats_publish_async.py reproduces it (nats-io/nats.py#985). The day a nats-py
release resolves the future with the error, these fail: the pipelined publishing of
jetcrawl/plumbing/bus.py ``Outbox`` may then go back to ``publish_async``.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from nats.js.errors import APIError

from jetcrawl.local.embedded import NatsServer
from tests.upstream.nats_publish_async import WAIT_S, reproduce

ROOT = Path(__file__).resolve().parents[2]
FIXED = (
    "nats-py {} resolves publish_async's future on a JetStream API error now "
    "(nats-io/nats.py#985): the Outbox workaround in jetcrawl/plumbing/bus.py may go, and "
    "DESIGN.md's measured fact with it"
)
WRONG_LAST_SEQUENCE = 10071  # JetStream's err_code for Nats-Expected-Last-Subject-Sequence


async def test_an_api_error_leaves_the_publish_async_future_pending(
    nats_server: NatsServer,
) -> None:
    seen = await reproduce(nats_server.url)
    assert seen.awaited_error.err_code == WRONG_LAST_SEQUENCE, "the server rejects it"
    # The reply did arrive: its error escaped nats-py's reply callback to error_cb...
    assert isinstance(seen.callback_error, APIError), seen
    assert seen.callback_error.err_code == WRONG_LAST_SEQUENCE
    assert seen.callback_error_after_s is not None and seen.callback_error_after_s < WAIT_S
    # ...and WAIT_S later the future is still pending: the bug, as it stands in nats-py 2.16.
    assert not seen.future_done, FIXED.format(seen.nats_py)
    assert seen.pending == 1 and not seen.completed


def test_the_reproduction_runs_on_its_own_and_says_so() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "tests.upstream.nats_publish_async"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode != 0, FIXED.format(version("nats-py")) + f"\n{run.stdout}"
    assert run.returncode == 1, f"exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    assert "BUG: the future is still pending" in run.stdout, run.stdout


async def test_a_fixed_nats_py_would_fail_the_test_above(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fix proposed upstream (nats-io/nats.py#994) hands the error to the future instead of
    # raising it in the callback; from_error returning the error has that effect.
    def returning(cls: type[APIError], err: dict[str, Any]) -> APIError:
        try:
            raising(err)
        except APIError as e:
            return e
        raise AssertionError("APIError.from_error returned")

    raising = APIError.from_error
    monkeypatch.setattr(APIError, "from_error", classmethod(returning))
    seen = await reproduce(nats_server.url)
    assert seen.future_done and not seen.reproduced and seen.callback_error is None
    assert seen.pending == 0 and seen.completed
