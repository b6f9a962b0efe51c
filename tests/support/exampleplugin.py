"""The example plugin package (examples/jetcrawl-example-plugin) installed into the test venv.

``ensure_installed`` pip-installs it (``--no-deps``, not editable, so that the services' child
processes find it like any installed plugin) into the environment of ``sys.executable`` unless
the installed copy already matches the source file for file; a lock file serializes the pytest
workers, so the first one installs and the others find it done. Fast and idempotent: a fresh
machine pays one pip run (~3 s), later sessions a few file reads.
"""

from __future__ import annotations

import fcntl
import importlib
import importlib.metadata
import subprocess
import sys
from pathlib import Path

__all__ = ["DISTRIBUTION", "PACKAGE_DIR", "PLUGIN", "ensure_installed"]

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "examples" / "jetcrawl-example-plugin"
DISTRIBUTION = "jetcrawl-example-plugin"
PLUGIN = "example-articles"  # its entry point's name
_SOURCES = PACKAGE_DIR / "src"


def ensure_installed() -> None:
    """Install the example plugin into this interpreter's environment if it is not current."""
    if _current():
        return
    with open(Path(sys.prefix) / f".{DISTRIBUTION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _current():
            return
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-input"]
        done = subprocess.run([*command, str(PACKAGE_DIR)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"pip could not install {PACKAGE_DIR}:\n{done.stderr}")
    importlib.invalidate_caches()
    if not _current():
        raise RuntimeError(f"{DISTRIBUTION} installed, yet this interpreter does not see it")


def _current() -> bool:
    """Whether the installed distribution has every source file as it is now."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return False
    for source in _SOURCES.rglob("*.py"):
        installed = Path(str(dist.locate_file(source.relative_to(_SOURCES))))
        if not installed.is_file() or installed.read_bytes() != source.read_bytes():
            return False
    entry_points = dist.read_text("entry_points.txt") or ""
    return f"{PLUGIN} = " in entry_points
