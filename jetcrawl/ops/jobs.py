"""jetcrawl job: put, get, list and diff the job specs in KV ``crawl_specs``.

``put FILE`` reads a JSON or YAML document, checks all of it (the spec's fields, its regexes,
its extraction compiled as a worker compiles it) and stores it as the job's next version; the
same document again stores nothing. Plugins are installed where the workers run, not
necessarily here: a named plugin missing here is a warning, and a worker that lacks it
dead-letters each of the job's pages with the reason. ``get`` prints a version as YAML (a file
``put`` takes back), ``diff`` a unified diff between two versions. A job that is not stored is
an error (exit 2).
"""

from __future__ import annotations

import difflib
import sys
from datetime import UTC, datetime
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import orjson
import yaml
from nats.js.errors import NotFoundError

from jetcrawl.contract.errors import JetcrawlError, SpecError, UsageError
from jetcrawl.contract.jobs import JobSpec, StoredSpec
from jetcrawl.contract.plugin import ENTRY_POINT_GROUP
from jetcrawl.contract.settings import Settings
from jetcrawl.contract.topology import SPECS_BUCKET
from jetcrawl.plumbing.bus import connect
from jetcrawl.plumbing.specs import SpecStore
from jetcrawl.worker.jobs import check_extraction

__all__ = ["read_spec_file", "run_command", "spec_text"]


def read_spec_file(path: Path) -> JobSpec:
    """The spec in ``path``, checked as ``put`` checks it; raises ``UsageError``/``SpecError``."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"job spec {path}", f"cannot be read: {e}") from e
    doc = _parse(text, path)
    try:
        spec = JobSpec.read(doc)
        check_extraction(spec)
    except SpecError as e:
        raise SpecError(e.path, f"{e.problem} (in {path})") from e
    return spec


def _parse(text: str, path: Path) -> Any:
    if path.suffix.lower() == ".json":
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError as e:
            raise UsageError(f"job spec {path}", f"not JSON: {e}") from e
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UsageError(f"job spec {path}", f"not YAML: {e}") from e


def spec_text(stored: StoredSpec) -> str:
    """A version as YAML, headed by a comment that names it: ``put`` reads it back."""
    when = datetime.fromtimestamp(stored.put_at, UTC).isoformat(timespec="seconds")
    body = yaml.safe_dump(dict(stored.spec.doc), sort_keys=False, allow_unicode=True)
    return f"# job {stored.name}, version {stored.version}, put {when}\n{body}"


async def run_command(settings: Settings, action: str, **args: Any) -> int:
    spec = read_spec_file(args["file"]) if action == "put" else None  # before connecting
    nc = await connect(settings, "jetcrawl-job", give_up_s=settings.command_timeout_s)
    try:
        try:
            store = await SpecStore.open(nc.jetstream(timeout=settings.command_timeout_s))
        except NotFoundError as e:
            raise JetcrawlError(
                f"KV {SPECS_BUCKET} is missing on {settings.nats_url}: start a service, or "
                "run `jetcrawl topology --apply`, first"
            ) from e
        if spec is not None:
            return await _put(store, spec)
        if action == "get":
            stored = await store.get(args["name"], args.get("version"))
            sys.stdout.write(spec_text(stored))
        elif action == "list":
            await _list(store)
        elif action == "diff":
            await _diff(store, args["name"], args.get("versions") or [])
        return 0
    finally:
        await nc.close()


async def _put(store: SpecStore, spec: JobSpec) -> int:
    for name in spec.plugins:
        if not entry_points(group=ENTRY_POINT_GROUP, name=name):
            print(
                f"jetcrawl: warning: plugin {name!r} is not installed here; the workers need it",
                file=sys.stderr,
            )
    outcome = await store.put(spec)
    if outcome.changed:
        print(f"job {spec.name}: version {outcome.stored.version} stored")
    else:
        print(f"job {spec.name}: unchanged, still version {outcome.stored.version}")
    return 0


async def _list(store: SpecStore) -> None:
    for name in await store.names():
        stored = await store.get(name)
        spec = stored.spec
        when = datetime.fromtimestamp(stored.put_at, UTC).isoformat(timespec="seconds")
        uses = [*(["extract"] if spec.extract is not None else []), *spec.plugins]
        print(f"{name}\tversion {stored.version}\tput {when}\t{', '.join(uses) or '-'}")


async def _diff(store: SpecStore, name: str, versions: list[int]) -> None:
    if len(versions) not in (0, 2):
        raise UsageError("job diff", "name two versions (A B), or none for the last change")
    history = await store.history(name)
    if versions:
        old, new = (await store.get(name, versions[0])), (await store.get(name, versions[1]))
    elif len(history) < 2:
        print(f"job {name} has one version ({history[-1].version}): nothing to compare")
        return
    else:
        old, new = history[-2], history[-1]
    sys.stdout.writelines(
        difflib.unified_diff(
            spec_text(old).splitlines(keepends=True)[1:],
            spec_text(new).splitlines(keepends=True)[1:],
            fromfile=f"{name} version {old.version}",
            tofile=f"{name} version {new.version}",
        )
    )
