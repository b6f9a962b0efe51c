"""Sampling profiles of jetcrawl's processes with py-spy, and what they say.

``Profiler.attach(pid, role)`` starts ``py-spy record --nonblocking`` on a process (py-spy needs
ptrace: root, or ``kernel.yama.ptrace_scope=0``); the recording ends when the process exits and is
written as collapsed stacks (``frame;frame;... count``, one line per distinct stack, idle samples
left out). ``summarize`` reads one into the top functions by self and by inclusive samples and the
self samples per source file, so the report names where the CPU goes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Profile", "Profiler", "py_spy", "summarize"]

RATE_HZ = 200
TOP = 12
INCLUSIVE_TOP = 8
# Frames on (nearly) every stack say nothing: the entry point, the event loop's run().
SCAFFOLD_SHARE = 0.75
_LINE_NUMBER = re.compile(r":\d+\)$")


def py_spy() -> Path | None:
    found = shutil.which("py-spy")
    if found is not None:
        return Path(found)
    beside = Path(sys.executable).parent / "py-spy"
    return beside if beside.exists() else None


@dataclass(slots=True)
class Profiler:
    out_dir: Path
    roles: frozenset[str]
    recordings: dict[str, Path] = field(default_factory=dict)
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _by_pid: dict[int, tuple[str, subprocess.Popen[bytes]]] = field(default_factory=dict)

    def attach(self, pid: int, role: str) -> None:
        """Record ``pid`` as ``role``; a process seen again as another role (a forked service,
        renamed a moment after its fork) drops what was recorded of it before."""
        if pid in self._by_pid:
            name, proc = self._by_pid.pop(pid)
            proc.terminate()
            proc.wait()
            self._procs.remove(proc)
            self.recordings.pop(name).unlink(missing_ok=True)
        binary = py_spy()
        if binary is None or role not in self.roles:
            return
        name = role
        n = 1
        while name in self.recordings:
            n += 1
            name = f"{role}-{n}"
        path = self.out_dir / f"profile-{name}.txt"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with (self.out_dir / f"py-spy-{name}.log").open("wb") as log:
            proc = subprocess.Popen(
                [
                    str(binary),
                    "record",
                    "--pid",
                    str(pid),
                    "--rate",
                    str(RATE_HZ),
                    "--nonblocking",
                    "--format",
                    "raw",
                    "--output",
                    str(path),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._procs.append(proc)
        self._by_pid[pid] = (name, proc)
        self.recordings[name] = path

    def wait(self, timeout_s: float = 30.0) -> dict[str, Profile]:
        for proc in self._procs:
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.terminate()
                proc.wait()
        self._procs.clear()
        self._by_pid.clear()
        return {name: summarize(path) for name, path in self.recordings.items() if path.exists()}


@dataclass(frozen=True, slots=True)
class Profile:
    samples: int
    self_top: list[tuple[str, float]]  # (function (file), share of samples)
    inclusive_top: list[tuple[str, float]]  # without the scaffolding and the import machinery
    files_top: list[tuple[str, float]]  # self samples per source file

    def to_dict(self) -> dict[str, object]:
        return {
            "samples": self.samples,
            "self_top": self.self_top,
            "inclusive_top": self.inclusive_top,
            "files_top": self.files_top,
        }


def summarize(path: Path, top: int = TOP) -> Profile:
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    files: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_LINE_NUMBER.sub(")", frame) for frame in stack.split(";")]
        total += count
        own[frames[-1]] += count
        files[_file_of(frames[-1])] += count
        for frame in set(frames):
            inclusive[frame] += count
    if total == 0:
        return Profile(0, [], [], [])

    def share(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(name, count / total) for name, count in counter.most_common(top)]

    telling = Counter(
        {
            frame: count
            for frame, count in inclusive.items()
            if count < SCAFFOLD_SHARE * total and "(<" not in frame
        }
    )
    return Profile(total, share(own), share(telling)[:INCLUSIVE_TOP], share(files))


def _file_of(frame: str) -> str:
    start = frame.rfind(" (")
    return frame[start + 2 : -1] if start >= 0 else frame
