"""TLS to NATS: real certificates (tests/support/certs.py) against a real nats-server that
requires TLS, and one that also requires client certificates. The server is verified by
default; a wrong CA costs a command one line naming the URL and the cause, and exit status 2."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import pytest

from jetcrawl.contract.errors import SettingsError
from jetcrawl.contract.settings import Secret, Settings
from jetcrawl.contract.topology import RESULTS_STREAM
from jetcrawl.local.embedded import NatsServer
from jetcrawl.plumbing.bus import BusError, connect
from jetcrawl.plumbing.topology import ensure
from tests.support.certs import Certs, nats_tls_args
from tests.test_fail_fast import GIVE_UP_S, jetcrawl


@pytest.fixture
async def tls_nats(tmp_path: Path, certs: Certs) -> asyncio.AsyncIterator[NatsServer]:
    async with NatsServer(tmp_path / "nats", args=nats_tls_args(certs)) as server:
        yield server


@pytest.fixture
async def mtls_nats(tmp_path: Path, certs: Certs) -> asyncio.AsyncIterator[NatsServer]:
    args = nats_tls_args(certs, verify_clients=True)
    async with NatsServer(tmp_path / "nats", args=args) as server:
        yield server


async def test_a_service_talks_to_jetstream_over_tls_verified_against_the_ca(
    tls_nats: NatsServer, certs: Certs
) -> None:
    settings = Settings(nats_url=tls_nats.url, nats_tls_ca_file=str(certs.ca), shards=4)
    nc = await connect(settings, "test", give_up_s=5)
    try:
        await ensure(nc.jetstream(), settings)
        info = await nc.jetstream().stream_info(RESULTS_STREAM)
        assert info.config.name == RESULTS_STREAM
    finally:
        await nc.close()


@pytest.mark.parametrize("scheme", ["nats", "tls"])
async def test_without_the_ca_the_server_is_not_trusted(
    tls_nats: NatsServer, certs: Certs, scheme: str
) -> None:
    # The system's CAs do not know the test CA: verification is on by default, even when the
    # server asks for TLS and the URL does not say so.
    url = f"{scheme}://127.0.0.1:{tls_nats.port}"
    with pytest.raises(BusError) as raised:
        await connect(Settings(nats_url=url), "test", give_up_s=1)
    assert str(raised.value) == (
        f"cannot connect to NATS at {url}: TLS: certificate verify failed: "
        "unable to get local issuer certificate"
    )


@pytest.mark.parametrize("command", [["dlq", "list"], ["status", "--interval", "0"]])
async def test_a_command_with_a_wrong_ca_fails_fast_naming_the_url_and_the_cause(
    tls_nats: NatsServer, certs: Certs, command: list[str]
) -> None:
    argv = [*command, "--nats", tls_nats.url, "--nats-ca", str(certs.other_ca)]
    code, err = await jetcrawl(*argv, "--connect-timeout", GIVE_UP_S)
    assert code == 2, err
    assert err[-1] == (
        f"jetcrawl: cannot connect to NATS at {tls_nats.url}: TLS: certificate verify failed: "
        "unable to get local issuer certificate"
    ), err
    assert not any("Traceback" in line for line in err), err


async def test_the_same_command_with_the_right_ca_succeeds(
    tls_nats: NatsServer, certs: Certs
) -> None:
    code, err = await jetcrawl("dlq", "list", "--nats", tls_nats.url, "--nats-ca", str(certs.ca))
    assert code == 0, err


async def test_a_server_that_requires_client_certificates_takes_only_ours(
    mtls_nats: NatsServer, certs: Certs
) -> None:
    settings = Settings(nats_url=mtls_nats.url, nats_tls_ca_file=str(certs.ca))
    with pytest.raises(BusError, match=f"cannot connect to NATS at {mtls_nats.url}: "):
        await connect(settings, "test", give_up_s=1)  # no client certificate: refused
    with_cert = settings.replace(
        nats_tls_cert_file=str(certs.client_cert), nats_tls_key_file=str(certs.client_key)
    )
    nc = await connect(with_cert, "test", give_up_s=5)
    try:
        assert (await nc.jetstream().account_info()).streams == 0
    finally:
        await nc.close()


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"nats_tls_ca_file": "/nonexistent/ca.pem"}, "setting nats_tls_ca_file: cannot read"),
        ({"nats_tls_cert_file": "x.pem"}, "setting nats_tls_key_file: set both or neither"),
    ],
)
async def test_bad_tls_settings_name_the_setting(
    tls_nats: NatsServer, change: dict[str, str], said: str
) -> None:
    with pytest.raises(SettingsError, match=said):
        await connect(Settings(nats_url=tls_nats.url).replace(**change), "test", give_up_s=1)


async def test_a_key_file_that_is_not_pem_is_named(tls_nats: NatsServer, certs: Certs) -> None:
    settings = Settings(
        nats_url=tls_nats.url,
        nats_tls_ca_file=str(certs.ca),
        nats_tls_cert_file=str(certs.client_cert),
        nats_tls_key_file=str(certs.ca.parent),  # a directory
    )
    with pytest.raises(SettingsError, match="setting nats_tls_key_file: cannot read"):
        await connect(settings, "test", give_up_s=1)


def test_settings_show_no_password_and_no_key_material(certs: Certs) -> None:
    settings = Settings(
        nats_url="nats://crawler:pw-in-url@a:4222,tls://b:4222",
        nats_user="crawler",
        nats_password=Secret("pw-in-setting"),
        etcd_url="https://root:etcd-pw@e1:2379,https://e2:2379",
        nats_tls_key_file=str(certs.client_key),
        nats_tls_cert_file=str(certs.client_cert),
    )
    shown = repr(settings)
    for secret in ("pw-in-url", "pw-in-setting", "etcd-pw", *certs.key_material()):
        assert secret not in shown
    assert "nats_url='nats://crawler:***@a:4222,tls://b:4222'" in shown
    assert "etcd_url='https://root:***@e1:2379,https://e2:2379'" in shown
    assert f"nats_tls_key_file='{certs.client_key}'" in shown  # the path, not the key
    assert "nats_password='***'" in shown
    assert settings.nats_url.startswith("nats://crawler:pw-in-url@"), "the value itself is whole"


async def test_a_service_refused_by_the_server_says_so_and_keeps_trying(
    tls_nats: NatsServer, certs: Certs
) -> None:
    settings = Settings(nats_url=tls_nats.url, nats_tls_ca_file=str(certs.other_ca))
    said = f"nats (service, {tls_nats.url}): TLS: certificate verify failed"
    twice = asyncio.Event()
    seen: list[str] = []

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if said in record.getMessage():
                seen.append(record.getMessage())
                if len(seen) >= 2:
                    twice.set()

    bus_log = logging.getLogger("jetcrawl.plumbing.bus")
    watch = Watch(logging.WARNING)
    bus_log.addHandler(watch)
    connecting = asyncio.create_task(connect(settings, "service"))  # a service: no give_up_s
    try:
        async with asyncio.timeout(30):
            await twice.wait()
        assert not connecting.done(), "a service does not give up"
    finally:
        bus_log.removeHandler(watch)
        connecting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await connecting


async def test_a_tls_url_never_falls_back_to_plain_text(nats_server: NatsServer) -> None:
    url = f"tls://127.0.0.1:{nats_server.port}"  # a server without TLS
    with pytest.raises(BusError) as raised:
        await connect(Settings(nats_url=url), "test", give_up_s=2)
    assert (
        str(raised.value) == f"cannot connect to NATS at {url}: TLS: the server does not offer it"
    )
    nc = await connect(Settings(nats_url=nats_server.url), "test", give_up_s=2)  # nats:// may
    await nc.close()
