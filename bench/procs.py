"""CPU and memory of a process tree, from Linux ``/proc`` (no third-party dependency).

``run_monitored`` starts a command and samples its whole tree until it exits: every descendant's
CPU and RSS, found by ``ppid`` in ``/proc/*/stat`` (daemonized servers in their own session are
still our descendants). The total CPU of the tree is exact: it is the change of this process's
``RUSAGE_CHILDREN``, which the kernel fills when a child is reaped with the CPU of the child and of
every descendant it reaped in turn. The per-role split (``nats-server``, ``worker``, ...) and the
CPU between two instants come from the samples, so they miss at most one sampling interval of a
process's last moments. Peak RSS is the largest sum over the live tree at one sample.
"""

from __future__ import annotations

import bisect
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from jetcrawl.local.embedded import parent_death_hook

__all__ = [
    "DIE_WITH_PARENT",
    "Monitored",
    "TreeMonitor",
    "busy_cpu_s",
    "child_env",
    "cpu_seconds",
    "run_monitored",
    "self_cpu_s",
]

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
SAMPLE_EVERY_S = 0.1
STOP_GRACE_S = 30.0
BENCH_ROOT = Path(__file__).resolve().parent.parent
# The site and the systems are SIGKILLed by the kernel when the harness dies, even by -9.
DIE_WITH_PARENT = parent_death_hook()


@dataclass(frozen=True, slots=True)
class Stat:
    name: str  # /proc/<pid>/comm: a forked jetcrawl service renames itself (jc-worker)
    ppid: int
    cpu_s: float  # user + system of the process itself (not of its reaped children)
    start_ticks: int  # with the pid, identifies the process across pid reuse
    rss_bytes: int


def read_stat(pid: int) -> Stat | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:  # gone
        return None
    end = raw.rindex(b")")  # the command name may hold spaces and parens
    rest = raw[end + 2 :].split()
    return Stat(
        name=raw[raw.index(b"(") + 1 : end].decode(errors="replace"),
        ppid=int(rest[1]),
        cpu_s=(int(rest[11]) + int(rest[12])) / CLOCK_TICKS,
        start_ticks=int(rest[19]),
        rss_bytes=int(rest[21]) * PAGE_BYTES,
    )


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := read_stat(int(name))) is not None:
            children.setdefault(stat.ppid, []).append(int(name))
    out: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            out.append(child)
            stack.append(child)
    return out


def cpu_seconds(pid: int) -> float:
    stat = read_stat(pid)
    return stat.cpu_s if stat is not None else 0.0


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Our environment for a child, with this checkout's ``bench`` importable.

    The checkout goes last on ``PYTHONPATH`` and children run in their own directory, so a
    ``PYTHONPATH`` set by the caller can point ``jetcrawl`` and its services at another build.
    """
    path = os.environ.get("PYTHONPATH")
    root = str(BENCH_ROOT)
    return {
        **os.environ,
        "PYTHONPATH": f"{path}{os.pathsep}{root}" if path else root,
        **(extra or {}),
    }


def busy_cpu_s() -> float:
    """CPU seconds the machine has spent busy since boot, over all cores (``/proc/stat``)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = values
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


UNKNOWN_ROLE = "?"  # a process whose command line could not be read (yet): asked again


@dataclass(slots=True)
class _Tracked:
    role: str
    name: str
    cpu_s: float = 0.0
    peak_rss_bytes: int = 0


@dataclass(slots=True)
class TreeMonitor:
    """Samples a tree; ``classify(cmdline, name) -> role`` names each process when first seen,
    and again if it renames itself (a forked service does, a moment after its fork) or was
    ``UNKNOWN_ROLE`` (a process caught in its exec, with no command line to read)."""

    root: int
    classify: Callable[[list[str], str], str]
    on_new: Callable[[int, str], None] | None = None
    processes: dict[tuple[int, int], _Tracked] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)  # sample instants (epoch seconds)
    totals: list[float] = field(default_factory=list)  # tree CPU so far, at each instant
    by_role: list[dict[str, float]] = field(default_factory=list)
    peak_rss_bytes: int = 0

    def sample(self) -> None:
        now = time.time()
        rss = 0
        for pid in [self.root, *descendants(self.root)]:
            stat = read_stat(pid)
            if stat is None:
                continue
            key = (pid, stat.start_ticks)
            tracked = self.processes.get(key)
            if tracked is None:
                tracked = self.processes[key] = _Tracked(UNKNOWN_ROLE, "")
            if tracked.name != stat.name or tracked.role == UNKNOWN_ROLE:
                role = self.classify(cmdline(pid), stat.name)
                if (role, stat.name) != (tracked.role, tracked.name):
                    tracked.role, tracked.name = role, stat.name
                    if self.on_new is not None:
                        self.on_new(pid, role)
            tracked.cpu_s = stat.cpu_s
            tracked.peak_rss_bytes = max(tracked.peak_rss_bytes, stat.rss_bytes)
            rss += stat.rss_bytes
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        roles: dict[str, float] = {}
        for tracked in self.processes.values():
            roles[tracked.role] = roles.get(tracked.role, 0.0) + tracked.cpu_s
        self.times.append(now)
        self.totals.append(sum(roles.values()))
        self.by_role.append(roles)

    def cpu_by_role(self) -> dict[str, float]:
        return dict(self.by_role[-1]) if self.by_role else {}

    def peak_rss_by_role(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for tracked in self.processes.values():
            out[tracked.role] = out.get(tracked.role, 0) + tracked.peak_rss_bytes
        return out

    def cpu_between(self, start: float, end: float) -> tuple[float, dict[str, float]]:
        """Tree CPU (total, per role) spent between two instants, interpolated between samples."""
        total = self._at(self.totals, end) - self._at(self.totals, start)
        roles = {
            role: self._at([r.get(role, 0.0) for r in self.by_role], end)
            - self._at([r.get(role, 0.0) for r in self.by_role], start)
            for role in self.cpu_by_role()
        }
        return total, roles

    def _at(self, series: Sequence[float], instant: float) -> float:
        if not series:
            return 0.0
        i = bisect.bisect_left(self.times, instant)
        if i <= 0:
            return series[0]
        if i >= len(series):
            return series[-1]
        t0, t1 = self.times[i - 1], self.times[i]
        weight = (instant - t0) / (t1 - t0) if t1 > t0 else 1.0
        return series[i - 1] + weight * (series[i] - series[i - 1])


@dataclass(frozen=True, slots=True)
class Monitored:
    returncode: int
    started: float  # epoch seconds
    ended: float
    cpu_s: float  # the whole tree, exact (RUSAGE_CHILDREN)
    monitor: TreeMonitor
    timed_out: bool

    @property
    def wall_s(self) -> float:
        return self.ended - self.started


def run_monitored(
    command: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    log_path: Path,
    timeout_s: float,
    classify: Callable[[list[str], str], str],
    on_new: Callable[[int, str], None] | None = None,
) -> Monitored:
    """Run ``command`` to its end (SIGTERM at ``timeout_s``), sampling its tree meanwhile.

    Nothing else may be reaped by this process while it runs, or its CPU would be counted here.
    """
    if not sys.platform.startswith("linux"):
        raise RuntimeError("the benchmark reads /proc: it runs on Linux only")
    before = children_cpu_s()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        started = time.time()
        proc = subprocess.Popen(
            list(command),
            env=dict(env),
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=DIE_WITH_PARENT,
        )
    monitor = TreeMonitor(proc.pid, classify, on_new)
    timed_out = False
    deadline = started + timeout_s
    while True:
        monitor.sample()
        try:
            proc.wait(SAMPLE_EVERY_S)
            break
        except subprocess.TimeoutExpired:
            if time.time() > deadline and not timed_out:
                timed_out = True
                proc.send_signal(signal.SIGTERM)
                deadline = time.time() + STOP_GRACE_S
            elif timed_out and time.time() > deadline:
                proc.kill()
    ended = time.time()
    return Monitored(
        returncode=proc.returncode,
        started=started,
        ended=ended,
        cpu_s=children_cpu_s() - before,
        monitor=monitor,
        timed_out=timed_out,
    )
