"""Each package's public surface is small and deliberate: changing it is a visible decision."""

from __future__ import annotations

import importlib

import pytest

EXPORTS: dict[str, list[str]] = {
    "jetcrawl": ["__version__"],
    "jetcrawl.contract": ["PROTOCOL_VERSION"],
    # Layers whose modules are imported by name: nothing re-exported.
    "jetcrawl.plumbing": [],
    "jetcrawl.local": [],
    "jetcrawl.ops": [],
    "jetcrawl.dispatcher": ["DispatchStats", "Dispatcher", "Intake", "Reading", "Rejection"],
    "jetcrawl.worker": ["CrawlStats", "Ownership", "TaskProcessor", "Worker"],
    "jetcrawl.worker.renderer": ["RenderStats", "RendererService"],
    # The sink plugin interface, version 1 (jetcrawl/sinks/api.py): what a third party uses.
    "jetcrawl.sinks": [
        "ITEMS",
        "RESULTS",
        "SINK_API_VERSION",
        "Record",
        "Sink",
        "SinkError",
        "SinkPlugin",
        "SinkRejected",
        "SinkUnavailable",
    ],
    "jetcrawl.otel": [
        "DISPATCHER_SERVICE",
        "NO_TRACING",
        "RENDERER_SERVICE",
        "WORKER_SERVICE",
        "Tracing",
        "current_trace_id",
        "extract",
        "inject",
        "remote_span_context",
        "setup_tracing",
        "tracing_enabled",
    ],
}


@pytest.mark.parametrize("package", sorted(EXPORTS))
def test_public_surface(package: str) -> None:
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(EXPORTS[package])
    for name in module.__all__:
        assert hasattr(module, name), name


def test_nats_folder_is_never_a_python_package() -> None:
    import nats

    assert hasattr(nats, "connect"), "`import nats` must be the nats-py client"
    assert nats.__file__ is not None and "site-packages" in nats.__file__
