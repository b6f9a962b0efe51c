"""The embedded servers: real nats-server and etcd processes, started, stopped, killed, again."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aetcd
import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import StorageType, StreamConfig, StreamInfo
from nats.js.errors import NoStreamResponseError

from jetcrawl.contract.errors import JetcrawlError
from jetcrawl.local.embedded import (
    EmbeddedServerError,
    EtcdServer,
    NatsCluster,
    NatsServer,
    etcd_binary,
    nats_server_binary,
)
from tests.support.procfs import environ
from tests.support.streams import add_replicated, read_until


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@asynccontextmanager
async def connected(*urls: str) -> AsyncIterator[NATS]:
    nc = await nats.connect(servers=list(urls), connect_timeout=5)
    try:
        yield nc
    finally:
        await nc.close()


def connected_url(nc: NATS) -> str:
    return nc.connected_url.geturl() if nc.connected_url else ""


def follower(cluster: NatsCluster, info: StreamInfo, nc: NATS) -> NatsServer:
    """A node that is neither the stream's leader nor the one the client is connected to."""
    assert info.cluster is not None
    return next(
        server
        for server in cluster.servers
        if server.server_name != info.cluster.leader and server.url != connected_url(nc)
    )


async def stored_messages(js: JetStreamContext, stream: str) -> list[bytes]:
    info = await js.stream_info(stream)
    return [
        (await js.get_msg(stream, seq)).data or b""
        for seq in range(info.state.first_seq, info.state.last_seq + 1)
    ]


# --- nats-server -------------------------------------------------------------------------------


async def test_jetstream_stores_and_returns_messages(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    assert nats_server.url == f"nats://127.0.0.1:{nats_server.port}"
    assert nats_server.store_dir.is_dir()
    await js.add_stream(name="ROUNDTRIP", subjects=["roundtrip.>"])
    acks = [await js.publish(f"roundtrip.{i}", f"m{i}".encode()) for i in range(3)]
    assert [ack.seq for ack in acks] == [1, 2, 3]
    assert await stored_messages(js, "ROUNDTRIP") == [b"m0", b"m1", b"m2"]
    assert "Server is ready" in nats_server.log_path.read_text()


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
@pytest.mark.parametrize("kind", ["nats", "etcd"])
async def test_threads_cap_the_go_runtime_unless_the_environment_does(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GOMAXPROCS", raising=False)

    def server(name: str, threads: int | None) -> NatsServer | EtcdServer:
        if kind == "nats":
            return NatsServer(tmp_path / name, threads=threads)
        return EtcdServer(tmp_path / name, threads=threads)

    async with server("capped", 1) as capped, server("default", None) as default:
        assert capped.pid is not None and default.pid is not None
        assert environ(capped.pid).get("GOMAXPROCS") == "1"
        assert "GOMAXPROCS" not in environ(default.pid)  # Go's own: a thread per core
    monkeypatch.setenv("GOMAXPROCS", "3")  # the user's word wins over ours
    async with server("told", 1) as told:
        assert told.pid is not None
        assert environ(told.pid).get("GOMAXPROCS") == "3"


@pytest.mark.parametrize("crash", [False, True], ids=["stop", "kill"])
async def test_restart_keeps_port_and_file_stream(tmp_path: Path, crash: bool) -> None:
    server = NatsServer(tmp_path / "nats")
    async with server:
        url, first_pid = server.url, server.pid
        assert first_pid is not None
        async with connected(url) as nc:
            js = nc.jetstream()
            await js.add_stream(name="DURABLE", subjects=["durable.>"], storage=StorageType.FILE)
            for i in range(5):
                await js.publish("durable.x", f"m{i}".encode())
        await (server.kill() if crash else server.stop())
        assert not server.running
        assert server.pid is None
        assert not alive(first_pid)

        await server.start()
        assert server.url == url
        assert server.pid != first_pid
        async with connected(url) as nc:
            js = nc.jetstream()
            assert await stored_messages(js, "DURABLE") == [f"m{i}".encode() for i in range(5)]
            await js.publish("durable.x", b"after")
    assert not server.running


async def test_stop_and_kill_are_idempotent(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats")
    await server.stop()  # never started
    await server.start()
    await server.start()  # already running: the same process
    pid = server.pid
    assert pid is not None and alive(pid)
    await server.stop()
    await server.stop()
    await server.kill()
    assert not alive(pid)


async def test_a_bad_config_fails_with_the_log_attached(tmp_path: Path) -> None:
    config = tmp_path / "bad.conf"
    config.write_text("jetstream {\n  max_mem: [unclosed\n")
    server = NatsServer(tmp_path / "nats", config=config)
    with pytest.raises(EmbeddedServerError) as caught:
        await server.start()
    error = caught.value
    assert isinstance(error, JetcrawlError)
    assert "exited with code 1" in error.problem
    assert "Parse error" in error.log_tail
    assert error.log_tail in str(error)
    assert error.log_path == server.log_path
    assert "Parse error" in server.log_path.read_text()
    assert not server.running


async def test_a_taken_port_is_a_fatal_log_line(nats_server: NatsServer, tmp_path: Path) -> None:
    second = NatsServer(tmp_path / "second", port=nats_server.port)
    with pytest.raises(EmbeddedServerError, match=r"\[FTL\].*address already in use"):
        await second.start()
    assert not second.running
    assert nats_server.running  # the first one is untouched


async def test_a_server_that_exits_before_its_log_is_read_reports_the_log(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exit can be seen before the pipe is read; the fatal line is still the error."""
    spawn = asyncio.create_subprocess_exec

    async def spawn_and_wait_for_the_exit(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        process = await spawn(*args, **kwargs)
        await process.wait()
        return process

    monkeypatch.setattr(asyncio, "create_subprocess_exec", spawn_and_wait_for_the_exit)
    second = NatsServer(tmp_path / "second", port=nats_server.port)
    with pytest.raises(EmbeddedServerError, match=r"\[FTL\].*address already in use"):
        await second.start()
    assert not second.running


async def test_a_missing_binary_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(EmbeddedServerError, match=r"jetcrawl\[embedded\]"):
        nats_server_binary()
    with pytest.raises(EmbeddedServerError, match="not found"):
        await NatsServer(tmp_path / "nats").start()


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds")
async def test_a_server_dies_with_its_parent_process(tmp_path: Path) -> None:
    parent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        PARENT_SCRIPT,
        str(tmp_path / "nats"),
        stdout=asyncio.subprocess.PIPE,
    )
    assert parent.stdout is not None
    server_pid = int(await parent.stdout.readline())
    exited = asyncio.Event()
    pidfd = os.pidfd_open(server_pid)  # readable once the process exits
    loop = asyncio.get_running_loop()
    loop.add_reader(pidfd, exited.set)
    try:
        assert not exited.is_set()
        parent.kill()  # SIGKILL: no atexit, no cleanup of any kind in the parent
        await parent.wait()
        async with asyncio.timeout(10):
            await exited.wait()
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


PARENT_SCRIPT = """
import asyncio, sys
from jetcrawl.local.embedded import NatsServer

async def main():
    server = NatsServer(sys.argv[1])
    await server.start()
    print(server.pid, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_binaries_come_from_the_wheels() -> None:
    assert os.access(nats_server_binary(), os.X_OK)
    etcd = etcd_binary()
    assert os.access(etcd, os.X_OK)
    assert etcd.read_bytes()[:4] == b"\x7fELF"  # the real binary, not the Python shim


# --- etcd --------------------------------------------------------------------------------------


async def test_etcd_put_and_get(etcd_server: EtcdServer) -> None:
    assert etcd_server.url == f"http://127.0.0.1:{etcd_server.port}"
    async with aetcd.Client(host="127.0.0.1", port=etcd_server.port, timeout=5) as client:
        await client.put(b"/jetcrawl/test/key", b"value")
        got = await client.get(b"/jetcrawl/test/key")
        assert got is not None
        assert got.value == b"value"
        assert await client.get(b"/jetcrawl/test/absent") is None


@pytest.mark.parametrize("crash", [False, True], ids=["stop", "kill"])
async def test_etcd_restart_keeps_ports_and_data(tmp_path: Path, crash: bool) -> None:
    server = EtcdServer(tmp_path / "etcd")
    async with server:
        url, pid = server.url, server.pid
        assert pid is not None
        async with aetcd.Client(host="127.0.0.1", port=server.port, timeout=5) as client:
            await client.put(b"k", b"v1")
        await (server.kill() if crash else server.stop())
        assert not alive(pid)
        await server.start()
        assert server.url == url
        async with aetcd.Client(host="127.0.0.1", port=server.port, timeout=5) as client:
            got = await client.get(b"k")
            assert got is not None and got.value == b"v1"
    assert not server.running


async def test_etcd_on_a_taken_port_fails_with_the_log_attached(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    second = EtcdServer(tmp_path / "second", port=etcd_server.port)
    with pytest.raises(EmbeddedServerError, match="address already in use") as caught:
        await second.start()
    assert '"level":"fatal"' in caught.value.log_tail
    assert not second.running


# --- a 3-node cluster --------------------------------------------------------------------------


async def test_cluster_forms_and_survives_a_lost_node_but_not_two(
    nats_cluster: NatsCluster,
) -> None:
    assert len(set(nats_cluster.urls)) == 3
    leaders = {server.meta_leader for server in nats_cluster.servers}
    assert len(leaders) == 1 and None not in leaders

    async with connected(*nats_cluster.urls) as nc:
        js = nc.jetstream()
        await add_replicated(
            js, StreamConfig(name="REPLICATED", subjects=["replicated.>"], num_replicas=3)
        )
        info = await js.stream_info("REPLICATED")
        assert info.cluster is not None
        assert len(info.cluster.replicas or []) == 2
        # The new stream's leader and its interest reach our node a moment after the create
        # returns; until then a publish finds "no responders" (nothing stored), so read it again.
        first = await read_until(
            lambda: js.publish("replicated.a", b"1"), unavailable=(NoStreamResponseError,)
        )
        assert first.seq == 1

        # Lose one node that is neither the stream leader nor our connection: R3 keeps quorum.
        # (Losing the stream leader fails publishes fast with "no response from stream" until
        # the group elects another, which takes seconds: services retry that.)
        await follower(nats_cluster, info, nc).kill()
        ack = await js.publish("replicated.a", b"2", timeout=5)
        assert ack.seq == 2

        # Lose a second one: no quorum, so the publish is not acknowledged (the negative case).
        second = next(
            server
            for server in nats_cluster.servers
            if server.running and server.url != connected_url(nc)
        )
        await second.stop()
        with pytest.raises((nats.errors.TimeoutError, NoStreamResponseError)):
            await js.publish("replicated.a", b"3", timeout=1)


async def test_a_killed_node_rejoins_on_its_port_and_store(nats_cluster: NatsCluster) -> None:
    async with connected(*nats_cluster.urls) as nc:
        js = nc.jetstream()
        await add_replicated(js, StreamConfig(name="REJOIN", subjects=["rejoin.>"], num_replicas=3))
        node = follower(nats_cluster, await js.stream_info("REJOIN"), nc)
        url = node.url
        await node.kill()
        await read_until(
            lambda: js.publish("rejoin.a", b"while one is down", timeout=5),
            unavailable=(NoStreamResponseError,),
        )

        await node.start()
        assert node.url == url
        assert await node.wait_for_meta_leader() in {"n1", "n2", "n3"}
        await nats_cluster.wait_for_placement()  # R3 placeable again: the node is back as a peer
        assert (node.store_dir / "jetstream").is_dir()
        ack = await js.publish("rejoin.a", b"after", timeout=5)
        assert ack.seq == 2
