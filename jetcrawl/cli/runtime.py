"""The process around a command: its event loop, signals, garbage collector and lazy imports."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

# The services allocate many short-lived containers per page (messages, results, link lists):
# with CPython's default thresholds the young collections kept walking the long-lived objects.
# What exists once a service has imported its code is frozen out of collection, and young
# collections run far less often (the measurement: bench/RESULTS.md, "garbage collector").
GC_THRESHOLDS = (10_000, 20, 20)


def tune_gc() -> None:
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


STOP_GRACE_S = 2.0  # how long a command may take to stop after Ctrl-C or SIGTERM


def on_signals(stop: Callable[[], object], *, grace_s: float | None = None) -> None:
    """Call ``stop`` on SIGINT or SIGTERM. With ``grace_s``, a process still running that long
    after the signal is ended by it, as if no handler were set: whatever it was waiting on
    (a connect, a server that does not answer), Ctrl-C stops a command."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _stopping, loop, sig, stop, grace_s)


def _stopping(
    loop: asyncio.AbstractEventLoop,
    sig: signal.Signals,
    stop: Callable[[], object],
    grace_s: float | None,
) -> None:
    stop()
    if grace_s is not None:
        loop.call_later(grace_s, _end_by, sig)


def _end_by(sig: signal.Signals) -> None:
    print(f"jetcrawl: not stopped {STOP_GRACE_S:g} s after {sig.name}; ending", file=sys.stderr)
    sys.stderr.flush()
    signal.signal(sig, signal.SIG_DFL)
    signal.raise_signal(sig)


def cancel_on_signals() -> None:
    """Ctrl-C or SIGTERM cancels the running command (its task), ending it within the grace."""
    task = asyncio.current_task()
    assert task is not None, "from inside the command's task"
    on_signals(task.cancel, grace_s=STOP_GRACE_S)


def run_async(main: Callable[[], Awaitable[Any]]) -> Any:
    try:
        import uvloop

        return uvloop.run(main())  # type: ignore[arg-type]
    except ImportError:
        return asyncio.run(main())  # type: ignore[arg-type]


class _DeferredImport:
    """A ``sys.meta_path`` finder for one top-level module that gives it a ``LazyLoader``: the
    module is loaded when first used, not when first imported. (Not an ``importlib.abc``
    subclass: importing that module would cost more than the protocol of one method is worth.)"""

    def __init__(self, name: str) -> None:
        self._name = name

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != self._name:
            return None
        sys.meta_path.remove(self)  # its job is done: find the real spec without it
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = importlib.util.LazyLoader(spec.loader)
        return spec


def defer_aiohttp() -> None:
    """Load aiohttp when it is first used, not when nats-py imports it.

    nats-py imports aiohttp as it loads, for a websocket transport jetcrawl does not use, and
    loading it is a large part of a short command's start-up. Only the processes that use it
    load it now: a worker (its HTTP client) and a service serving ``metrics_port``.
    """
    if "aiohttp" in sys.modules or any(isinstance(f, _DeferredImport) for f in sys.meta_path):
        return  # imported already, or deferred by an earlier call
    sys.meta_path.insert(0, _DeferredImport("aiohttp"))
