"""The services of a local crawl: one dispatcher and N workers, supervised, stopped on exit.

A service that dies while the crawl runs is started again (``Children.supervise``): after a
backoff, as a new interpreter (the forked ones are used up), a worker under a new id so that the
registry tells it from the one whose lease is running out. Meanwhile the registry moves the dead
worker's shards and JetStream redelivers what it held, so the crawl still ends with every
admitted URL crawled once. A service that dies ``MAX_RESTARTS`` times fails the crawl. On the
way out every one gets SIGTERM, and SIGKILL after ``CHILD_STOP_TIMEOUT_S`` or a second Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from jetcrawl.contract.errors import JetcrawlError
from jetcrawl.contract.fetchpolicy import FetchPolicy
from jetcrawl.contract.settings import ENV_PREFIX, Settings
from jetcrawl.local.services import Launch, Prefork, Service, spawn
from jetcrawl.plumbing.backoff import backoff_s

log = logging.getLogger(__name__)

CHILD_STOP_TIMEOUT_S = 30.0
MAX_RESTARTS = 3  # per service, over the whole crawl
RESTART_FIRST_S = 0.5  # before the first restart; doubled for each next one, up to:
RESTART_MAX_S = 8.0
WORKER_ID = f"{ENV_PREFIX}WORKER_ID"


class CrawlFailed(JetcrawlError):
    """A service of the local crawl could not start, or died more often than it may."""


@dataclass(slots=True)
class Child:
    name: str  # "dispatcher", "worker-2": how the terminal and the logs call it
    launch: Launch
    proc: Service
    restarts: int = 0
    due: float | None = None  # dead: when it starts again (event loop time)

    def relaunch(self) -> Launch:
        """The next start's launch: its own log file, and for a worker its own id."""
        restart = f"restart-{self.restarts + 1}"
        env = dict(self.launch.env)
        if WORKER_ID in env:
            env[WORKER_ID] = f"{env[WORKER_ID].split('.restart-')[0]}.{restart}"
        log_path = self.launch.log_path.with_name(f"{self.name}.{restart}.log")
        return dataclasses.replace(self.launch, env=env, log_path=log_path)


@dataclass(slots=True)
class Children:
    """The services of this crawl: forked ones where ``prefork`` has them, else spawned."""

    prefork: Prefork | None = None
    members: list[Child] = field(default_factory=list)
    restarted: int = 0  # restarts so far, all services

    @property
    def procs(self) -> list[Service]:
        return [child.proc for child in self.members]

    async def start(self, name: str, launch: Launch) -> None:
        if self.prefork is not None and self.prefork.waiting(launch.role):
            proc = self.prefork.launch(launch)
        else:
            proc = await spawn(launch)
        self.members.append(Child(name, launch, proc))

    async def supervise(self) -> None:
        """Start again the services that died (each after its backoff); raise ``CrawlFailed``
        for one that has died more than ``MAX_RESTARTS`` times."""
        now = asyncio.get_running_loop().time()
        for child in self.members:
            code = child.proc.returncode
            if code is None:
                continue
            if child.due is None:
                if child.restarts >= MAX_RESTARTS:
                    raise CrawlFailed(
                        f"{child.name} exited early with code {code}, after {child.restarts} "
                        f"restarts; its log ends:\n{_tail(child.launch.log_path)}"
                    )
                delay_s = backoff_s(child.restarts + 1, RESTART_FIRST_S, RESTART_MAX_S)
                child.due = now + delay_s
                log.warning(
                    "%s exited with code %d; starting it again in %.1f s (restart %d of %d); "
                    "its log: %s",
                    child.name,
                    code,
                    delay_s,
                    child.restarts + 1,
                    MAX_RESTARTS,
                    child.launch.log_path,
                )
            elif now >= child.due:
                child.launch = child.relaunch()
                child.proc = await spawn(child.launch)
                child.restarts += 1
                child.due = None
                self.restarted += 1
                log.warning("%s started again (pid %d)", child.name, child.proc.pid)


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
            "dispatcher",
            Launch("dispatcher", (*base, "dispatcher"), env, workdir / "dispatcher.log"),
        )
        for n in range(workers):
            worker_env = {**env, WORKER_ID: f"local-{n + 1}"}
            if settings.metrics_port:  # an endpoint each: the dispatcher's port, then the next
                worker_env[f"{ENV_PREFIX}METRICS_PORT"] = str(settings.metrics_port + n + 1)
            name = f"worker-{n + 1}"
            launch = Launch("worker", (*base, "worker"), worker_env, workdir / f"{name}.log")
            await children.start(name, launch)
        if FetchPolicy.from_settings(settings).may_render:  # one renderer for the crawl
            log_path = workdir / "renderer.log"
            await children.start("renderer", Launch("renderer", (*base, "renderer"), env, log_path))
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
