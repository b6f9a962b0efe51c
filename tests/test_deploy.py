"""The compose deployment, proven without a container engine.

This machine has a docker client and no engine, so compose.yaml, the Dockerfile and nats/ are
checked two ways:

- read against the code: every service command parses with the real ``jetcrawl`` parser, every
  ``JETCRAWL_*`` variable is a setting (``Settings.from_env``) and every other one a standard
  ``OTEL_*`` variable of the OpenTelemetry SDK, ports and health checks agree with the configs and
  with what the services serve, the image is multi-stage, slim, non-root and carries no secret;
- run: the compose services' own commands and environments (the image's ENV under compose's
  ``environment``) as local processes, compose host names mapped to loopback and ports chosen
  free, against a nats-server started from compose's own command with nats/ and its users. Seeds
  published as ``seeder`` are crawled; a second and a third worker started later take shards; the
  local OTLP receiver (tests/support/otlp.py) stands in for Jaeger and gets the spans; and the least
  privilege of nats/accounts.conf is shown by what each user is refused.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import tomllib
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import nats
import pytest
import yaml
from nats.aio.client import Client as NATS
from nats.errors import TimeoutError as NatsTimeoutError
from opentelemetry.sdk import environment_variables as otel_variables

from jetcrawl.cli import build_parser
from jetcrawl.cli.commands import apply_topology as cli_apply_topology
from jetcrawl.contract.control import PAUSED
from jetcrawl.contract.errors import JetcrawlError, TopologyError
from jetcrawl.contract.jobs import JobSpec
from jetcrawl.contract.messages import Result
from jetcrawl.contract.render import RENDER_SUBJECT
from jetcrawl.contract.settings import ENV_PREFIX, MAX_PARTITIONS, Secret, Settings
from jetcrawl.contract.topology import (
    BODIES_STREAM,
    CONTROL_BUCKET,
    FRONTIER_STREAM,
    ITEMS_STREAM,
    RESULTS_STREAM,
    SEEDS,
    SPECS_BUCKET,
    TASKS_STREAM,
    Topology,
    item_subject,
    lane_config,
    result_subject,
    task_subject,
)
from jetcrawl.dispatcher import Dispatcher
from jetcrawl.dispatcher.intake import Intake
from jetcrawl.local.embedded import (
    EtcdServer,
    EtcdTls,
    NatsServer,
    etcd_binary,
    free_ports,
    nats_server_binary,
)
from jetcrawl.ops.control import run_control
from jetcrawl.ops.dlq import read_letters, replay
from jetcrawl.ops.jobstatus import check_known, read_controls
from jetcrawl.plumbing.bodies import BodyStore
from jetcrawl.plumbing.bus import inbox_prefix
from jetcrawl.plumbing.control import ControlStore, ControlWatch, purge_tasks
from jetcrawl.plumbing.specs import SpecStore
from jetcrawl.plumbing.topology import ensure
from jetcrawl.registry import read_ownership
from jetcrawl.worker import Worker
from jetcrawl.worker.render import RenderClient
from tests.support import tools
from tests.support.mesh import Service
from tests.support.otlp import OtlpReceiver, ReceivedSpan
from tests.support.site import MultiHostSite
from tests.support.streams import eventually, read_until, stored
from tests.support.tools import require

ROOT = Path(__file__).resolve().parent.parent
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
NATS_CONFIG_DIR = ROOT / "nats"
USERS = ("admin", "seeder", "dispatcher", "worker", "sink", "renderer")
PASSWORD_VARIABLES = tuple(f"NATS_{user.upper()}_PASSWORD" for user in USERS)
NATS_TLS_VARIABLES = ("NATS_TLS_CERT_FILE", "NATS_TLS_KEY_FILE")  # nats/common.conf's tls block
CERTS_MOUNT = "/certs/"  # where compose mounts deploy/certs/dev
MAKE_DEV_CERTS = ROOT / "deploy" / "certs" / "make-dev-certs.sh"
DATABASE_PASSWORD = "POSTGRES_PASSWORD"  # compose's PostgreSQL, and the sink's DSN
JETCRAWL_IMAGE = "jetcrawl:local"
RENDERER_IMAGE = "jetcrawl-renderer:local"  # the Dockerfile's `renderer` target
JETCRAWL = (sys.executable, "-m", "jetcrawl")  # the image's entrypoint, `jetcrawl`

# Only for this test's speed and sandbox, never in compose: the test site lives on loopback, which
# the SSRF guard refuses by default, and the product's 1 s per host would make the crawl minutes.
TEST_ONLY = {
    "JETCRAWL_ALLOW_NETS": "127.0.0.0/8",
    "JETCRAWL_HOST_DELAY_S": "0",
    "JETCRAWL_LEASE_TTL_S": "3",
    "OTEL_BSP_SCHEDULE_DELAY": "100",
}


# ---------------------------------------------------------------- reading the deployment files


@dataclass(frozen=True, slots=True)
class Dockerfile:
    """The instructions of a Dockerfile, continuation lines joined, by stage."""

    stages: list[list[tuple[str, str]]]  # per FROM: (INSTRUCTION, arguments)

    @classmethod
    def read(cls, path: Path) -> Dockerfile:
        text = re.sub(r"\\\n", " ", path.read_text())
        stages: list[list[tuple[str, str]]] = []
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            instruction, _, args = line.partition(" ")
            if instruction.upper() == "FROM":
                stages.append([])
            elif not stages:
                continue  # ARG before the first FROM
            stages[-1].append((instruction.upper(), " ".join(args.split())))
        return cls(stages)

    @property
    def final(self) -> list[tuple[str, str]]:
        return self.stages[-1]

    def args(self, instruction: str, stage: list[tuple[str, str]] | None = None) -> list[str]:
        return [a for i, a in (self.final if stage is None else stage) if i == instruction]

    def env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for args in self.args("ENV"):
            env.update(pair.split("=", 1) for pair in shlex.split(args))
        return env

    def healthcheck(self) -> tuple[dict[str, str], list[str]]:
        """The options and the exec-form command of the final stage's HEALTHCHECK."""
        [args] = self.args("HEALTHCHECK")
        options, _, command = args.partition(" CMD ")
        flags = dict(opt.removeprefix("--").split("=", 1) for opt in options.split())
        return flags, json.loads(command)


DOCKERFILE = Dockerfile.read(ROOT / "Dockerfile")


def interpolate(value: str, variables: Mapping[str, str]) -> str:
    """Compose's interpolation of the forms this file uses: ``${VAR:-default}`` and ``$$``."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, default = match.group(1), match.group(2)
        assert default is not None, f"${{{name}}} without a default: a clean clone must start"
        return variables.get(name) or default

    return re.sub(r"\$\$|\$\{(\w+)(?::-([^}]*))?\}", one, value)


def compose_environment(service: str, variables: Mapping[str, str]) -> dict[str, str]:
    environment = SERVICES[service].get("environment", {})
    assert isinstance(environment, dict), f"{service}: environment as a mapping"
    return {key: interpolate(str(value), variables) for key, value in environment.items()}


def container_environment(service: str, variables: Mapping[str, str]) -> dict[str, str]:
    """What a jetcrawl container's process sees: the image's ENV, then compose's environment."""
    return {**DOCKERFILE.env(), **compose_environment(service, variables)}


def jetcrawl_services() -> list[str]:
    return [
        name for name, s in SERVICES.items() if s.get("image") in (JETCRAWL_IMAGE, RENDERER_IMAGE)
    ]


def settings_variables(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(ENV_PREFIX)}


def seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)s", duration)
    assert match, f"a duration in seconds: {duration!r}"
    return float(match.group(1))


def host_port(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"


def nats_config_value(name: str) -> str:
    """A top-level ``name: value`` of nats/nats-server.conf."""
    match = re.search(
        rf"^{name}:\s*(\S+)", (NATS_CONFIG_DIR / "nats-server.conf").read_text(), re.M
    )
    assert match, f"{name} in nats-server.conf"
    return match.group(1)


def standard_otel_variables() -> set[str]:
    return {v for k, v in vars(otel_variables).items() if k.startswith("OTEL_")}


# ---------------------------------------------------------------- static: the files vs the code


def test_compose_service_commands_are_real_jetcrawl_subcommands_with_valid_flags() -> None:
    parser = build_parser()
    commands = {name: SERVICES[name]["command"] for name in jetcrawl_services()}
    assert {"topology", "dispatcher", "worker"} <= set(commands)
    for name, command in commands.items():
        try:
            args = parser.parse_args(command)
        except SystemExit:
            pytest.fail(f"compose service {name}: `jetcrawl {' '.join(command)}` does not parse")
        assert isinstance(args, argparse.Namespace)
    assert commands["dispatcher"] == ["dispatcher"]
    assert commands["worker"] == ["worker"]
    assert commands["renderer"] == ["renderer"]
    assert parser.parse_args(commands["topology"]).apply, "the one-shot step applies the topology"

    [entrypoint] = DOCKERFILE.args("ENTRYPOINT")
    assert json.loads(entrypoint) == ["jetcrawl"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["jetcrawl"] == "jetcrawl.cli:main"


def test_every_environment_variable_is_a_setting_or_a_standard_otel_variable() -> None:
    otel = standard_otel_variables()
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in otel, "the SDK's list of its variables is readable"
    for name in jetcrawl_services():
        env = compose_environment(name, {})
        settings = Settings.from_env(settings_variables(env))  # an unknown JETCRAWL_* raises
        others = set(env) - set(settings_variables(env))
        assert others <= otel, f"{name}: not settings, not standard OTEL_*: {others - otel}"
        assert settings.nats_user in USERS and str(settings.nats_password), name
    image = DOCKERFILE.env()
    Settings.from_env(settings_variables(image))
    assert {k for k in image if not k.startswith(ENV_PREFIX)} == {
        "PYTHONDONTWRITEBYTECODE",  # the interpreter's own
        "PYTHONUNBUFFERED",
    }
    for variable in TEST_ONLY:
        assert variable.startswith(ENV_PREFIX) or variable in otel


def test_ports_and_health_checks_match_what_the_services_serve() -> None:
    # The image's HEALTHCHECK asks /healthz on the port the metrics_port setting names.
    env = DOCKERFILE.env()
    port = env["JETCRAWL_METRICS_PORT"]
    assert Settings.from_env(settings_variables(env)).metrics_port == int(port)
    assert DOCKERFILE.args("EXPOSE") == [port]
    options, command = DOCKERFILE.healthcheck()
    assert command[:2] == ["python", "-c"]
    assert "os.environ['JETCRAWL_METRICS_PORT']" in command[2] and "/healthz'" in command[2]
    assert seconds(options["timeout"]) < seconds(options["interval"])
    for name in ("dispatcher", "worker"):
        service = SERVICES[name]
        assert compose_environment(name, {})["JETCRAWL_METRICS_PORT"] == port
        assert service["expose"] == [port]
        assert "healthcheck" not in service, "the image's HEALTHCHECK applies"
    # Scalable: no fixed name, no host port.
    assert "container_name" not in SERVICES["worker"] and "ports" not in SERVICES["worker"]
    # Where the services connect is where the servers listen.
    shared = compose_environment("worker", {})
    assert (
        host_port(shared["JETCRAWL_NATS_URL"])
        == "nats:" + nats_config_value("listen").split(":")[1]
    )
    etcd_flags = dict(f.removeprefix("--").split("=", 1) for f in SERVICES["etcd"]["command"][1:])
    assert host_port(shared["JETCRAWL_ETCD_URL"]) == host_port(etcd_flags["advertise-client-urls"])
    otlp = urlsplit(shared["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert otlp.hostname == "jaeger" and str(otlp.port) in SERVICES["jaeger"]["expose"]
    # The servers' health checks probe their own listeners.
    nats_check = SERVICES["nats"]["healthcheck"]["test"]
    assert urlsplit(nats_check[-1]).port == int(nats_config_value("http_port"))
    assert urlsplit(nats_check[-1]).path == "/healthz"
    etcd_check = SERVICES["etcd"]["healthcheck"]["test"]
    assert (
        urlsplit(etcd_check[2].split("=", 1)[1]).port
        == urlsplit(etcd_flags["listen-client-urls"]).port
    )
    # Published ports listen on loopback only: the dev passwords are never exposed.
    for name, service in SERVICES.items():
        for mapping in service.get("ports", []):
            assert str(mapping).startswith("127.0.0.1:"), f"{name}: {mapping}"


def test_the_servers_take_clients_only_over_tls_and_every_service_verifies_them() -> None:
    mount = f"./deploy/certs/dev:{CERTS_MOUNT.rstrip('/')}:ro"
    nats = SERVICES["nats"]
    assert mount in nats["volumes"]
    assert all(nats["environment"][v].startswith(CERTS_MOUNT) for v in NATS_TLS_VARIABLES)
    assert "tls {" in (NATS_CONFIG_DIR / "common.conf").read_text()
    etcd = dict(f.removeprefix("--").split("=", 1) for f in SERVICES["etcd"]["command"][1:])
    assert mount in SERVICES["etcd"]["volumes"] and etcd["client-cert-auth"] == "true"
    assert etcd["listen-client-urls"].startswith("https://")
    for name in jetcrawl_services():
        settings = Settings.from_env(settings_variables(compose_environment(name, {})))
        assert mount in SERVICES[name]["volumes"], name
        assert settings.nats_tls_ca_file.startswith(CERTS_MOUNT), name
        assert settings.etcd_url.startswith("https://") and settings.etcd_tls_cert_file, name
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "/deploy/certs/dev/" in ignored, "generated keys are never committed"


def test_start_order_is_enforced_by_health_checks_and_depends_on() -> None:
    def conditions(name: str) -> dict[str, str]:
        return {dep: c["condition"] for dep, c in SERVICES[name]["depends_on"].items()}

    assert conditions("topology") == {"nats": "service_healthy"}
    for name in ("dispatcher", "worker"):
        assert conditions(name)["nats"] == "service_healthy"
        assert conditions(name)["topology"] == "service_completed_successfully"
        assert conditions(name)["jaeger"] == "service_started"
    assert conditions("worker")["etcd"] == "service_healthy"
    for name in jetcrawl_services():
        for dependency, condition in conditions(name).items():
            if condition == "service_healthy":
                assert "healthcheck" in SERVICES[dependency], dependency
    assert SERVICES["topology"]["restart"] == "no"
    assert SERVICES["topology"]["healthcheck"] == {"disable": True}
    drain = Settings().drain_deadline_s
    assert seconds(SERVICES["worker"]["stop_grace_period"]) > drain, "SIGTERM drains first"


def test_the_image_is_multi_stage_slim_non_root_and_holds_every_package_and_no_secret() -> None:
    froms = [
        line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("FROM")
    ]
    assert len(froms) == 3, "build wheels in one stage, install them into clean ones"
    assert froms[1].endswith(" AS renderer") and " AS " not in froms[2], "the default is last"
    renderer = SERVICES["renderer"]
    assert renderer["build"] == {"context": ".", "target": "renderer"}
    assert renderer["image"] == RENDERER_IMAGE
    assert all(SERVICES[name]["build"] == "." for name in jetcrawl_services() if name != "renderer")
    renderer_stage = DOCKERFILE.stages[1]
    [installed] = [a for i, a in renderer_stage if i == "RUN" and "pip install" in a]
    assert "'jetcrawl[render]'" in installed, "Playwright, for jetcrawl renderer alone"
    assert any("apt-get install" in a and "chromium" in a for i, a in renderer_stage if i == "RUN")
    assert not any("chromium" in a for _, a in DOCKERFILE.final), "the default image is unchanged"
    [renderer_user] = DOCKERFILE.args("USER", renderer_stage)
    assert renderer_user.split(":")[0] not in ("0", "root")
    for instruction in ("ENTRYPOINT", "HEALTHCHECK", "EXPOSE", "ENV"):
        assert DOCKERFILE.args(instruction, renderer_stage) == DOCKERFILE.args(instruction)
    assert re.search(
        r"^ARG PYTHON_IMAGE=python:3\.\d+-slim", (ROOT / "Dockerfile").read_text(), re.M
    )
    [user] = DOCKERFILE.args("USER")
    assert user.split(":")[0] not in ("0", "root")
    copied = [args for args in DOCKERFILE.args("COPY", DOCKERFILE.stages[0])]
    assert copied == [". ./"], "the build context, which .dockerignore makes the package alone"
    for instruction, args in [i for stage in DOCKERFILE.stages for i in stage]:
        assert not re.search(r"PASSWORD|SECRET|TOKEN", args, re.I), f"{instruction} {args}"
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    ignored = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert ignored[0] == "*", "the build context is a whitelist"
    linked = {
        f"{os.readlink(p).removeprefix('../')}/"
        for p in (ROOT / "jetcrawl").iterdir()
        if p.is_symlink()
    }
    assert linked == {"dispatcher/", "worker/", "registry/", "otel/"}
    allowed = {p[1:] for p in ignored if p.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "jetcrawl/", *linked}, "the package only"
    assert "nats/" not in allowed, "nats/ is server config: a package would shadow nats-py"


def test_passwords_come_from_the_environment_with_marked_local_defaults() -> None:
    accounts = (NATS_CONFIG_DIR / "accounts.conf").read_text()
    users = dict(re.findall(r"user: (\w+), password: \$(\w+)", accounts))
    assert users == dict(zip(USERS, PASSWORD_VARIABLES, strict=True))
    nats_env = SERVICES["nats"]["environment"]
    assert set(nats_env) == {*PASSWORD_VARIABLES, *NATS_TLS_VARIABLES}
    text = (ROOT / "compose.yaml").read_text()
    for variable in re.findall(r"\$\{(\w+)", text):
        assert variable in (*PASSWORD_VARIABLES, DATABASE_PASSWORD), (
            f"only passwords are interpolated: {variable}"
        )
    for default in re.findall(r"\$\{\w+:-([^}]*)\}", text):
        assert default.startswith("local-dev-only-"), default
    mine = {v: f"p{secrets.token_hex(4)}" for v in PASSWORD_VARIABLES}
    assert compose_environment("nats", mine).items() >= mine.items(), "a set one replaces a default"


def test_the_services_rights_name_every_partitions_streams_and_the_account_holds_them() -> None:
    accounts = (NATS_CONFIG_DIR / "accounts.conf").read_text()
    for p in range(MAX_PARTITIONS):  # a subject wildcard cannot match a name's suffix
        for needed in (
            f"$KV.crawl_seen_{p}.>",  # the dispatcher's marks
            f"$JS.API.STREAM.MSG.GET.CRAWL_TASKS_{p}",  # ... and its poison tasks
            f"$JS.API.STREAM.MSG.DELETE.CRAWL_TASKS_{p}",
            f"$JS.API.CONSUMER.CREATE.CRAWL_TASKS_{p}.>",  # the worker's lanes
            f"$JS.API.CONSUMER.MSG.NEXT.CRAWL_TASKS_{p}.*",
            f"$JS.ACK.CRAWL_TASKS_{p}.>",
        ):
            assert f'"{needed}"' in accounts, needed
    [max_streams] = re.findall(r"max_streams: (\d+)", accounts)
    most = Topology.from_settings(Settings(shards=64, partitions=MAX_PARTITIONS)).streams
    assert len(most) <= int(max_streams), "the account holds the topology at most partitions"


def test_compose_runs_the_server_versions_the_tests_run() -> None:
    out = subprocess.run([nats_server_binary(), "--version"], capture_output=True, text=True)
    local_nats = re.search(r"nats-server: v(\d+\.\d+)\.", out.stdout)
    assert local_nats, out.stdout
    image = re.fullmatch(r"nats:(\d+\.\d+)\.\d+-alpine", SERVICES["nats"]["image"])
    assert image, "a pinned release, with a shell for the health check"
    assert image.group(1) == local_nats.group(1), "nats/ is tested on another nats-server"
    out = subprocess.run([etcd_binary(), "--version"], capture_output=True, text=True)
    local_etcd = re.search(r"etcd Version: (\d+\.\d+)\.", out.stdout)
    assert local_etcd, out.stdout
    assert SERVICES["etcd"]["image"].startswith(f"quay.io/coreos/etcd:v{local_etcd.group(1)}.")
    etcd_help = subprocess.run([etcd_binary(), "--help"], capture_output=True, text=True)
    for flag in SERVICES["etcd"]["command"][1:]:
        assert f"\n  {flag.split('=')[0]} " in etcd_help.stdout + etcd_help.stderr, flag


@pytest.fixture
def dev_certs(tmp_path: Path) -> Path:
    """The directory deploy/certs/make-dev-certs.sh fills: what compose mounts at /certs."""
    openssl = tools.require("openssl", "deploy/certs/make-dev-certs.sh makes the dev certificates")
    directory = tmp_path / "certs"
    env = {**os.environ, "PATH": f"{Path(openssl).parent}:{os.environ.get('PATH', '')}"}
    subprocess.run(["sh", MAKE_DEV_CERTS, directory], check=True, capture_output=True, env=env)
    return directory


def localized(value: str, certs: Path) -> str:
    """A compose value with the mounted certificates' paths made this machine's."""
    return value.replace(CERTS_MOUNT, f"{certs}/")


@pytest.fixture
def passwords(monkeypatch: pytest.MonkeyPatch, dev_certs: Path) -> dict[str, str]:
    """Fresh passwords of the documented shape, in the environment nats-server inherits, and
    its TLS certificate as compose gives it. Clients of this process verify the server against
    the dev CA as a system CA (OpenSSL's SSL_CERT_FILE); the services get it by their setting."""
    chosen = {variable: f"p{secrets.token_hex(12)}" for variable in PASSWORD_VARIABLES}
    for variable, value in chosen.items():
        monkeypatch.setenv(variable, value)
    for variable in NATS_TLS_VARIABLES:
        monkeypatch.setenv(
            variable, localized(SERVICES["nats"]["environment"][variable], dev_certs)
        )
    monkeypatch.setenv("SSL_CERT_FILE", str(dev_certs / "ca.pem"))
    return chosen


def test_nats_configs_are_valid_and_refuse_to_start_without_passwords(
    passwords: dict[str, str], monkeypatch: pytest.MonkeyPatch, dev_certs: Path
) -> None:
    def check(config: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [nats_server_binary(), "-c", NATS_CONFIG_DIR / config, "-t"],
            capture_output=True,
            text=True,
        )

    monkeypatch.setenv("NATS_SERVER_NAME", "n1")
    for config in ("nats-server.conf", "cluster.conf"):
        assert check(config).returncode == 0, check(config).stderr
    for variable, default in compose_environment("nats", {}).items():
        # nats-server reads a variable as a config token
        monkeypatch.setenv(variable, localized(default, dev_certs))
    assert check("nats-server.conf").returncode == 0, "compose's defaults are valid passwords"
    monkeypatch.delenv("NATS_WORKER_PASSWORD")
    refused = check("nats-server.conf")
    assert refused.returncode != 0 and "NATS_WORKER_PASSWORD" in refused.stderr


def test_nats_box_contexts_are_users_of_the_config() -> None:
    service = SERVICES["nats-box"]
    [script] = service["command"]
    saved = re.findall(
        r"nats context save (\w+) .*?--user (\w+) --password \"\$\$(\w+)\"(.*?)>", script
    )
    assert [(name, user, var) for name, user, var, _ in saved] == [
        ("admin", "admin", "NATS_ADMIN_PASSWORD"),
        ("seeder", "seeder", "NATS_SEEDER_PASSWORD"),
    ]
    assert "--select" in saved[1][3], "`nats pub crawl.seeds URL` publishes as the seeder"
    assert all(f"--tlsca {CERTS_MOUNT}ca.pem" in options for *_, options in saved)
    assert f"./deploy/certs/dev:{CERTS_MOUNT.rstrip('/')}:ro" in service["volumes"]
    assert set(service["environment"]) == {"NATS_ADMIN_PASSWORD", "NATS_SEEDER_PASSWORD"}


def readme_deploy_commands() -> list[list[str]]:
    """The ``docker compose`` command lines of deploy/README.md's walkthrough, as words."""
    readme = (ROOT / "deploy" / "README.md").read_text()
    section = readme.split("\n## Compose and scaling\n", 1)[1].split("\n#", 1)[0]
    return [
        shlex.split(line.split(" > ")[0])[2:]
        for line in section.splitlines()
        if line.startswith("docker compose ")
    ]


def test_readme_walkthrough_commands_are_real() -> None:
    parser = build_parser()
    jetcrawl_commands = seeds = 0
    for words in readme_deploy_commands():
        if words[:1] == ["exec"] or words[:3] == ["run", "--rm", "-T"]:
            service = words[1] if words[0] == "exec" else words[3]
            assert service in SERVICES, words
            command = words[2:] if words[0] == "exec" else words[4:]
            if command[:1] == ["jetcrawl"] or words[0] == "run":
                parser.parse_args(command[1:] if command[0] == "jetcrawl" else command)
                jetcrawl_commands += 1
            if command[:3] == ["nats", "pub", SEEDS]:
                body = command[3]
                if body.startswith("$(printf '"):  # the shell's printf of a quoted format
                    body = body.removeprefix("$(printf '").removesuffix("')").replace("\\n", "\n")
                reading = Intake(Settings()).read(SEEDS, body.encode())
                assert reading.tasks and not reading.rejections, body
                seeds += 1
    assert jetcrawl_commands >= 2 and seeds >= 1, "the walkthrough runs jetcrawl and seeds"


# ---------------------------------------------------------------- running it: servers


def compose_nats(store: Path, monitor_port: int | None = None) -> NatsServer:
    """nats-server as compose runs it: its command, the config from nats/, a store of ours."""
    args = list(SERVICES["nats"]["command"])
    [mount] = [v for v in SERVICES["nats"]["volumes"] if v.startswith("./nats:")]
    at = args.index("--config")
    config = NATS_CONFIG_DIR / Path(args[at + 1]).relative_to(mount.split(":")[1])
    del args[at : at + 2]  # NatsServer passes the config itself
    args[args.index("--store_dir") + 1] = str(store / "jetstream")  # was on a volume
    args += ["-m", str(monitor_port if monitor_port is not None else -1)]
    return NatsServer(store, config=config, args=args)


async def connect_as(
    server: NatsServer, user: str, errors: asyncio.Queue[str] | None = None
) -> NATS:
    async def on_error(e: Exception) -> None:
        if errors is not None:
            errors.put_nowait(str(e))

    return await nats.connect(
        server.url,
        user=user,
        password=os.environ[f"NATS_{user.upper()}_PASSWORD"],
        inbox_prefix=inbox_prefix(Settings(nats_user=user)),  # as the services connect
        allow_reconnect=False,
        error_cb=on_error,
    )


async def refused(errors: asyncio.Queue[str], what: str) -> None:
    """The server told this client it may not ``what`` (``publish to "x"``...)."""
    expected = f"permissions violation for {what}".lower()
    async with asyncio.timeout(5):
        while expected not in (await errors.get()).lower():
            pass  # another refusal (the client's own reply subscription, say)


async def apply_topology(server: NatsServer, settings: Settings) -> None:
    """``jetcrawl topology --apply`` as the admin user."""
    password = Secret(os.environ["NATS_ADMIN_PASSWORD"])
    admin = settings.replace(nats_url=server.url, nats_user="admin", nats_password=password)
    assert await cli_apply_topology(admin) == 0


# ---------------------------------------------------------------- running it: least privilege


async def test_seeder_may_only_publish_seeds_and_a_worker_may_not_delete_a_stream(
    tmp_path: Path, passwords: dict[str, str]
) -> None:
    async with compose_nats(tmp_path / "nats") as server:
        settings = Settings(nats_url=server.url, shards=4)
        await apply_topology(server, settings)
        admin = await connect_as(server, "admin")
        js = admin.jetstream()
        await js.publish(result_subject(0), b'{"v": 1}')
        errors: asyncio.Queue[str] = asyncio.Queue()
        seeder = await connect_as(server, "seeder", errors)
        worker = await connect_as(server, "worker", errors)
        try:
            await seeder.publish(SEEDS, b"https://example.com/")  # what `nats pub` does
            await seeder.flush()  # the server has it; JetStream stores it a moment later

            async def seed_stored() -> bool:
                return (await js.stream_info(FRONTIER_STREAM)).state.messages == 1

            await eventually(seed_stored, within_s=10)  # allowed

            await seeder.publish(task_subject(0), b"https://example.com/")
            await refused(errors, f'publish to "{task_subject(0)}"')
            await seeder.subscribe("crawl.results.>")
            await refused(errors, 'subscription to "crawl.results.>"')
            with pytest.raises(NatsTimeoutError):
                await seeder.jetstream(timeout=1).get_msg(RESULTS_STREAM, 1)
            await refused(errors, f'publish to "$JS.API.STREAM.MSG.GET.{RESULTS_STREAM}"')
            with pytest.raises(NatsTimeoutError):
                await seeder.jetstream(timeout=1).delete_stream(FRONTIER_STREAM)
            await refused(errors, f'publish to "$JS.API.STREAM.DELETE.{FRONTIER_STREAM}"')

            with pytest.raises(NatsTimeoutError):
                await worker.jetstream(timeout=1).delete_stream(TASKS_STREAM)
            await refused(errors, f'publish to "$JS.API.STREAM.DELETE.{TASKS_STREAM}"')
            with pytest.raises(NatsTimeoutError):
                await worker.jetstream(timeout=1).purge_stream(RESULTS_STREAM)
            await refused(errors, f'publish to "$JS.API.STREAM.PURGE.{RESULTS_STREAM}"')

            assert (await js.stream_info(TASKS_STREAM)).state.messages == 0
            assert (await js.stream_info(RESULTS_STREAM)).state.messages == 1
            assert (await js.stream_info(FRONTIER_STREAM)).state.messages == 1
        finally:
            for client in (seeder, worker, admin):
                await client.close()


async def test_a_service_user_reads_only_its_own_replies(
    tmp_path: Path, passwords: dict[str, str]
) -> None:
    # A worker parses hostile pages: it must not read the dispatcher's replies (its pulled
    # frontier messages, its publish acks), nor the common inbox, nor publish seeds.
    async with compose_nats(tmp_path / "nats") as server:
        await apply_topology(server, Settings(nats_url=server.url, shards=4))
        errors: asyncio.Queue[str] = asyncio.Queue()
        worker = await connect_as(server, "worker", errors)
        dispatcher = await connect_as(server, "dispatcher")
        try:
            info = await worker.jetstream().stream_info(TASKS_STREAM)  # its own replies: fine
            assert info.config.name == TASKS_STREAM
            await dispatcher.jetstream().stream_info(TASKS_STREAM)
            for inbox in ("_INBOX_dispatcher.>", "_INBOX.>", ">"):
                await worker.subscribe(inbox)
                await refused(errors, f'subscription to "{inbox}"')
            await worker.publish(SEEDS, b"https://example.com/")
            await refused(errors, f'publish to "{SEEDS}"')
            with pytest.raises(NatsTimeoutError):
                await worker.jetstream(timeout=1).purge_stream(TASKS_STREAM)
            await refused(errors, f'publish to "$JS.API.STREAM.PURGE.{TASKS_STREAM}"')
        finally:
            for client in (worker, dispatcher):
                await client.close()


# What each service user must not do (nats/accounts.conf), each tried as that user over TLS:
# read another user's replies or the common inbox, purge or delete a stream, publish what
# another role publishes (seeds, tasks, results).
REFUSED: dict[str, list[tuple[str, str]]] = {
    "seeder": [
        ("subscribe", "_INBOX_dispatcher.>"),
        ("subscribe", "_INBOX_worker.>"),
        ("purge", TASKS_STREAM),
        ("delete", FRONTIER_STREAM),
        ("publish", task_subject(0)),
    ],
    "dispatcher": [
        ("subscribe", "_INBOX_worker.>"),
        ("subscribe", "_INBOX.>"),
        ("purge", FRONTIER_STREAM),
        ("delete", TASKS_STREAM),
        ("publish", SEEDS),
        ("publish", result_subject(0)),
    ],
    "worker": [
        ("subscribe", "_INBOX_dispatcher.>"),
        ("subscribe", "_INBOX.>"),
        ("purge", BODIES_STREAM),
        ("delete", RESULTS_STREAM),
        ("publish", SEEDS),
        ("publish", task_subject(0)),
    ],
}


@pytest.mark.parametrize("user", list(REFUSED))
async def test_each_service_user_is_refused_what_it_must_not_do_over_tls(
    tmp_path: Path, passwords: dict[str, str], user: str
) -> None:
    async with compose_nats(tmp_path / "nats") as server:
        assert "TLS required for client connections" in server.log_path.read_text()
        await apply_topology(server, Settings(nats_url=server.url, shards=4))
        admin = await connect_as(server, "admin")
        errors: asyncio.Queue[str] = asyncio.Queue()
        client = await connect_as(server, user, errors)
        try:
            await admin.jetstream().publish(task_subject(1), b"https://example.com/")
            for action, target in REFUSED[user]:
                if action == "subscribe":
                    await client.subscribe(target)
                    await refused(errors, f'subscription to "{target}"')
                elif action == "publish":
                    await client.publish(target, b"https://example.com/")
                    await refused(errors, f'publish to "{target}"')
                else:
                    api = f"$JS.API.STREAM.{action.upper()}.{target}"
                    with pytest.raises(NatsTimeoutError):
                        call = client.jetstream(timeout=1)
                        await (call.purge_stream if action == "purge" else call.delete_stream)(
                            target
                        )
                    await refused(errors, f'publish to "{api}"')
            # Nothing was changed, and the admin, who may, shows the refusals were real ones.
            js = admin.jetstream()
            assert (await js.stream_info(TASKS_STREAM)).state.messages == 1
            assert len(await js.streams_info()) == len(Topology.from_settings(Settings()).streams)
            assert await js.purge_stream(TASKS_STREAM)
            assert (await js.stream_info(TASKS_STREAM)).state.messages == 0
        finally:
            for nc in (client, admin):
                await nc.close()


async def test_services_without_create_rights_check_the_topology_and_change_nothing(
    tmp_path: Path, passwords: dict[str, str]
) -> None:
    async with compose_nats(tmp_path / "nats") as server:
        settings = Settings(nats_url=server.url, shards=4, create_topology=False)
        worker = await connect_as(server, "worker")
        admin = await connect_as(server, "admin")
        try:
            with pytest.raises(TopologyError, match=f"stream {FRONTIER_STREAM} is missing"):
                await ensure(worker.jetstream(), settings)
            assert await admin.jetstream().streams_info() == [], "it created nothing"

            await apply_topology(server, settings)
            await ensure(worker.jetstream(), settings)  # the same declaration: accepted

            with pytest.raises(
                TopologyError, match="dispatch has ack_wait=30000000000, not 7000000000"
            ):
                await ensure(worker.jetstream(), settings.replace(ack_wait_s=7.0))
            topology = Topology.from_settings(settings)
            assert len(await admin.jetstream().streams_info()) == len(topology.streams)
        finally:
            await worker.close()
            await admin.close()


async def test_a_worker_stores_bodies_without_the_right_to_purge_any_stream(
    tmp_path: Path, passwords: dict[str, str]
) -> None:
    """nats-py's object store purges chunks (a failed put's, a raced put's old ones); a worker,
    the process that parses hostile pages, may purge nothing, so jetcrawl writes objects in the
    same format without a purge (plumbing/bodies.py), and nats-py reads them back."""
    async with compose_nats(tmp_path / "nats") as server:
        await apply_topology(server, Settings(nats_url=server.url, shards=4))
        errors: asyncio.Queue[str] = asyncio.Queue()
        worker = await connect_as(server, "worker", errors)
        admin = await connect_as(server, "admin")
        try:
            bodies = await BodyStore.open(worker.jetstream(timeout=2))
            body = bytes(range(256)) * 4096  # a megabyte: several chunks
            ref, _ = await bodies.put("f" * 32, body)
            assert errors.empty(), errors.get_nowait()
            read_back = await BodyStore.open(admin.jetstream())  # as `jetcrawl results` reads
            assert await read_back.get(ref) == body
            for stream in (BODIES_STREAM, TASKS_STREAM):
                with pytest.raises(NatsTimeoutError):
                    await worker.jetstream(timeout=1).purge_stream(stream)
                await refused(errors, f'publish to "$JS.API.STREAM.PURGE.{stream}"')
        finally:
            for client in (worker, admin):
                await client.close()


async def test_the_dispatchers_rights_cover_its_recovery_paths(
    tmp_path: Path, passwords: dict[str, str]
) -> None:
    """Paths a healthy crawl never takes: a redelivered frontier message reads back the seen
    marks its cache lost (from the stream leader); one out of deliveries is read, dead-lettered
    and deleted by the poison collector; its replay reads its marks again. Refused there, the
    message would stall for minutes and then be lost."""
    async with compose_nats(tmp_path / "nats") as server:
        password = Secret(passwords["NATS_DISPATCHER_PASSWORD"])
        settings = Settings(
            nats_url=server.url,
            shards=4,
            create_topology=False,
            nats_user="dispatcher",
            nats_password=password,
            frontier_max_deliver=2,
            dedupe_cache_size=1,  # the marks of a redelivery are read back, not recalled
        )
        await apply_topology(server, settings)
        admin = await connect_as(server, "admin")
        js = admin.jetstream()
        urls = [f"https://h{i}.example/p" for i in range(3)]
        try:
            async with Dispatcher(settings) as dispatcher, asyncio.TaskGroup() as tg:
                tg.create_task(dispatcher.run())
                try:
                    # No task fits in the task stream: every delivery fails to publish.
                    tasks_config = (await js.stream_info(TASKS_STREAM)).config
                    await js.update_stream(dataclasses.replace(tasks_config, max_msg_size=16))
                    await js.publish(SEEDS, "\n".join(urls).encode())
                    letters = await read_until(
                        lambda: read_letters(js, stage="frontier", reason="max_deliveries"), bool
                    )
                    assert_no_violations(server)
                    await js.update_stream(tasks_config)
                    assert (await replay(js, letters)).replayed == 1

                    async with asyncio.timeout(20):
                        await dispatcher.wait_until(lambda s: s.messages >= 1)
                    assert dispatcher.seen_stats.read_back >= 2 * (len(urls) - 1)
                finally:
                    dispatcher.stop()
            assert len(await stored(js, TASKS_STREAM)) == len(urls)
        finally:
            await admin.close()
    assert_no_violations(server)


async def test_services_read_job_specs_and_only_a_worker_publishes_items(
    tmp_path: Path, passwords: dict[str, str]
) -> None:
    """Both services watch KV crawl_specs; the worker, which parses hostile pages, may not
    write a spec; the dispatcher stores a spec a seed carries inline. The worker publishes
    items, the dispatcher may not."""
    async with compose_nats(tmp_path / "nats") as server:
        base = Settings(nats_url=server.url, shards=4, create_topology=False)
        await apply_topology(server, base)
        admin = await connect_as(server, "admin")
        errors: asyncio.Queue[str] = asyncio.Queue()
        worker = await connect_as(server, "worker", errors)
        dispatcher_nc = await connect_as(server, "dispatcher", errors)
        try:
            store = await SpecStore.open(admin.jetstream())
            await store.put(JobSpec.read({"name": "shop", "max_depth": 2}))

            def as_user(user: str) -> Settings:
                password = Secret(passwords[f"NATS_{user.upper()}_PASSWORD"])
                return base.replace(nats_user=user, nats_password=password)

            async with (
                Dispatcher(as_user("dispatcher")) as dispatcher,
                Worker(as_user("worker"), "w1") as crawler,
                asyncio.TaskGroup() as tg,
            ):
                tg.create_task(dispatcher.run())
                tg.create_task(crawler.run())
                try:
                    async with asyncio.timeout(10):
                        await crawler.wait_running()
                        assert dispatcher.specs is not None and crawler.specs is not None
                        await dispatcher.specs.wait_version("shop", 1)
                        await crawler.specs.wait_version("shop", 1)
                    await store.put(JobSpec.read({"name": "shop", "max_depth": 3}))
                    async with asyncio.timeout(10):  # a change reaches both watches
                        await dispatcher.specs.wait_version("shop", 2)
                        await crawler.specs.wait_version("shop", 2)
                    inline = {"name": "shop", "max_depth": 4}
                    seed = {"url": "https://shop.example/", "spec": inline}
                    await admin.jetstream().publish(SEEDS, json.dumps(seed).encode())
                    async with asyncio.timeout(10):  # stored by the dispatcher
                        await crawler.specs.wait_version("shop", 3)
                finally:
                    crawler.stop()
                    dispatcher.stop()
            assert_no_violations(server)

            await worker.jetstream().publish(item_subject("shop"), b'{"v": 1}')  # allowed
            with pytest.raises(NatsTimeoutError):
                await worker.jetstream(timeout=1).publish(f"$KV.{SPECS_BUCKET}.shop", b"x")
            await refused(errors, f'publish to "$KV.{SPECS_BUCKET}.shop"')
            await dispatcher_nc.publish(item_subject("shop"), b'{"v": 1}')
            await refused(errors, f'publish to "{item_subject("shop")}"')
            assert (await admin.jetstream().stream_info(ITEMS_STREAM)).state.messages == 1
            assert (await store.get("shop")).version == 3, "the worker wrote no spec"
        finally:
            for client in (worker, dispatcher_nc, admin):
                await client.close()


async def test_job_control_is_the_admins_and_the_services_only_read_it(
    tmp_path: Path, passwords: dict[str, str]
) -> None:
    """The operator (admin) pauses and cancels: KV crawl_control writes and the purge of a job's
    lanes. The dispatcher publishes to any lane; the worker makes a lane's consumer and pulls
    from it; both watch the run states and read them for `jetcrawl status`, and neither may
    write a state, purge the task stream or delete a lane's consumer."""
    async with compose_nats(tmp_path / "nats") as server:
        settings = Settings(nats_url=server.url, shards=4)
        await apply_topology(server, settings)
        admin = await connect_as(server, "admin")
        errors: asyncio.Queue[str] = asyncio.Queue()
        worker = await connect_as(server, "worker", errors)
        dispatcher = await connect_as(server, "dispatcher", errors)
        lane = lane_config(settings, 1, 0, "news")
        try:
            await dispatcher.jetstream().publish(task_subject(1, 0, "news"), b"a task")  # allowed
            await dispatcher.jetstream().publish(task_subject(2, 3, "shop"), b"a task")
            wjs = worker.jetstream(timeout=2)
            await wjs.add_consumer(TASKS_STREAM, lane)  # allowed: its shard's lane
            sub = await wjs.pull_subscribe_bind(lane.durable_name or "", stream=TASKS_STREAM)
            [msg] = await sub.fetch(1, timeout=5)
            await msg.ack_sync()

            admin_store = await ControlStore.open(admin.jetstream())
            await admin_store.change("shop", PAUSED, "ops@console")
            for nc in (worker, dispatcher):  # the watch, and status's reads
                watch = ControlWatch(nc.jetstream(timeout=2))
                stop = asyncio.Event()
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(watch.run(stop))
                    async with asyncio.timeout(10):
                        await watch.wait_for(lambda w=watch: w.state("shop") == PAUSED)
                    stop.set()
                assert [c.state for c in await read_controls(nc.jetstream())] == [PAUSED]
                await check_known(nc.jetstream(), "shop")
            assert_no_violations(server)

            for nc in (worker, dispatcher):
                with pytest.raises(NatsTimeoutError):
                    await nc.jetstream(timeout=1).publish(f"$KV.{CONTROL_BUCKET}.shop", b"x")
                await refused(errors, f'publish to "$KV.{CONTROL_BUCKET}.shop"')
                with pytest.raises(NatsTimeoutError):
                    await nc.jetstream(timeout=1).purge_stream(TASKS_STREAM)
                await refused(errors, f'publish to "$JS.API.STREAM.PURGE.{TASKS_STREAM}"')
            with pytest.raises(NatsTimeoutError):
                await worker.jetstream(timeout=1).delete_consumer(TASKS_STREAM, "tasks-1-0-news")
            await refused(errors, 'publish to "$JS.API.CONSUMER.DELETE.CRAWL_TASKS.tasks-1-0-news"')

            as_worker = settings.replace(
                nats_user="worker",
                nats_password=Secret(passwords["NATS_WORKER_PASSWORD"]),
                command_timeout_s=1.0,
            )
            with pytest.raises(
                JetcrawlError, match=r"job shop: NATS at .* did not take the resume"
            ):
                await run_control(as_worker, "resume", "shop")  # one line, exit 2, in the CLI

            assert await purge_tasks(admin, "shop", 5) == 1  # the operator may
            assert (await admin_store.get("shop")).state == PAUSED, "nobody else wrote it"
            assert (await admin.jetstream().stream_info(TASKS_STREAM)).state.messages == 0
        finally:
            for client in (worker, dispatcher, admin):
                await client.close()


# ---------------------------------------------------------------- running it: the whole mesh


class ComposeMesh:
    """The compose services as local processes: their commands and environments, localized."""

    def __init__(
        self,
        workdir: Path,
        hosts: Mapping[str, str],
        passwords: Mapping[str, str],
        certs: Path,
    ) -> None:
        self._workdir = workdir
        self._hosts = hosts  # compose "host:port" -> local "127.0.0.1:port"
        self._passwords = passwords
        self._certs = certs  # what compose mounts at /certs
        self.services: dict[str, Service] = {}
        self.metrics_ports: dict[str, int] = {}

    def environment(self, compose_service: str) -> dict[str, str]:
        """The container's environment with compose host names mapped to local servers."""
        env = container_environment(compose_service, self._passwords)
        for key, value in env.items():
            for compose_host, local in self._hosts.items():
                value = value.replace(f"//{compose_host}", f"//{local}")
                value = value.replace(f"@{compose_host}", f"@{local}")  # a DSN with a password
            assert not re.search(r"(//|@)(nats|etcd|jaeger|postgres)[:/]", value), (
                f"unmapped: {value}"
            )
            env[key] = localized(value, self._certs)
        return {**env, **TEST_ONLY}

    async def run(self, compose_service: str, name: str) -> Service:
        """A container of ``compose_service``: its command (the image's entrypoint is jetcrawl)."""
        [port] = free_ports(1)  # each container has its own; here they share one host
        self.metrics_ports[name] = port
        env = {**os.environ, **self.environment(compose_service)}
        env["JETCRAWL_METRICS_PORT"] = str(port)
        log_path = self._workdir / f"{name}.log"
        with log_path.open("wb") as log_file:
            proc = await asyncio.create_subprocess_exec(
                *JETCRAWL,
                *SERVICES[compose_service]["command"],
                env=env,
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
            )
        self.services[name] = Service(name, proc, log_path)
        return self.services[name]

    async def exec(self, compose_service: str, *command: str) -> str:
        """``docker compose exec <service> jetcrawl <command>``: its standard output."""
        proc = await asyncio.create_subprocess_exec(
            *JETCRAWL,
            *command,
            env={**os.environ, **self.environment(compose_service)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(30):
            out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        return out.decode()

    async def healthy(self, name: str) -> bool:
        """The image's HEALTHCHECK command, run with the service's metrics port."""
        _, command = DOCKERFILE.healthcheck()
        assert command[0] == "python"
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *command[1:],
            env={**os.environ, "JETCRAWL_METRICS_PORT": str(self.metrics_ports[name])},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        return await proc.wait() == 0

    async def stop(self, grace_s: float) -> dict[str, int]:
        """``docker compose stop``: SIGTERM, SIGKILL after the grace period; the exit codes."""
        running = [s for s in self.services.values() if s.proc.returncode is None]
        for service in running:
            service.signal(signal.SIGTERM)
        for service in running:
            try:
                await service.wait(grace_s)
            except TimeoutError:
                service.signal(signal.SIGKILL)
                await service.proc.wait()
        return {name: s.proc.returncode or 0 for name, s in self.services.items()}


@pytest.fixture
async def compose_etcd(tmp_path: Path, dev_certs: Path) -> AsyncIterator[EtcdServer]:
    """etcd serving its clients as compose's does: TLS, with client certificates required."""
    flags = dict(f.removeprefix("--").split("=", 1) for f in SERVICES["etcd"]["command"][1:])
    tls = EtcdTls(
        Path(localized(flags["cert-file"], dev_certs)),
        Path(localized(flags["key-file"], dev_certs)),
        client_ca=Path(localized(flags["trusted-ca-file"], dev_certs)),
    )
    assert flags["client-cert-auth"] == "true"
    async with EtcdServer(tmp_path / "etcd", tls=tls) as server:
        yield server


@pytest.fixture
async def receiver() -> AsyncIterator[OtlpReceiver]:
    async with OtlpReceiver() as started:
        yield started


def assert_no_violations(server: NatsServer) -> None:
    lines = server.log_path.read_text().splitlines()
    violations = [line for line in lines if "Violation" in line]
    assert not violations, "a service was refused what nats/accounts.conf does not grant:\n" + (
        "\n".join(violations)
    )


def traced_across_services(spans: Sequence[ReceivedSpan]) -> bool:
    """Some trace has spans of both the dispatcher and a worker: a crawl followed across hops."""
    services_by_trace: dict[str, set[str]] = {}
    for span in spans:
        services_by_trace.setdefault(span.trace_id, set()).add(span.service)
    return any({"jetcrawl-dispatcher", "jetcrawl-worker"} <= s for s in services_by_trace.values())


async def test_the_compose_services_crawl_as_local_processes(
    tmp_path: Path,
    passwords: dict[str, str],
    dev_certs: Path,
    compose_etcd: EtcdServer,
    site: MultiHostSite,
    receiver: OtlpReceiver,
) -> None:
    [monitor_port] = free_ports(1)
    async with compose_nats(tmp_path / "nats", monitor_port) as server:
        # compose's health check of nats, against this server's monitoring port
        check = urlsplit(SERVICES["nats"]["healthcheck"]["test"][-1])
        check = check._replace(netloc=f"127.0.0.1:{monitor_port}")
        response = await asyncio.to_thread(urllib.request.urlopen, check.geturl(), timeout=5)
        assert response.status == 200

        hosts = {
            "nats:4222": host_port(server.url),
            "etcd:2379": host_port(compose_etcd.url),
            "jaeger:4318": host_port(receiver.endpoint),
        }
        mesh = ComposeMesh(tmp_path, hosts, passwords, dev_certs)
        settings = Settings.from_env(settings_variables(mesh.environment("worker")))
        admin = await connect_as(server, "admin")
        js = admin.jetstream()

        async def results_at_least(n: int) -> bool:
            assert_no_violations(server)  # a refused call stalls the crawl: say which, at once
            return (await js.stream_info(RESULTS_STREAM)).state.messages >= n

        async def three_balanced_owners() -> bool:
            owners = Counter((await read_ownership(settings)).values())
            return (
                sum(owners.values()) == settings.shards
                and len(owners) == 3
                and max(owners.values()) - min(owners.values()) <= 1
            )

        try:
            topology = await mesh.run("topology", "topology")
            assert await topology.wait(30) == 0, topology.log()
            await mesh.run("dispatcher", "dispatcher")
            await mesh.run("worker", "worker-1")
            for name in ("dispatcher", "worker-1"):

                async def healthy(name: str = name) -> bool:
                    return await mesh.healthy(name)

                await eventually(healthy, within_s=30)

            seeder = await connect_as(server, "seeder")  # as `nats pub crawl.seeds` does
            await seeder.publish(SEEDS, json.dumps({"url": site.seeds[0], "scope": "any"}).encode())
            await seeder.flush()
            await seeder.close()

            await eventually(lambda: results_at_least(5), within_s=30)
            await mesh.run("worker", "worker-2")
            await mesh.run("worker", "worker-3")
            await eventually(three_balanced_owners, within_s=30)
            await eventually(lambda: results_at_least(len(site.reachable)), within_s=60)
            results = [Result.from_wire(m.data) for m in await stored(js, RESULTS_STREAM)]
            assert sorted(r.url for r in results) == sorted(site.reachable)

            try:
                await receiver.wait_for(traced_across_services, within_s=30)
            except TimeoutError:
                seen = Counter((s.service, s.name) for s in receiver.spans)
                pytest.fail(f"no trace across the dispatcher and a worker; spans: {seen}")

            # The README's `docker compose exec dispatcher jetcrawl status`: its rights suffice.
            status = json.loads(
                await mesh.exec("dispatcher", "status", "--interval", "0", "--json")
            )
            assert len(status["workers"]) == 3
            assert status["results"] == len(site.reachable)
        finally:
            codes = await mesh.stop(seconds(SERVICES["worker"]["stop_grace_period"]))
            await admin.close()
        assert codes == dict.fromkeys(mesh.services, 0), "every service stops cleanly on SIGTERM"

    assert_no_violations(server)


async def test_the_renderer_as_compose_runs_it_serves_a_worker_and_nothing_else(
    tmp_path: Path, passwords: dict[str, str], dev_certs: Path, receiver: OtlpReceiver
) -> None:
    require("chromium", "the renderer drives Debian's Chromium")
    async with compose_nats(tmp_path / "nats") as server:
        hosts = {
            "nats:4222": host_port(server.url),
            "jaeger:4318": host_port(receiver.endpoint),
            "etcd:2379": "127.0.0.1:9",  # shared by every service; a renderer never uses etcd
        }
        mesh = ComposeMesh(tmp_path, hosts, passwords, dev_certs)
        renderer = await mesh.run("renderer", "renderer-1")
        errors: asyncio.Queue[str] = asyncio.Queue()
        worker = await connect_as(server, "worker")
        intruder = await connect_as(server, "renderer", errors)
        try:
            client = RenderClient(worker, timeout_s=30.0)

            async def renderer_answers() -> bool:
                assert renderer.proc.returncode is None, renderer.log_path.read_text()
                return await client.answers(timeout_s=1.0)

            await eventually(renderer_answers, within_s=60)  # Chromium starts first
            page = "<html><body><script>document.body.innerHTML = " + (
                "'<a href=\"/after-js\">x</a>'</script></body></html>"
            )
            reply = await client.render("http://127.0.0.1:9/", page, "jetcrawl-test", 0.0, None)
            assert reply.error is None and reply.dom is not None, reply
            assert 'href="/after-js"' in reply.dom, "rendered: the script ran"
            assert_no_violations(server)

            # As the renderer: only the reply to a request it took, only in the queue group.
            await intruder.publish("_INBOX_worker.forged", b"a DOM nobody asked for")
            await refused(errors, 'publish to "_INBOX_worker.forged"')
            await intruder.publish(result_subject(0), b"{}")
            await refused(errors, f'publish to "{result_subject(0)}"')
            await intruder.publish(RENDER_SUBJECT, b"")
            await refused(errors, f'publish to "{RENDER_SUBJECT}"')
            await intruder.subscribe(RENDER_SUBJECT)  # outside the queue group
            await refused(errors, f'subscription to "{RENDER_SUBJECT}"')
            for subject in ("_INBOX_worker.>", "crawl.>"):
                await intruder.subscribe(subject)
                await refused(errors, f'subscription to "{subject}"')
        finally:
            await mesh.stop(grace_s=10)
            for client_nc in (intruder, worker):
                await client_nc.close()


# ---------------------------------------------------------------- the cluster config


@pytest.fixture
def cluster_nodes(tmp_path: Path, passwords: dict[str, str]) -> Iterator[list[NatsServer]]:
    ports = free_ports(3)
    routes = ",".join(f"nats-route://127.0.0.1:{port}" for port in ports)
    yield [
        NatsServer(
            tmp_path / f"n{index}",
            server_name=f"n{index}",
            config=NATS_CONFIG_DIR / "cluster.conf",
            args=["--cluster", f"nats://127.0.0.1:{port}", "--routes", routes, "-m", "-1"],
        )
        for index, port in enumerate(ports, start=1)
    ]


async def test_the_cluster_config_makes_three_nodes_serving_the_same_users_with_r3_streams(
    cluster_nodes: list[NatsServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NATS_SERVER_NAME", "unused")  # the flag names each node
    try:
        await asyncio.gather(*(node.start() for node in cluster_nodes))
        await asyncio.gather(*(node.wait_for_meta_leader() for node in cluster_nodes))
        settings = Settings(nats_url=cluster_nodes[0].url, shards=4, replicas=3)

        async def placed() -> bool:
            try:
                await apply_topology(cluster_nodes[0], settings)
            except TopologyError:
                return False  # no peers to place R3 on yet: nothing logs when they are
            return True

        await eventually(placed, within_s=20)
        seeder = await connect_as(cluster_nodes[1], "seeder")
        await seeder.publish(SEEDS, b"https://example.com/")
        await seeder.flush()  # the server has it; JetStream stores it a moment later
        await seeder.close()
        admin = await connect_as(cluster_nodes[2], "admin")
        info = await read_until(
            lambda: admin.jetstream().stream_info(FRONTIER_STREAM),
            lambda info: info.state.messages == 1,
            within_s=10,
        )
        await admin.close()
        assert info.config.num_replicas == 3
        assert info.cluster is not None and len(info.cluster.replicas or []) == 2
    finally:
        await asyncio.gather(*(node.stop() for node in cluster_nodes))
