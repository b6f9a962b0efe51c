"""jetcrawl job put|get|list|diff against a real nats-server: versions, refusals, exit codes."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import orjson
import yaml
from nats.js import JetStreamContext

from jetcrawl.contract.jobs import StoredSpec
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import SPECS_BUCKET
from jetcrawl.local.embedded import NatsServer
from jetcrawl.plumbing.topology import ensure
from tests.support.shop import JOB_SPEC

SHOP_YAML = """\
name: shop
links:
  allow: ['/products/', '/category/']
  deny: ['\\?sort=']
extensions: {deny: [pdf, jpg]}
max_depth: 3
"""


async def jetcrawl(server: NatsServer, *args: str) -> tuple[int, str, str]:
    """Run the jetcrawl command; (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "jetcrawl",
        *args,
        "--nats",
        server.url,
        "--connect-timeout",
        "5",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_puts_make_versions_and_get_list_diff_read_them(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    await ensure(js, Settings(nats_url=nats_server.url, shards=4))
    spec = tmp_path / "shop.yaml"
    spec.write_text(SHOP_YAML)
    assert await jetcrawl(nats_server, "job", "put", str(spec)) == (
        0,
        "job shop: version 1 stored\n",
        "",
    )
    code, out, _ = await jetcrawl(nats_server, "job", "put", str(spec))
    assert (code, out) == (0, "job shop: unchanged, still version 1\n")

    # the same spec as JSON, keys in another order: the same document, nothing stored
    as_json = tmp_path / "shop.json"
    as_json.write_bytes(orjson.dumps(dict(reversed(yaml.safe_load(SHOP_YAML).items()))))
    code, out, _ = await jetcrawl(nats_server, "job", "put", str(as_json))
    assert (code, out) == (0, "job shop: unchanged, still version 1\n")

    spec.write_text(SHOP_YAML.replace("max_depth: 3", "max_depth: 5"))
    code, out, _ = await jetcrawl(nats_server, "job", "put", str(spec))
    assert (code, out) == (0, "job shop: version 2 stored\n")
    kv = await js.key_value(SPECS_BUCKET)
    assert StoredSpec.from_wire((await kv.get("shop")).value or b"").version == 2

    code, out, _ = await jetcrawl(nats_server, "job", "get", "shop")
    assert code == 0 and out.startswith("# job shop, version 2, put ")
    assert yaml.safe_load(out)["max_depth"] == 5
    code, out, _ = await jetcrawl(nats_server, "job", "get", "shop", "--version", "1")
    assert code == 0 and yaml.safe_load(out) == yaml.safe_load(SHOP_YAML)

    # what get prints, put takes back: the same document
    printed = tmp_path / "printed.yaml"
    printed.write_text(out)
    code, out, _ = await jetcrawl(nats_server, "job", "put", str(printed))
    assert (code, out) == (0, "job shop: version 3 stored\n")  # version 1's document again

    code, out, _ = await jetcrawl(nats_server, "job", "list")
    assert code == 0 and out.startswith("shop\tversion 3\tput ")

    code, out, _ = await jetcrawl(nats_server, "job", "diff", "shop", "1", "2")
    assert code == 0
    assert "--- shop version 1\n+++ shop version 2\n" in out
    assert "-max_depth: 3\n+max_depth: 5\n" in out
    code, out, _ = await jetcrawl(nats_server, "job", "diff", "shop")  # the last change
    assert code == 0 and "-max_depth: 5\n+max_depth: 3\n" in out


async def test_a_bad_spec_is_refused_at_put_with_its_path_and_nothing_is_stored(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    await ensure(js, Settings(nats_url=nats_server.url, shards=4))
    spec = tmp_path / "shop.yaml"
    spec.write_text(SHOP_YAML)
    assert (await jetcrawl(nats_server, "job", "put", str(spec)))[0] == 0

    bad = tmp_path / "bad.yaml"
    bad.write_text(SHOP_YAML.replace("'/category/'", "'/category/', '(unclosed'"))
    code, out, err = await jetcrawl(nats_server, "job", "put", str(bad))
    assert code == 2 and out == ""
    assert err.startswith("jetcrawl: links.allow[2]: not a regular expression")
    assert str(bad) in err

    bad.write_text(SHOP_YAML + "max_pagez: 10\n")
    code, _, err = await jetcrawl(nats_server, "job", "put", str(bad))
    assert code == 2 and err.startswith("jetcrawl: max_pagez: unknown field")

    bad.write_text("name: [unclosed\n")
    code, _, err = await jetcrawl(nats_server, "job", "put", str(bad))
    assert code == 2 and "not YAML" in err

    code, _, err = await jetcrawl(nats_server, "job", "put", str(tmp_path / "missing.yaml"))
    assert code == 2 and "cannot be read" in err

    code, out, _ = await jetcrawl(nats_server, "job", "list")
    assert out.startswith("shop\tversion 1\t"), "nothing refused was stored"


async def test_an_unknown_job_exits_2_with_a_clear_message(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    code, _, err = await jetcrawl(nats_server, "job", "get", "shop")
    assert code == 2 and f"KV {SPECS_BUCKET} is missing" in err  # no topology yet

    await ensure(js, Settings(nats_url=nats_server.url, shards=4))
    for args in (("get", "nope"), ("diff", "nope"), ("diff", "nope", "1", "2")):
        code, out, err = await jetcrawl(nats_server, "job", *args)
        assert (code, out) == (2, ""), args
        assert err == f"jetcrawl: no job 'nope' in {SPECS_BUCKET}\n", args
    code, out, _ = await jetcrawl(nats_server, "job", "list")
    assert (code, out) == (0, "")

    spec = tmp_path / "shop.yaml"
    spec.write_text(SHOP_YAML)
    assert (await jetcrawl(nats_server, "job", "put", str(spec)))[0] == 0
    code, _, err = await jetcrawl(nats_server, "job", "get", "shop", "--version", "7")
    assert code == 2 and err == f"jetcrawl: no version 7 of job 'shop' in {SPECS_BUCKET}\n"
    code, _, err = await jetcrawl(nats_server, "job", "diff", "shop", "1")
    assert code == 2 and "name two versions" in err


async def test_put_compiles_the_extraction_and_refuses_a_bad_selector_at_its_path(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path, example_plugin: None
) -> None:
    await ensure(js, Settings(nats_url=nats_server.url, shards=4))
    code, out, err = await jetcrawl(nats_server, "job", "put", str(JOB_SPEC))
    assert (code, out, err) == (0, "job shop: version 1 stored\n", ""), "its plugin is installed"

    bad = tmp_path / "bad.yaml"
    bad.write_text(JOB_SPEC.read_text().replace('{css: ".price", type: number}', '{css: "[["}'))
    code, out, err = await jetcrawl(nats_server, "job", "put", str(bad))
    assert (code, out) == (2, "")
    assert err.startswith("jetcrawl: extract.rules[0].fields.price.css: invalid CSS selector")

    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(JOB_SPEC.read_text().replace("[example-articles]", "[not-installed]"))
    code, out, err = await jetcrawl(nats_server, "job", "put", str(unknown))
    assert (code, out) == (0, "job shop: version 2 stored\n"), "the workers may have it"
    assert "warning: plugin 'not-installed' is not installed here" in err
