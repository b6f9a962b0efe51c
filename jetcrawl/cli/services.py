"""Running the dispatcher and the worker as services: tracing, metrics, readiness, signals."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from typing import TYPE_CHECKING

from jetcrawl import __version__
from jetcrawl.cli.runtime import on_signals, tune_gc
from jetcrawl.contract.settings import Settings, redact_urls
from jetcrawl.plumbing.logs import set_service

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from jetcrawl.plumbing.health import Readiness
    from jetcrawl.sinks.api import Sink

log = logging.getLogger("jetcrawl")


async def run_dispatcher(settings: Settings) -> None:
    from jetcrawl.dispatcher import Dispatcher
    from jetcrawl.otel import DISPATCHER_SERVICE, setup_tracing
    from jetcrawl.plumbing.health import Readiness, nats_ready
    from jetcrawl.plumbing.metrics import DispatcherMetrics

    tune_gc()

    instance = default_worker_id()
    set_service("dispatcher", instance)
    tracing = setup_tracing(DISPATCHER_SERVICE, instance, __version__)
    metrics = DispatcherMetrics(DISPATCHER_SERVICE, __version__, instance)
    readiness = Readiness()
    try:
        async with (
            _endpoint(settings, metrics.registry, readiness),
            Dispatcher(settings, tracing) as dispatcher,
        ):
            metrics.bind(dispatcher)
            readiness.add("nats", nats_ready(dispatcher.nc, settings))
            on_signals(dispatcher.stop)
            log.info(
                "dispatcher running (nats %s, %d shards)",
                redact_urls(settings.nats_url),
                settings.shards,
            )
            await dispatcher.run()
        log.info("dispatcher stopped: %s", dispatcher.stats)
    finally:
        await asyncio.to_thread(tracing.shutdown)


async def run_worker(settings: Settings) -> None:
    from jetcrawl.otel import WORKER_SERVICE, setup_tracing
    from jetcrawl.plumbing.health import Readiness, nats_ready, registry_ready
    from jetcrawl.plumbing.metrics import WorkerMetrics
    from jetcrawl.registry import Registry, WorkerInfo
    from jetcrawl.worker import Worker

    tune_gc()

    worker_id = settings.worker_id or default_worker_id()
    set_service("worker", worker_id)
    tracing = setup_tracing(WORKER_SERVICE, worker_id, __version__)
    # Pages are counted and timed only for a /metrics that someone can read.
    metrics = (
        WorkerMetrics(WORKER_SERVICE, __version__, worker_id) if settings.metrics_port else None
    )
    readiness = Readiness()
    stopping = asyncio.Event()
    try:
        async with (
            _endpoint(settings, metrics.registry if metrics else None, readiness),
            Worker(settings, worker_id, tracing, metrics) as worker,
            asyncio.TaskGroup() as tg,
        ):
            if metrics is not None:
                metrics.bind(worker)
            readiness.add("nats", nats_ready(worker.nc, settings))
            tg.create_task(worker.run())
            await worker.wait_running()
            info = WorkerInfo.local(worker_id, capacity=settings.concurrency)
            async with Registry(settings, info, worker) as registry:
                worker.fence_on(registry.holds_lease)
                readiness.add("etcd", registry_ready(registry))
                on_signals(stopping.set)
                log.info("worker %s running (etcd %s)", worker_id, redact_urls(settings.etcd_url))
                await stopping.wait()
                log.info("worker %s stopping: releasing shards", worker_id)
            worker.stop()  # the registry has drained and released every shard, revoked the lease
        log.info("worker %s stopped: %s", worker_id, worker.stats)
    finally:
        await asyncio.to_thread(tracing.shutdown)


async def run_renderer(settings: Settings) -> None:
    from jetcrawl.otel import RENDERER_SERVICE, setup_tracing
    from jetcrawl.worker.renderer import RendererService

    name = settings.worker_id or default_worker_id()
    set_service("renderer", name)
    tracing = setup_tracing(RENDERER_SERVICE, name, __version__)
    try:
        async with RendererService(settings, name, tracing) as renderer:
            on_signals(renderer.stop)
            log.info(
                "renderer %s running (nats %s, %d pages at once, chromium %s)",
                name,
                settings.nats_url,
                settings.render_concurrency,
                settings.chromium_path,
            )
            await renderer.run()
        log.info("renderer %s stopped: %s", name, renderer.stats)
    finally:
        await asyncio.to_thread(tracing.shutdown)


async def run_sink(
    settings: Settings,
    sink: Sink,
    kinds: frozenset[str],
    name: str,
    job: str | None,
    consumer: str | None,
) -> None:
    from jetcrawl.plumbing.health import Readiness
    from jetcrawl.sinks.metrics import SINK_SERVICE, SinkMetrics
    from jetcrawl.sinks.service import SinkService, consumer_name

    tune_gc()
    consumer = consumer or consumer_name(name, job)
    set_service("sink", consumer)
    service = SinkService(settings, sink, kinds, consumer, job)
    metrics = SinkMetrics(SINK_SERVICE, __version__, consumer) if settings.metrics_port else None
    readiness = Readiness()
    async with _endpoint(settings, metrics.registry if metrics else None, readiness):
        if metrics is not None:
            metrics.bind(service)
        readiness.add("sink", service.ready)
        on_signals(service.stop)
        await service.run()
    log.info("sink %s stopped: %s", consumer, service.stats)


def _endpoint(
    settings: Settings, registry: CollectorRegistry | None, readiness: Readiness
) -> contextlib.AbstractAsyncContextManager[object]:
    """The service's /metrics, /healthz and /readyz, when ``metrics_port`` is set."""
    if not settings.metrics_port or registry is None:
        return contextlib.nullcontext()
    from jetcrawl.plumbing.endpoint import Endpoint  # not before: it loads aiohttp's server

    return Endpoint(settings.metrics_port, registry, readiness)


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
