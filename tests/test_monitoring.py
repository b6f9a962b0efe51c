"""The monitoring files (deploy/monitoring): Prometheus configs, alert rules, Grafana dashboard.

- promtool checks both Prometheus configs and the rules, and runs the rules' unit tests
  (tests/promtool/: every alert fires on the series that mean trouble; skipped where promtool is
  missing);
- every metric an alert, a dashboard panel or the KEDA trigger asks for is one a real dispatcher
  and a real worker export: both are started against real nats-server and etcd, crawl a little
  (one page that fails), and their ``/metrics`` are scraped; label names are checked too;
- compose runs Prometheus and Grafana like its other services (pinned images, ports on
  127.0.0.1, the files mounted read-only), and finds the services it scrapes by their names;
- the Kubernetes base carries the same files (no second copy) as ConfigMaps.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from jetcrawl.local.embedded import EtcdServer, NatsServer
from tests.support import tools
from tests.support.mesh import Mesh
from tests.support.scrape import free_port, probe
from tests.support.site import MultiHostSite
from tests.support.streams import eventually
from tests.test_deploy import SERVICES
from tests.test_k8s import find, render

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "deploy" / "monitoring"
PROMETHEUS_COMPOSE = MONITORING / "prometheus.yml"
PROMETHEUS_K8S = MONITORING / "prometheus-k8s.yml"
RULES = MONITORING / "rules" / "jetcrawl.rules.yml"
RULES_TEST = ROOT / "tests" / "promtool" / "jetcrawl.rules.test.yml"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "jetcrawl.json"
PROVISIONING = MONITORING / "grafana" / "provisioning"
JOBS = {"jetcrawl-dispatcher", "jetcrawl-worker", "nats", "etcd"}
TARGET_LABELS = {"job", "instance", "pod"}  # what Prometheus adds to every sample
# Series from elsewhere: Prometheus's `up` per target, and the one prometheus-nats-exporter
# series the NATS alert reads (named in that exporter's own tests; no exporter runs here).
OTHER_SERIES = {"up", "gnatsd_varz_connections"}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    tool = tools.require("promtool", "Debian package prometheus")
    return subprocess.run([tool, *map(str, args)], capture_output=True, text=True, check=False)


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


# ---------------------------------------------------------------- promtool


def test_promtool_accepts_the_compose_config_and_its_rules() -> None:
    out = promtool("check", "config", PROMETHEUS_COMPOSE)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 rule files found" in out.stdout, "rules/*.yml beside the config"
    out = promtool("check", "rules", RULES)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_fires_on_trouble_and_not_on_a_healthy_crawl() -> None:
    """promtool's unit tests of the rules (tests/promtool/): series in, alerts out."""
    out = promtool("test", "rules", RULES_TEST)
    assert out.returncode == 0, out.stdout + out.stderr
    alerts = {r["alert"] for g in load(RULES)["groups"] for r in g["rules"]}
    fired = {
        case["alertname"]
        for test in load(RULES_TEST)["tests"]
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert fired == alerts, f"alerts without a case that fires them: {alerts - fired}"


def test_promtool_accepts_the_kubernetes_config(tmp_path: Path) -> None:
    config = load(PROMETHEUS_K8S)
    [job] = config["scrape_configs"]
    [sd] = job["kubernetes_sd_configs"]
    assert sd == {"role": "pod", "namespaces": {"names": ["jetcrawl"]}}
    (tmp_path / "rules").mkdir()
    shutil.copy(RULES, tmp_path / "rules")
    checked = tmp_path / "prometheus.yml"
    shutil.copy(PROMETHEUS_K8S, checked)
    out = promtool("check", "config", checked)
    if "field kubernetes_sd_configs not found" in out.stderr:
        # Debian's promtool is built without Kubernetes discovery: check everything else (the
        # relabelling, the rule files) with the discovery swapped for a static target.
        del job["kubernetes_sd_configs"]
        job["static_configs"] = [{"targets": ["pod:9464"]}]
        checked.write_text(yaml.safe_dump(config))
        out = promtool("check", "config", checked)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 rule files found" in out.stdout


def test_kubernetes_relabelling_names_jobs_as_the_compose_config_does() -> None:
    [job] = load(PROMETHEUS_K8S)["scrape_configs"]
    meta = {
        "__address__": "10.1.2.3:4222",
        "__meta_kubernetes_pod_annotation_prometheus_io_scrape": "true",
        "__meta_kubernetes_pod_annotation_prometheus_io_port": "9464",
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": "jetcrawl-worker",
        "__meta_kubernetes_pod_name": "worker-abc",
    }
    labels = relabel(job["relabel_configs"], meta)
    assert labels is not None
    assert labels["__address__"] == "10.1.2.3:9464"
    assert labels["job"] == "jetcrawl-worker" and labels["pod"] == "worker-abc"
    unannotated = {**meta, "__meta_kubernetes_pod_annotation_prometheus_io_scrape": ""}
    assert relabel(job["relabel_configs"], unannotated) is None
    compose_jobs = {j["job_name"] for j in load(PROMETHEUS_COMPOSE)["scrape_configs"]}
    assert compose_jobs >= JOBS
    # Every pod the manifests annotate is named after a job the rules and dashboard know.
    for o in render("prod"):
        if o["kind"] in ("Deployment", "StatefulSet"):
            template = o["spec"]["template"]
            if template["metadata"].get("annotations", {}).get("prometheus.io/scrape") == "true":
                assert template["metadata"]["labels"]["app.kubernetes.io/name"] in JOBS


def relabel(configs: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, str] | None:
    """Prometheus's relabelling for the actions used here (replace, keep)."""
    labels = dict(labels)
    for c in configs:
        value = c.get("separator", ";").join(labels.get(s, "") for s in c["source_labels"])
        match = re.fullmatch(c.get("regex", "(.*)"), value)
        if c.get("action", "replace") == "keep":
            if match is None:
                return None
        elif match is not None:
            labels[c["target_label"]] = match.expand(c.get("replacement", "$1").replace("$", "\\"))
    return labels


# ---------------------------------------------------------------- metric names


def expressions() -> dict[str, str]:
    """Every PromQL expression of the rules, the dashboard and the KEDA triggers, by where."""
    found = {}
    for group in load(RULES)["groups"]:
        for rule in group["rules"]:
            found[f"alert {rule['alert']}"] = rule["expr"]
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            found[f"panel {panel['title']!r} {target['refId']}"] = target["expr"]
    scaled = find(render("prod"), "ScaledObject", "worker")
    for i, trigger in enumerate(scaled["spec"]["triggers"]):
        found[f"keda trigger {i}"] = trigger["metadata"]["query"]
    return found


def used_names(expr: str) -> set[str]:
    names = set(re.findall(r"\b(jetcrawl_\w+)", expr))
    others = set(re.findall(r"\b([a-zA-Z_:][\w:]*)\s*[{\[]", expr)) - names
    others |= {n for n in OTHER_SERIES if re.search(rf"\b{n}\b", expr)}
    assert others <= OTHER_SERIES, f"not a jetcrawl metric: {others - OTHER_SERIES}"
    return names | others


def used_labels(expr: str) -> set[str]:
    grouped = re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr)
    matched = re.findall(r"[{,]\s*(\w+)\s*[=!]~?\s*\"", expr)
    return {label.strip() for g in grouped for label in g.split(",") if label.strip()} | set(
        matched
    )


async def exported(port: int) -> tuple[set[str], dict[str, set[str]]]:
    """The sample names a /metrics can hold (each family's, by its type, whether or not a
    labelled one has samples yet), and the label names seen per sample name."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        text = await response.text()
    names: set[str] = set()
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return names, labels


async def test_every_metric_in_rules_dashboard_and_keda_is_one_the_services_export(
    nats_server: NatsServer, etcd_server: EtcdServer, tmp_path: Path, site: MultiHostSite
) -> None:
    ports = {"dispatcher": free_port(), "worker": free_port()}
    async with Mesh(nats_server.url, etcd_server.url, tmp_path) as mesh:
        for role, port in ports.items():
            await mesh.start(role, role, JETCRAWL_METRICS_PORT=str(port))
        for port in ports.values():
            await eventually(partial(ready, port), within_s=20)
        blocked = "http://10.255.255.1/"  # a private address: a fetch failure, for {kind}
        await mesh.seed([*site.seeds[:1], blocked])

        async def failed() -> bool:
            _, seen = await exported(ports["worker"])
            return "jetcrawl_fetch_failures_total" in seen

        await eventually(failed, within_s=30)
        await mesh.wait_results(2)
        scraped = [await exported(port) for port in ports.values()]
    names = set().union(*(n for n, _ in scraped))
    labels: dict[str, set[str]] = {}
    for _, seen in scraped:
        for name, keys in seen.items():
            labels.setdefault(name, set()).update(keys)
    assert "jetcrawl_fetch_failures_total" in labels, "the crawl had a failure"

    found = expressions()
    assert len(found) > 20
    for where, expr in found.items():
        used = used_names(expr)
        assert used, f"{where}: no jetcrawl metric in {expr!r}"
        assert used - OTHER_SERIES <= names, f"{where}: not exported: {used - names - OTHER_SERIES}"
        known = TARGET_LABELS.union(*(labels.get(n, set()) for n in used))
        if any(n.endswith("_bucket") for n in used):
            known.add("le")
        assert used_labels(expr) <= known, f"{where}: unknown labels {used_labels(expr) - known}"


def test_a_misspelt_metric_or_label_is_caught() -> None:
    with pytest.raises(AssertionError):
        used_names('rate(node_cpu_seconds_total{mode="idle"}[5m])')
    assert used_names("sum(rate(jetcrawl_pagez_total[5m]))") == {"jetcrawl_pagez_total"}
    assert used_names('up{job="nats"} == 0') == {"up"}
    assert used_labels('sum by (kind, job) (x{outcome="fetched"})') == {"kind", "job", "outcome"}


async def ready(port: int) -> bool:
    try:
        status, _ = await probe(port, "/readyz")
    except aiohttp.ClientConnectionError:
        return False
    return status == 200


# ---------------------------------------------------------------- the files


def test_alert_rules_cover_what_the_issue_asks_with_severities_and_summaries() -> None:
    rules = {r["alert"]: r for g in load(RULES)["groups"] for r in g["rules"]}
    assert {
        "JetcrawlNoProgress",
        "JetcrawlDeadLettersGrowing",
        "JetcrawlFrontierBacklogGrowing",
        "JetcrawlWorkersSaturated",
        "JetcrawlShardsUnowned",
        "JetcrawlTooFewWorkers",
        "NatsUnreachable",
        "EtcdUnreachable",
    } <= set(rules)
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"], name
        assert re.fullmatch(r"\d+m", rule["for"]), name
    for job in ("nats", "etcd"):
        assert f'up{{job="{job}"}}' in rules[f"{job.capitalize()}Unreachable"]["expr"]


def test_the_dashboard_shows_what_the_issue_asks() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "jetcrawl"
    [variable] = dashboard["templating"]["list"]
    assert variable["type"] == "datasource" and variable["query"] == "prometheus"
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for wanted in (
        "rate(jetcrawl_pages_total",
        "jetcrawl_frontier_backlog",
        "jetcrawl_fetch_duration_seconds_bucket",
        "sum by (kind) (rate(jetcrawl_fetch_failures_total",
        "jetcrawl_politeness_wait_seconds_bucket",
        "jetcrawl_dead_letters_total",
        "jetcrawl_handbacks_due",
    ):
        assert wanted in exprs, wanted
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
    [heatmap] = [p for p in dashboard["panels"] if p["type"] == "heatmap"]
    assert all(t["format"] == "heatmap" for t in heatmap["targets"])


def test_compose_runs_prometheus_and_grafana_like_its_other_services() -> None:
    for name in ("prometheus", "grafana", "nats-exporter"):
        service = SERVICES[name]
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", service["image"]), "a pinned release"
        assert service["restart"] == "unless-stopped"
        for mapping in service.get("ports", []):
            assert str(mapping).startswith("127.0.0.1:"), f"{name}: {mapping}"
        for volume in service.get("volumes", []):
            source, target, *mode = volume.split(":")
            if source.startswith("./"):
                assert mode == ["ro"], f"{name}: {volume} read-only"
                assert (ROOT / source).exists(), source
                assert (ROOT / source).resolve().is_relative_to(MONITORING), "one copy"
    assert SERVICES["prometheus"]["ports"] == ["127.0.0.1:9090:9090"]
    assert SERVICES["grafana"]["ports"] == ["127.0.0.1:3000:3000"]
    # Prometheus reads the config and rules compose mounts, and scrapes compose's services.
    flags = dict(f.removeprefix("--").split("=", 1) for f in SERVICES["prometheus"]["command"])
    mounts = {v.split(":")[1]: v.split(":")[0] for v in SERVICES["prometheus"]["volumes"]}
    assert mounts[flags["config.file"]] == "./deploy/monitoring/prometheus.yml"
    assert mounts["/etc/prometheus/rules"] == "./deploy/monitoring/rules"
    for job in load(PROMETHEUS_COMPOSE)["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            for service in sd["names"]:
                assert str(sd["port"]) in SERVICES[service]["expose"], job["job_name"]
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, port = target.split(":")
                if host != "localhost":
                    assert port in SERVICES[host].get("expose", []) or f":{port}" in str(
                        SERVICES[host].get("command")
                    ), target
    # Grafana: the data source is that Prometheus, the dashboards the mounted directory.
    grafana = {v.split(":")[1]: v.split(":")[0] for v in SERVICES["grafana"]["volumes"]}
    assert grafana["/etc/grafana/provisioning"] == "./deploy/monitoring/grafana/provisioning"
    [source] = load(PROVISIONING / "datasources" / "prometheus.yml")["datasources"]
    assert source["url"] == "http://prometheus:9090" and source["type"] == "prometheus"
    [provider] = load(PROVISIONING / "dashboards" / "jetcrawl.yml")["providers"]
    assert grafana[provider["options"]["path"]] == "./deploy/monitoring/grafana/dashboards"


def test_the_kubernetes_base_carries_the_same_files() -> None:
    objects = render("prod")

    def config_map(prefix: str) -> dict[str, str]:
        [found] = [
            o["data"]
            for o in objects
            if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith(prefix + "-")
        ]
        return dict(found)

    prometheus = config_map("jetcrawl-prometheus")
    assert prometheus == {
        "prometheus.yml": PROMETHEUS_K8S.read_text(),
        "jetcrawl.rules.yml": RULES.read_text(),
    }
    assert config_map("jetcrawl-grafana-dashboards") == {"jetcrawl.json": DASHBOARD.read_text()}
    copies = [p for p in ROOT.joinpath("deploy").rglob("*") if p.name in ("jetcrawl.json",)]
    assert copies == [DASHBOARD], "one copy of each file"
