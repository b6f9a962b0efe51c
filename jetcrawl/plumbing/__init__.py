"""What the services share to talk to NATS and to be watched; no crawling rules here.

topology.py     ``ensure``: the declared streams, consumers and buckets made so on the server
leaders.py  the partitions' streams led by different servers of the cluster
backoff.py      the one retry backoff, and the one wait that a stop cuts short
deadletters.py  dead letters built from the message given up on, and published
bus.py          connecting to NATS, and the outbox that pipelines publishes and acks
pull.py         the pull request loop over nats-py
logs.py         log lines as text, or JSON objects with the current trace and span
metrics.py      Prometheus metrics of the dispatcher and the worker
health.py       readiness checks (NATS, etcd) for ``/readyz``
endpoint.py     the HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``
bodies.py       page bodies in the ``crawl_bodies`` object store
specs.py        job specs in KV ``crawl_specs``: versioned puts, reads, the services' watch
control.py      job run states in KV ``crawl_control``: changes by compare-and-set, the watch
kvwatch.py      a KV bucket kept in memory by a watch (specs, run states)
tls.py          the TLS files of the settings: a verifying ssl context, PEM bytes for gRPC
natsinternals.py  the private attributes of nats-py we rely on, in one place, checked
"""

__all__: list[str] = []  # import the modules by name
