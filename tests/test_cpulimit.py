"""CPU budgets by cgroup (bench/cpulimit.py), on real processes: ``Budgets`` holds each process
of one role as it appears, and ``python -m bench --worker-cores`` holds every jetcrawl worker.

They need root and a cgroup cpu controller (CI has both); without them they skip, saying why.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from bench.cli import main
from bench.cpulimit import PERIOD_US, Budgets, CpuLimit, CpuLimitError


@pytest.fixture
def sleeper() -> Iterator[int]:
    child = subprocess.Popen(["sleep", "60"])
    try:
        yield child.pid
    finally:
        child.kill()
        child.wait()


@pytest.fixture
def cgroups(sleeper: int) -> None:
    try:
        with CpuLimit(sleeper, 0.5, "test-probe"):
            pass
    except CpuLimitError as e:
        pytest.skip(f"no cgroup to hold a process in here: {e}")


def _group_of(pid: int) -> str:
    """The process's group under the cpu controller (v1) or the unified hierarchy (v2)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers in ("", "cpu", "cpu,cpuacct") or "cpu" in controllers.split(","):
            return path
    raise AssertionError(f"no cpu group for {pid}")


def _quota_us(group: Path) -> int:
    v2 = group / "cpu.max"
    if v2.exists():
        return int(v2.read_text().split()[0])
    return int((group / "cpu.cfs_quota_us").read_text())


@pytest.mark.usefixtures("cgroups")
def test_budgets_hold_each_process_of_their_role_once_and_remove_the_groups(sleeper: int) -> None:
    other = subprocess.Popen(["sleep", "60"])
    try:
        with Budgets(0.25, "worker") as budgets:
            budgets.attach(sleeper, "worker")
            budgets.attach(sleeper, "worker")  # a process renamed again: held already
            budgets.attach(other.pid, "dispatcher")  # not the budgets' role
            assert budgets.held == {sleeper} and budgets.errors == []
            group = _group_of(sleeper)
            assert group.endswith(f"-worker-{sleeper}")
            assert _group_of(other.pid) != group
            v1 = Path("/sys/fs/cgroup/cpu")
            path = (v1 if v1.is_dir() else Path("/sys/fs/cgroup")) / group.lstrip("/")
            assert _quota_us(path) == 0.25 * PERIOD_US
        assert not path.exists()
        assert _group_of(sleeper) != group  # back where it came from
    finally:
        other.kill()
        other.wait()


@pytest.mark.usefixtures("cgroups")
def test_a_process_that_cannot_be_held_is_an_error_not_a_crash() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    with Budgets(0.25, "worker") as budgets:
        budgets.attach(gone.pid, "worker")
    assert budgets.held == set()
    assert len(budgets.errors) == 1 and f"cannot limit process {gone.pid}" in budgets.errors[0]


@pytest.mark.usefixtures("cgroups")
def test_the_bench_holds_every_jetcrawl_worker_to_its_budget(tmp_path: Path) -> None:
    argv = ["--out", str(tmp_path), "--hosts", "2", "--pages", "50", "--reps", "1"]
    argv += ["--systems", "jetcrawl-1,jetcrawl-2", "--ceiling-messages", "0", "--no-profile"]
    assert main([*argv, "--worker-cores", "0.5"]) == 0

    report = orjson.loads((tmp_path / "bench.json").read_bytes())
    assert report["meta"]["worker_cores"] == 0.5
    runs = {run["system"]: run for run in report["runs"]}
    assert runs["jetcrawl-1"]["workers_held"] == 1 and runs["jetcrawl-2"]["workers_held"] == 2
    assert [run["problems"] for run in runs.values()] == [[], []]
    markdown = (tmp_path / "bench.md").read_text()
    assert "held to 0.5 cores by a cgroup of its own: 3 worker processes in 2 jetcrawl runs" in (
        markdown
    )
    targets = markdown[markdown.index("## Targets") :]
    assert targets.split("\n")[2].startswith("**Each jetcrawl worker was held to 0.5 cores**")
    assert "What this machine leaves" not in markdown  # the cores left bound no budgeted worker


def test_a_budget_that_cannot_be_had_stops_the_bench_before_any_run(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--worker-cores 0: cores must be > 0"):
        main(["--out", str(tmp_path), "--systems", "jetcrawl-1", "--worker-cores", "0"])
    assert not (tmp_path / "bench.md").exists()
