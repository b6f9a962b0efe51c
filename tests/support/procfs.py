"""A process as Linux's /proc shows it, for tests that watch the processes a command starts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

EXITED = ("Z", "X")  # process states in /proc/<pid>/stat: zombie, dead


@dataclass(frozen=True, slots=True)
class Stat:
    state: str
    start_time: int  # with the pid, identifies a process across pid reuse
    name: str  # comm: a forked jetcrawl service renames itself jc-<role>


def stat(pid: int) -> Stat | None:
    """State, start time and name of a process, None if there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    head, tail = text.rsplit(")", 1)  # the name may hold spaces and parentheses
    fields = tail.split()  # after "pid (comm)": field 3 onwards
    return Stat(fields[0], int(fields[19]), head.split("(", 1)[1])


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    found = stat(pid)
    return found is not None and found.state not in EXITED


def environ(pid: int) -> dict[str, str]:
    """The environment a process was started with."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(entry.decode().partition("=")[::2] for entry in raw.split(b"\0") if entry)
