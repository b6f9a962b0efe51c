"""The sink's Prometheus metrics and its readiness, for ``--metrics-port``.

Read from :class:`~jetcrawl.sinks.service.SinkStats` when scraped (one count, no copy)::

    jetcrawl_build_info{service="jetcrawl-sink", ...}
    jetcrawl_sink_records_stored_total   records acked after the sink made them durable
    jetcrawl_sink_records_skipped_total  results of other jobs
    jetcrawl_dead_letters_total          records dead-lettered (undecodable or refused)
    jetcrawl_sink_pauses_total           times the storage went away
    jetcrawl_sink_paused                 1 while the storage is away, else 0
    jetcrawl_sink_records_held           records handed to the sink and not yet durable

``/readyz`` is ready while NATS is connected, the sink is open and its storage answers.
"""

from __future__ import annotations

from prometheus_client import Gauge

from jetcrawl.plumbing.metrics import ServiceMetrics
from jetcrawl.sinks.service import SinkService

__all__ = ["SINK_SERVICE", "SinkMetrics"]

SINK_SERVICE = "jetcrawl-sink"


class SinkMetrics(ServiceMetrics):
    def bind(self, service: SinkService) -> None:
        stats = service.stats
        self.read_counters(
            [
                (
                    "jetcrawl_sink_records_stored",
                    "Records acked after the sink made them durable.",
                    lambda: stats.stored,
                ),
                (
                    "jetcrawl_sink_records_skipped",
                    "Results of other jobs, acked unstored.",
                    lambda: stats.skipped,
                ),
                ("jetcrawl_dead_letters", "Dead letters written.", lambda: stats.dead),
                ("jetcrawl_sink_pauses", "Times the storage went away.", lambda: stats.pauses),
            ]
        )
        Gauge(
            "jetcrawl_sink_paused", "1 while the storage is away.", registry=self.registry
        ).set_function(lambda: 1.0 if service.paused else 0.0)
        Gauge(
            "jetcrawl_sink_records_held",
            "Records handed to the sink and not yet durable (unacked).",
            registry=self.registry,
        ).set_function(lambda: service.held)
