"""The Kubernetes manifests (deploy/k8s), rendered and checked offline.

Every overlay is rendered with ``kubectl kustomize`` (kustomize 5) and every object validated
against the Kubernetes JSON schemas (kubernetes-validate, strict: an unknown field fails); KEDA's
ScaledObject is a CRD outside those schemas, so its fields are checked here by hand. Then what
the deployment promises: the restricted Pod Security Standard on every pod, probes on the
services' endpoint, a worker grace period that covers its drain, passwords only from a Secret,
NetworkPolicies that keep the workers off private addresses, replicas and autoscaling, and
settings the code accepts, and TLS: every server takes clients only over TLS from the Secret
jetcrawl-tls, and every pod mounts only the files of it that it needs.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from jetcrawl.cli import build_parser
from jetcrawl.contract.settings import ENV_PREFIX, Settings
from jetcrawl.local.embedded import etcd_binary, nats_server_binary
from tests.support import tools
from tests.support.certs import Certs
from tests.test_deploy import DOCKERFILE, PASSWORD_VARIABLES, SERVICES, compose_environment

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("dev", "prod")
KUBERNETES_VERSION = "1.30.0"
WORKLOADS = ("Deployment", "StatefulSet", "Job")
JETCRAWL_IMAGE = re.compile(r"^(?:[\w.-]+/)*jetcrawl:")
PRIVATE = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "127.0.0.0/8")

Object = dict[str, Any]


@cache
def render(overlay: str) -> tuple[Object, ...]:
    kubectl = tools.require("kubectl", "it renders the kustomize overlays")
    out = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


def find(objects: tuple[Object, ...], kind: str, name: str) -> Object:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def pod_specs(objects: tuple[Object, ...]) -> Iterator[tuple[str, Object]]:
    for o in objects:
        if o["kind"] in WORKLOADS:
            yield f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]["spec"]


def containers(spec: Object) -> list[Object]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def jetcrawl_containers(objects: tuple[Object, ...]) -> Iterator[tuple[str, Object]]:
    for name, spec in pod_specs(objects):
        for container in spec["containers"]:
            if JETCRAWL_IMAGE.match(container["image"]):
                yield name, container


def environment(objects: tuple[Object, ...], container: Object) -> dict[str, str]:
    """A container's literal environment: its ConfigMaps (envFrom), then its own ``value``s."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(find(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
    env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    return env


def port_number(container: Object, port: int | str) -> int:
    if isinstance(port, int):
        return port
    [number] = [p["containerPort"] for p in container["ports"] if p.get("name") == port]
    return int(number)


# ---------------------------------------------------------------- schemas


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_is_valid_against_the_kubernetes_schemas(overlay: str) -> None:
    crds = []
    for o in render(overlay):
        if o["apiVersion"].startswith("keda.sh/"):
            crds.append(o)
            continue
        try:
            kubernetes_validate.validate(o, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{overlay}: {o['kind']}/{o['metadata']['name']}: {e.message}")
    assert [o["kind"] for o in crds] == (["ScaledObject"] if overlay == "prod" else [])


def test_the_keda_scaled_object_has_what_keda_requires() -> None:
    objects = render("prod")
    scaled = find(objects, "ScaledObject", "worker")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["metadata"]["namespace"] == "jetcrawl"
    spec = scaled["spec"]
    assert set(spec) <= {
        "scaleTargetRef",
        "minReplicaCount",
        "maxReplicaCount",
        "pollingInterval",
        "cooldownPeriod",
        "idleReplicaCount",
        "initialCooldownPeriod",
        "fallback",
        "advanced",
        "triggers",
    }
    target = spec["scaleTargetRef"]
    assert target.get("kind", "Deployment") == "Deployment" and target["name"] == "worker"
    find(objects, "Deployment", target["name"])  # it scales what exists
    assert 2 <= spec["minReplicaCount"] < spec["maxReplicaCount"]
    assert spec["maxReplicaCount"] <= Settings.from_env(jetcrawl_env(objects)).shards
    for key in ("pollingInterval", "cooldownPeriod"):
        assert isinstance(spec[key], int) and spec[key] > 0, key
    assert spec["triggers"], "at least one trigger"
    for trigger in spec["triggers"]:
        assert trigger["type"] == "prometheus"
        metadata = trigger["metadata"]
        assert {"serverAddress", "query", "threshold"} <= set(metadata)
        assert re.fullmatch(r"https?://[\w.-]+(:\d+)?/?", metadata["serverAddress"])
        for key in ("threshold", "activationThreshold"):
            if key in metadata:  # KEDA's metadata is a map of strings
                assert isinstance(metadata[key], str) and float(metadata[key]) > 0, key
    down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 60}]


# ---------------------------------------------------------------- pods


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_meets_the_restricted_pod_security_standard(overlay: str) -> None:
    objects = render(overlay)
    namespace = find(objects, "Namespace", "jetcrawl")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pods = list(pod_specs(objects))
    assert len(pods) == 5, "nats, etcd, topology, dispatcher, worker"
    for name, spec in pods:
        pod = spec.get("securityContext", {})
        assert not {"hostNetwork", "hostPID", "hostIPC"} & set(spec), name
        mounts: dict[str, Object] = {v["name"]: v for v in spec.get("volumes", [])}
        assert not any("hostPath" in v for v in mounts.values()), name
        for c in containers(spec):
            where = f"{overlay}: {name}: {c['name']}"
            context = {**pod, **c.get("securityContext", {})}  # the container's wins
            assert context.get("runAsNonRoot") is True, where
            assert context.get("runAsUser", 1) != 0, where
            assert context.get("seccompProfile") == {"type": "RuntimeDefault"}, where
            assert context.get("allowPrivilegeEscalation") is False, where
            assert context.get("readOnlyRootFilesystem") is True, where
            assert context.get("capabilities") == {"drop": ["ALL"]}, where
            assert not c.get("securityContext", {}).get("privileged"), where
            [tmp] = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
            assert "emptyDir" in mounts[tmp["name"]], f"{where}: /tmp is an emptyDir"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_requests_within_limits(overlay: str) -> None:
    def quantity(value: str | int) -> float:
        units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
        match = re.fullmatch(r"([\d.]+)(m|Ki|Mi|Gi)?", str(value))
        assert match, value
        return float(match.group(1)) * units.get(match.group(2) or "", 1)

    for name, spec in pod_specs(render(overlay)):
        for c in containers(spec):
            resources = c["resources"]
            for resource in ("cpu", "memory"):
                request = quantity(resources["requests"][resource])
                assert 0 < request <= quantity(resources["limits"][resource]), (name, resource)
    # The capacity plan (bench/RESULTS.md): a busy worker is a core, a dispatcher core serves
    # about six workers, a nats-server core about four.
    objects = render(overlay)
    worker = find(objects, "Deployment", "worker")["spec"]["template"]["spec"]["containers"][0]
    assert quantity(worker["resources"]["requests"]["cpu"]) == 1
    nats = find(objects, "StatefulSet", "nats")
    nats_cpu = quantity(
        nats["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]
    )
    assert max_workers(objects) <= 4 * nats_cpu * nats["spec"]["replicas"]


def max_workers(objects: tuple[Object, ...]) -> int:
    for o in objects:
        if o["kind"] == "HorizontalPodAutoscaler":
            return int(o["spec"]["maxReplicas"])
        if o["kind"] == "ScaledObject":
            return int(o["spec"]["maxReplicaCount"])
    raise AssertionError("no autoscaler for the workers")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_are_probed_on_their_endpoint(overlay: str) -> None:
    objects = render(overlay)
    port = int(DOCKERFILE.env()["JETCRAWL_METRICS_PORT"])
    probed = set()
    for name, c in jetcrawl_containers(objects):
        settings = Settings.from_env(
            {k: v for k, v in environment(objects, c).items() if k.startswith(ENV_PREFIX)}
        )
        if c["args"][0] == "topology":
            assert settings.metrics_port == 0 and "readinessProbe" not in c, name
            continue
        assert settings.metrics_port == port, name
        assert port_number(c, "metrics") == port
        for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
            get = c[probe]["httpGet"]
            assert get["path"] == path and port_number(c, get["port"]) == port, (name, probe)
            assert c[probe]["timeoutSeconds"] < c[probe]["periodSeconds"], (name, probe)
        template = next(
            o["spec"]["template"] for o in objects if f"{o['kind']}/{o['metadata']['name']}" == name
        )
        assert template["metadata"]["annotations"]["prometheus.io/port"] == str(port)
        probed.add(c["args"][0])
    assert probed == {"dispatcher", "worker"}


def test_the_worker_grace_period_covers_its_pre_stop_and_its_drain() -> None:
    objects = render("prod")
    spec = find(objects, "Deployment", "worker")["spec"]["template"]["spec"]
    [c] = spec["containers"]
    drain = Settings.from_env(
        {k: v for k, v in environment(objects, c).items() if k.startswith(ENV_PREFIX)}
    ).drain_deadline_s
    assert drain == Settings().drain_deadline_s == 20
    command = c["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop = float(command[1])
    margin = 10  # closing connections and revoking the lease after the drain
    assert spec["terminationGracePeriodSeconds"] >= pre_stop + drain + margin


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_replicas_and_cluster_membership_are_as_specified(overlay: str) -> None:
    objects = render(overlay)
    nats = find(objects, "StatefulSet", "nats")
    etcd = find(objects, "StatefulSet", "etcd")
    assert nats["spec"]["replicas"] == 3 and etcd["spec"]["replicas"] == 3
    assert find(objects, "Deployment", "dispatcher")["spec"]["replicas"] == 2
    assert "replicas" not in find(objects, "Deployment", "worker")["spec"], "the autoscaler's"
    assert find(objects, "Job", "topology")["spec"]["template"]["spec"]["restartPolicy"] in (
        "OnFailure",
        "Never",
    )
    for stateful in (nats, etcd):
        service = find(objects, "Service", stateful["spec"]["serviceName"])
        assert service["spec"]["clusterIP"] == "None", "headless: a DNS name per pod"
        assert service["spec"]["publishNotReadyAddresses"] is True
    # etcd's initial cluster and NATS's routes are the pods' DNS names, one per replica.
    [etcd_c] = etcd["spec"]["template"]["spec"]["containers"]
    flags = dict(f.removeprefix("--").split("=", 1) for f in etcd_c["command"][1:])
    assert flags["initial-cluster"] == ",".join(
        f"etcd-{i}=http://etcd-{i}.etcd:2380" for i in range(3)
    )
    assert flags["name"] == "$(POD_NAME)"
    assert flags["initial-advertise-peer-urls"] == "http://$(POD_NAME).etcd:2380"
    nats_c = nats["spec"]["template"]["spec"]["containers"][0]
    nats_flags = dict(a.removeprefix("--").split("=", 1) for a in nats_c["args"])
    assert nats_flags["config"] == "/etc/nats/cluster.conf"
    assert nats_flags["routes"].split(",") == [f"nats-route://nats-{i}.nats:6222" for i in range(3)]
    config = find(
        objects, "ConfigMap", nats["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]
    )
    for file in ("accounts.conf", "cluster.conf", "common.conf"):
        assert config["data"][file] == (ROOT / "nats" / file).read_text(), file
    assert "$NATS_SERVER_NAME" in config["data"]["cluster.conf"]
    env_names = {e["name"] for e in nats_c["env"]}
    assert {"NATS_SERVER_NAME", *PASSWORD_VARIABLES} <= env_names
    # Autoscaling: an HPA in dev, KEDA in prod, both on the worker Deployment.
    kinds = {o["kind"] for o in objects}
    assert ("HorizontalPodAutoscaler" in kinds) == (overlay == "dev")
    assert ("ScaledObject" in kinds) == (overlay == "prod")
    if overlay == "dev":
        hpa = find(objects, "HorizontalPodAutoscaler", "worker")["spec"]
        assert hpa["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": "worker",
        }
        assert 2 <= hpa["minReplicas"] < hpa["maxReplicas"]
        assert hpa["behavior"]["scaleDown"]["policies"][0] == {
            "type": "Pods",
            "value": 1,
            "periodSeconds": 60,
        }


# ---------------------------------------------------------------- settings and secrets


def jetcrawl_env(objects: tuple[Object, ...]) -> dict[str, str]:
    [config] = [
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("jetcrawl-env")
    ]
    return dict(config["data"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_commands_and_settings_are_what_the_code_accepts(overlay: str) -> None:
    objects = render(overlay)
    parser = build_parser()
    commands = {}
    for name, c in jetcrawl_containers(objects):
        parser.parse_args(c["args"])  # exits (fails) on an unknown command or flag
        commands[c["args"][0]] = c
        env = environment(objects, c)
        assert set(env) <= {k for k in env if k.startswith(ENV_PREFIX)}, name
        settings = Settings.from_env(env)  # an unknown JETCRAWL_* raises
        assert settings.replicas == 3, f"{name}: R3 streams on a 3-node cluster"
        user = {"topology": "admin"}.get(c["args"][0], c["args"][0])
        assert settings.nats_user == user, name
    assert set(commands) == {"topology", "dispatcher", "worker"}
    assert parser.parse_args(commands["topology"]["args"]).apply
    # The topology everybody checks is the one the Job creates, with compose's shard count.
    shared = jetcrawl_env(objects)
    assert shared["JETCRAWL_SHARDS"] == compose_environment("worker", {})["JETCRAWL_SHARDS"]
    assert Settings.from_env(shared).create_topology is False


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_passwords_come_only_from_the_secret(overlay: str) -> None:
    objects = render(overlay)
    referenced: set[str] = set()
    for name, spec in pod_specs(objects):
        for c in containers(spec):
            for e in c.get("env", []):
                if re.search("PASSWORD|SECRET|TOKEN", e["name"]):
                    assert "value" not in e, f"{name}: {e['name']} in plain text"
                    ref = e["valueFrom"]["secretKeyRef"]
                    assert ref["name"].startswith("nats-passwords"), name
                    referenced.add(ref["key"])
            for source in c.get("envFrom", []):
                assert "secretRef" not in source
    assert referenced == set(PASSWORD_VARIABLES)
    for o in objects:
        if o["kind"] == "ConfigMap":
            for key, text in o["data"].items():  # nats/accounts.conf: `password: $NATS_...`
                found = re.search(r"password\s*[:=]\s*([^\s$]\S*)", text, re.I)
                assert not found, f"{o['metadata']['name']}: {key}: {found and found.group(0)}"
    secrets_ = [o for o in objects if o["kind"] == "Secret"]
    if overlay == "prod":
        assert secrets_ == [], "prod uses the Secret created beforehand, never one from git"
    else:
        [secret] = secrets_
        assert set(secret["data"]) == set(PASSWORD_VARIABLES)
        generator = yaml.safe_load((K8S / "overlays/dev/kustomization.yaml").read_text())
        [envs] = [g["envs"] for g in generator["secretGenerator"]]
        assert all(e.endswith(".dev-only.env") for e in envs), "marked dev-only"


def test_no_manifest_holds_a_password_except_the_dev_only_file() -> None:
    dev_values = {
        line.split("=", 1)[1]
        for line in (K8S / "overlays/dev/nats-passwords.dev-only.env").read_text().splitlines()
        if "=" in line
    }
    assert dev_values
    files = [p for p in K8S.rglob("*") if p.is_file() and not p.name.endswith(".dev-only.env")]
    assert len(files) > 8
    for path in files:
        text = path.read_text()
        for value in dev_values:
            assert value not in text, f"{path.relative_to(ROOT)} holds a password"
    assert not [o for o in render("prod") if o["kind"] == "Secret"]


# ---------------------------------------------------------------- network policies


def selects(selector: Object, labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def egress_allowed(
    objects: tuple[Object, ...], labels: dict[str, str], to: dict[str, str] | str, port: int
) -> bool:
    """Whether the pods labelled ``labels`` may open ``port`` on a pod labelled ``to`` (same
    namespace) or on the address ``to``, by the NetworkPolicies (deny unless one allows)."""
    for policy in (o for o in objects if o["kind"] == "NetworkPolicy"):
        spec = policy["spec"]
        if "Egress" not in spec["policyTypes"] or not selects(spec["podSelector"], labels):
            continue
        for rule in spec.get("egress", []):
            ports = [p["port"] for p in rule.get("ports", [])]
            if ports and port not in ports:
                continue
            peers = rule.get("to")
            if not peers or any(admits(peer, to) for peer in peers):
                return True  # a rule without `to` allows every destination
    return False


def admits(peer: Object, to: dict[str, str] | str) -> bool:
    """Whether one ``to`` entry of an egress rule covers the pod labels or the address ``to``."""
    if isinstance(to, dict):
        return set(peer) == {"podSelector"} and selects(peer["podSelector"], to)
    if "ipBlock" not in peer:
        return False
    address = ipaddress.ip_address(to)
    block = peer["ipBlock"]
    network = ipaddress.ip_network(block["cidr"])
    if address.version != network.version or address not in network:
        return False
    return not any(address in ipaddress.ip_network(e) for e in block.get("except", []))


def name(value: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": value, "app.kubernetes.io/part-of": "jetcrawl"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_let_the_services_reach_their_servers_and_workers_only_the_web(
    overlay: str,
) -> None:
    objects = render(overlay)
    deny = find(objects, "NetworkPolicy", "default-deny")["spec"]
    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny and "egress" not in deny
    worker, dispatcher, topology = (
        name("jetcrawl-worker"),
        name("jetcrawl-dispatcher"),
        name("jetcrawl-topology"),
    )
    nats, etcd = name("nats"), name("etcd")
    for client in (worker, dispatcher, topology):
        assert egress_allowed(objects, client, nats, 4222), client
    assert egress_allowed(objects, worker, etcd, 2379)
    assert not egress_allowed(objects, dispatcher, etcd, 2379), "the dispatcher needs no etcd"
    assert egress_allowed(objects, nats, nats, 6222) and egress_allowed(objects, etcd, etcd, 2380)
    # The workers reach the web on 80 and 443, and no private, loopback or link-local address.
    for port in (80, 443):
        assert egress_allowed(objects, worker, "93.184.215.14", port)
        assert egress_allowed(objects, worker, "2606:2800:21f:cb07:6820:80da:af6b:8b2c", port)
        for cidr in PRIVATE:
            for address in ipaddress.ip_network(cidr)[1], ipaddress.ip_network(cidr)[-2]:
                assert not egress_allowed(objects, worker, str(address), port), address
        for address in ("169.254.169.254", "fd00::1", "fe80::1", "::1"):
            assert not egress_allowed(objects, worker, address, port), address
    assert not egress_allowed(objects, worker, "93.184.215.14", 22)
    for other in (dispatcher, topology, nats, etcd):
        assert not egress_allowed(objects, other, "93.184.215.14", 443), other
    # DNS for every pod.
    dns = find(objects, "NetworkPolicy", "dns")["spec"]
    assert dns["podSelector"] == {}
    assert {(p["protocol"], p["port"]) for p in dns["egress"][0]["ports"]} == {
        ("UDP", 53),
        ("TCP", 53),
    }


# ---------------------------------------------------------------- the servers' own flags


def test_the_servers_run_compose_images_with_flags_they_know(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, certs: Certs
) -> None:
    """nats-server and etcd are the ones tests/test_deploy.py checks against the local
    binaries (same images as compose); here those binaries take the manifests' own flags."""
    objects = render("prod")
    images = {
        c["name"]: c["image"]
        for _, spec in pod_specs(objects)
        for c in spec["containers"]
        if not JETCRAWL_IMAGE.match(c["image"])
    }
    assert images == {
        "nats": SERVICES["nats"]["image"],
        "exporter": SERVICES["nats-exporter"]["image"],
        "etcd": SERVICES["etcd"]["image"],
    }
    # nats-server: the StatefulSet's arguments, its config from nats/, a password per user.
    nats = find(objects, "StatefulSet", "nats")["spec"]["template"]["spec"]["containers"][0]
    monkeypatch.setenv("NATS_SERVER_NAME", "nats-0")
    for variable in PASSWORD_VARIABLES:
        monkeypatch.setenv(variable, f"p{secrets.token_hex(8)}")
    monkeypatch.setenv("NATS_TLS_CERT_FILE", str(certs.server_cert))  # mounted from jetcrawl-tls
    monkeypatch.setenv("NATS_TLS_KEY_FILE", str(certs.server_key))
    args = [
        a.replace("/etc/nats/", f"{ROOT / 'nats'}/").replace("/data/", f"{tmp_path}/")
        for a in nats["args"]
    ]
    out = subprocess.run(
        [nats_server_binary(), *args, "-t"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0 and " is valid " in out.stderr, out.stdout + out.stderr
    bad = subprocess.run(
        [nats_server_binary(), *args, "--routez=x", "-t"], capture_output=True, text=True
    )
    assert " is valid " not in bad.stderr, "an unknown flag prints the usage (and exits 0)"
    [pre_stop] = [nats["lifecycle"]["preStop"]["exec"]["command"]]
    assert pre_stop[:2] == ["nats-server", "--signal"]
    signal = subprocess.run(  # the syntax is nats-server's: only the process is missing here
        [nats_server_binary(), "--signal", pre_stop[2].replace("=1", "=999999")],
        capture_output=True,
        text=True,
    )
    assert "no such process" in signal.stderr, signal.stderr
    # etcd: every flag of the StatefulSet's command is in etcd's help.
    etcd = find(objects, "StatefulSet", "etcd")["spec"]["template"]["spec"]["containers"][0]
    help_ = subprocess.run([etcd_binary(), "--help"], capture_output=True, text=True)
    for flag in etcd["command"][1:]:
        assert f"\n  {flag.split('=')[0]} " in help_.stdout + help_.stderr, flag


# ---------------------------------------------------------------- TLS

TLS_SECRET = "jetcrawl-tls"


def tls_files(spec: Object, container: Object) -> dict[str, str]:
    """The files of the Secret jetcrawl-tls this container sees: path -> the Secret's key."""
    volumes = {v["name"]: v["secret"] for v in spec["volumes"] if "secret" in v}
    files: dict[str, str] = {}
    for mount in container.get("volumeMounts", []):
        secret = volumes.get(mount["name"])
        if secret is None or secret["secretName"] != TLS_SECRET:
            continue
        assert mount.get("readOnly") is True and secret["defaultMode"] == 0o440, mount
        for item in secret["items"]:
            files[f"{mount['mountPath']}/{item['path']}"] = item["key"]
    return files


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_server_and_service_talks_tls_with_only_the_files_it_needs(overlay: str) -> None:
    objects = render(overlay)
    specs = dict(pod_specs(objects))
    # nats-server: nats/common.conf's tls block reads its certificate from these variables.
    nats_spec = specs["StatefulSet/nats"]
    [nats] = [c for c in nats_spec["containers"] if c["name"] == "nats"]
    nats_env = {e["name"]: e.get("value") for e in nats["env"]}
    files = tls_files(nats_spec, nats)
    assert set(files.values()) == {"nats.pem", "nats.key"}
    assert files[nats_env["NATS_TLS_CERT_FILE"]] == "nats.pem"
    assert files[nats_env["NATS_TLS_KEY_FILE"]] == "nats.key"
    [config] = [v["configMap"]["name"] for v in nats_spec["volumes"] if "configMap" in v]
    assert "$NATS_TLS_CERT_FILE" in find(objects, "ConfigMap", config)["data"]["common.conf"]
    # etcd: clients over TLS with a client certificate; metrics and probes on a plain port.
    etcd_spec = specs["StatefulSet/etcd"]
    [etcd] = etcd_spec["containers"]
    flags = dict(f.removeprefix("--").split("=", 1) for f in etcd["command"][1:])
    files = tls_files(etcd_spec, etcd)
    assert set(files.values()) == {"ca.pem", "etcd.pem", "etcd.key"}
    assert flags["listen-client-urls"].startswith("https://")
    assert flags["advertise-client-urls"].startswith("https://")
    assert files[flags["cert-file"]] == "etcd.pem" and files[flags["key-file"]] == "etcd.key"
    assert files[flags["trusted-ca-file"]] == "ca.pem" and flags["client-cert-auth"] == "true"
    metrics_port = urlsplit(flags["listen-metrics-urls"]).port
    assert port_number(etcd, "metrics") == metrics_port
    for probe in ("readinessProbe", "livenessProbe"):
        assert port_number(etcd, etcd[probe]["httpGet"]["port"]) == metrics_port
    template = find(objects, "StatefulSet", "etcd")["spec"]["template"]
    assert template["metadata"]["annotations"]["prometheus.io/port"] == str(metrics_port)
    # jetcrawl: the CA of both servers, every etcd member listed (failover), and a client
    # certificate for the workers only (the dispatcher and the topology Job never use etcd).
    replicas = find(objects, "StatefulSet", "etcd")["spec"]["replicas"]
    for name, container in jetcrawl_containers(objects):
        env = environment(objects, container)
        settings = Settings.from_env({k: v for k, v in env.items() if k.startswith(ENV_PREFIX)})
        files = tls_files(specs[name], container)
        assert files[settings.nats_tls_ca_file] == "ca.pem", name
        endpoints = settings.etcd_url.split(",")
        assert len(endpoints) == replicas and all(e.startswith("https://") for e in endpoints)
        if name == "Deployment/worker":
            assert files[settings.etcd_tls_ca_file] == "ca.pem"
            assert files[settings.etcd_tls_cert_file] == "client.pem"
            assert files[settings.etcd_tls_key_file] == "client.key"
        else:
            assert set(files.values()) == {"ca.pem"}, name
