"""Programs some tests run (promtool, prometheus, kubectl): found, or the test skips, except on
CI, where a missing tool fails the test (`.ci/run` installs them; a skip there would hide it)."""

from __future__ import annotations

import os
import shutil

import pytest

__all__ = ["require"]


def require(program: str, why: str) -> str:
    """The path of ``program``; skip the test without it (fail it on CI)."""
    path = shutil.which(program)
    if path is not None:
        return path
    message = f"{program} not found ({why}); .ci/run installs it"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
