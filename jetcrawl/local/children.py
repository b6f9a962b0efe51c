"""The services of a local crawl: one dispatcher and N workers, forked or spawned, stopped on exit.

A service that exits while the crawl runs is a failure of the crawl (``Children.check``); on the
way out every one gets SIGTERM, and SIGKILL after ``CHILD_STOP_TIMEOUT_S`` or a second Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from jetcrawl.contract.errors import JetcrawlError
from jetcrawl.contract.settings import Settings
from jetcrawl.local.services import Launch, Prefork, Service, spawn

log = logging.getLogger(__name__)

CHILD_STOP_TIMEOUT_S = 30.0


class CrawlFailed(JetcrawlError):
    """A service of the local crawl died or could not start."""


@dataclass(slots=True)
class Children:
    """The services of this crawl: forked ones where ``prefork`` has them, else spawned."""

    prefork: Prefork | None = None
    procs: list[Service] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def check(self) -> None:
        for proc, log_path in zip(self.procs, self.logs, strict=True):
            if proc.returncode is not None:
                raise CrawlFailed(
                    f"{log_path.stem} exited early with code {proc.returncode}; "
                    f"its log ends:\n{_tail(log_path)}"
                )

    async def start(self, launch: Launch) -> None:
        if self.prefork is not None and self.prefork.waiting(launch.role):
            self.procs.append(self.prefork.launch(launch))
        else:
            self.procs.append(await spawn(launch))
        self.logs.append(launch.log_path)


@asynccontextmanager
async def start_children(
    settings: Settings,
    workers: int,
    workdir: Path,
    hurry: asyncio.Event,
    prefork: Prefork | None,
) -> AsyncIterator[Children]:
    env = {**os.environ, **settings.to_env()}
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
    base = ("--log-level", str(level))
    children = Children(prefork)
    try:
        await children.start(
            Launch("dispatcher", (*base, "dispatcher"), env, workdir / "dispatcher.log")
        )
        for n in range(workers):
            worker_env = {**env, "JETCRAWL_WORKER_ID": f"local-{n + 1}"}
            if settings.metrics_port:  # an endpoint each: the dispatcher's port, then the next
                worker_env["JETCRAWL_METRICS_PORT"] = str(settings.metrics_port + n + 1)
            log_path = workdir / f"worker-{n + 1}.log"
            await children.start(Launch("worker", (*base, "worker"), worker_env, log_path))
        yield children
    finally:
        await _stop_all(children.procs, hurry)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


async def _stop_all(procs: Sequence[Service], hurry: asyncio.Event) -> None:
    """SIGTERM every service and wait; SIGKILL what is left after the timeout or on ``hurry``."""
    for proc in procs:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    loop = asyncio.get_running_loop()
    exits = [asyncio.ensure_future(proc.wait()) for proc in procs]
    hurried = asyncio.ensure_future(hurry.wait())
    deadline = loop.time() + CHILD_STOP_TIMEOUT_S
    try:
        while (running := [e for e in exits if not e.done()]) and not hurried.done():
            if loop.time() >= deadline:
                break
            await asyncio.wait(
                [*running, hurried],
                timeout=deadline - loop.time(),
                return_when=asyncio.FIRST_COMPLETED,
            )
    finally:
        hurried.cancel()
    for proc in procs:
        if proc.returncode is None:
            log.warning("pid %d did not stop in time; killing it", proc.pid)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    await asyncio.gather(*exits)
