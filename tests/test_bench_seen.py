"""The seen-set and soak benches (bench/seen.py, bench/soak.py), run tiny so they cannot rot:
the shape of their reports, not their timings."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bench.cli import main
from bench.soak import slope_per_hour

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="the harness reads Linux /proc"
)


def test_the_slope_is_the_least_squares_one_in_mb_per_hour() -> None:
    assert slope_per_hour([0.0, 0.5, 1.0], [100.0, 110.0, 120.0]) == pytest.approx(20.0)
    assert slope_per_hour([0.0, 0.5, 1.0], [100.0, 100.0, 100.0]) == 0.0
    assert slope_per_hour([0.0], [100.0]) == 0.0


def test_the_seen_bench_reports_memory_per_key_and_admissions_for_k1_and_k3(
    tmp_path: Path,
) -> None:
    argv = ["seen", "--urls", "2000", "--memory-keys", "2000", "--reps", "1"]
    assert main([*argv, "--dispatchers", "1", "--out", str(tmp_path)]) == 0
    report = orjson.loads((tmp_path / "seen.json").read_bytes())
    runs = {a["partitions"]: a for a in report["admissions"]}
    assert set(runs) == {1, 3}
    assert all(a["urls"] == 2000 and a["seconds"] > 0 for a in runs.values())
    assert sorted(runs[3]["leaders"]) == ["n1", "n2", "n3"], "one partition leader per server"
    assert report["memory"]["keys"] == 2000
    assert report["memory"]["kv_disk_bytes"] > 2000 * 100  # a mark is stored: subject and all
    markdown = (tmp_path / "seen.md").read_text()
    assert "| K=1 |" in markdown and "| K=3 |" in markdown


def test_the_soak_samples_both_services_while_the_site_is_crawled_again(tmp_path: Path) -> None:
    argv = ["soak-memory", "--minutes", "0.4", "--sample-s", "4", "--pages", "200"]
    assert main([*argv, "--recrawl-after-s", "3", "--out", str(tmp_path)]) == 0
    report = orjson.loads((tmp_path / "soak-memory.json").read_bytes())
    samples = report["samples"]
    assert len(samples) >= 5
    assert all(s["dispatcher_rss_mb"] > 0 and s["worker_rss_mb"] > 0 for s in samples)
    assert samples[-1]["cycles"] >= 3
    # Crawled more than once: the marks expired and the seeds admitted the site again.
    assert samples[-1]["pages"] > 200 * 1.2, samples
    assert set(report["slopes_mb_per_hour"]) == {"dispatcher", "worker", "nats"}
