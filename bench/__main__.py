"""``python -m bench`` (see :mod:`bench.cli`)."""

import signal
import sys

from bench.cli import main


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwind, so the site and the run in progress are stopped


signal.signal(signal.SIGTERM, _exit_on_sigterm)
sys.exit(main())
