"""jetcrawl.local.services: the local crawl's services forked from the command, or spawned.

Each forking scenario runs in a new interpreter (tests/support/forking.py): a fork needs a
process with one thread and no running loop. ``jetcrawl crawl`` itself, forked and spawned, is
in tests/test_crawl_cli.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from jetcrawl.cli import main
from jetcrawl.local.services import Launch, Prefork, process_name, spawn

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks on Linux")
ROOT = Path(__file__).resolve().parent.parent


def run_scenario(name: str, workdir: Path) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JETCRAWL_")}
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.forking", name, str(workdir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return orjson.loads(done.stdout)  # type: ignore[no-any-return]


def shards_of(topology_log: str) -> str:
    """The shard count a printed topology records on CRAWL_TASKS (no consumer per shard now)."""
    return orjson.loads(topology_log)["streams"]["CRAWL_TASKS"]["metadata"]["jetcrawl_shards"]


def test_forked_services_run_with_their_own_arguments_environment_and_log(tmp_path: Path) -> None:
    facts = run_scenario("launch", tmp_path)
    assert facts["names"] == ["jc-dispatcher", "jc-worker"]  # what ps, top and the bench see
    assert facts["codes"] == [0, 0]
    dispatcher_log, worker_log = facts["logs"]  # type: ignore[misc]
    # Each printed the topology for the shard count of its own environment, into its own log.
    assert shards_of(dispatcher_log) == "3"
    assert shards_of(worker_log) == "5"
    assert facts["alive"] == [False, False]
    assert facts["parent_env_kept"] is True  # the command's own environment is untouched


def test_a_forked_service_exit_code_reaches_the_command(tmp_path: Path) -> None:
    facts = run_scenario("exit_codes", tmp_path)
    # A bad setting: cli.main's usage error; killed: -9 to every waiter, and once reaped, a
    # second kill() signals nothing.
    assert facts["codes"] == [2, -9, -9, -9]
    assert "JETCRAWL_NO_SUCH_SETTING" in str(facts["bad_log"])


def test_services_never_launched_end_with_the_prefork(tmp_path: Path) -> None:
    facts = run_scenario("unused", tmp_path)
    assert facts["before"] == [True, True, True]
    assert facts["after"] == [False, False, False]
    assert facts["codes"] == [0, 0, 0]
    assert "no forked worker is waiting" in str(facts["late"])


@pytest.mark.parametrize("scenario", ["unsafe", "in_a_loop"])
def test_no_fork_with_a_thread_or_a_loop_running(tmp_path: Path, scenario: str) -> None:
    assert run_scenario(scenario, tmp_path) == {"fork_safe": False, "prefork": False}


def test_only_services_are_forked() -> None:
    with pytest.raises(ValueError, match="not a service"):
        Prefork.start(["nats-server"], main)


def test_process_names_fit_the_kernel_limit() -> None:
    assert process_name("dispatcher") == "jc-dispatcher"
    assert len(process_name("a-very-long-role-name").encode()) == 15


async def test_a_spawned_service_runs_as_a_new_interpreter(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JETCRAWL_")}
    launch = Launch("worker", ("topology",), {**env, "JETCRAWL_SHARDS": "2"}, tmp_path / "w.log")
    service = await spawn(launch)
    try:
        async with asyncio.timeout(60):
            returncode = await service.wait()
    except TimeoutError:
        service.kill()
        await service.wait()
        pytest.fail(f"no exit in 60 s:\n{launch.log_path.read_text(errors='replace')}")
    log = launch.log_path.read_text(errors="replace")  # stdout and stderr
    assert returncode == 0, log
    try:
        topology = orjson.loads(log)
    except orjson.JSONDecodeError:
        pytest.fail(f"the service wrote more than the topology:\n{log}")
    assert topology["streams"]["CRAWL_TASKS"]["metadata"]["jetcrawl_shards"] == "2", log
