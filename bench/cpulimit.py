"""A CPU budget for one process, by a Linux cgroup: ``cores`` of CPU time per period, at most.

``python -m bench seen --server-cores C`` gives each nats-server of the cluster the same budget,
as servers of their own would have, so that on a shared machine the servers, not the other
processes, set the admissions/s. ``python -m bench --worker-cores C`` holds each jetcrawl worker
to C cores (``Budgets``), as a container's CPU limit holds it. cgroup v2 (``cpu.max``) where it is
mounted, else v1's cpu controller (``cpu.cfs_quota_us``); either needs root. :class:`CpuLimitError`
says why not.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["Budgets", "CpuLimit", "CpuLimitError"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


class CpuLimitError(RuntimeError):
    pass


class CpuLimit:
    """``with CpuLimit(pid, cores):`` the process runs in a cgroup of its own with ``cores`` of
    CPU; on leaving, it is moved back to the root group and the group removed."""

    def __init__(self, pid: int, cores: float, name: str) -> None:
        if cores <= 0:
            raise CpuLimitError(f"cores must be > 0, got {cores}")
        self.pid = pid
        self.cores = cores
        v2 = (CGROUP_ROOT / "cgroup.controllers").exists()
        self._root = CGROUP_ROOT if v2 else CGROUP_ROOT / "cpu"
        self._v2 = v2
        self.path = self._root / f"jetcrawl-bench-{os.getpid()}-{name}"

    def __enter__(self) -> Self:
        quota = max(1_000, round(self.cores * PERIOD_US))
        try:
            if self._v2:
                (self._root / "cgroup.subtree_control").write_text("+cpu")
            self.path.mkdir()
            if self._v2:
                (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
            else:
                (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (self.path / "cpu.cfs_quota_us").write_text(str(quota))
            (self.path / "cgroup.procs").write_text(str(self.pid))
        except OSError as e:
            self._remove()
            raise CpuLimitError(
                f"cannot limit process {self.pid} to {self.cores:g} cores in {self.path}: {e} "
                "(a cgroup's cpu controller, writable by root, is needed)"
            ) from e
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._remove()

    def _remove(self) -> None:
        if not self.path.exists():
            return
        with contextlib.suppress(OSError):  # the process is gone: nothing to move
            for pid in (self.path / "cgroup.procs").read_text().split():
                (self._root / "cgroup.procs").write_text(pid)  # back to the root group
        with contextlib.suppress(OSError):  # left for the system: an empty group costs nothing
            self.path.rmdir()


class Budgets(contextlib.ExitStack):
    """Each process of one role held to ``cores`` from when it is first seen, as a container's
    CPU limit holds it: ``attach`` is a ``TreeMonitor``'s ``on_new``. ``with Budgets(...)``
    removes the groups on leaving; a process that could not be held is in ``errors``."""

    def __init__(self, cores: float, role: str) -> None:
        super().__init__()
        self.cores = cores
        self.role = role
        self.held: set[int] = set()
        self.errors: list[str] = []

    def attach(self, pid: int, role: str) -> None:
        if role != self.role or pid in self.held:
            return
        try:
            self.enter_context(CpuLimit(pid, self.cores, f"{role}-{pid}"))
        except CpuLimitError as e:
            self.errors.append(str(e))
        else:
            self.held.add(pid)
