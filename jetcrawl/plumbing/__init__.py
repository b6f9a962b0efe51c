"""What the services share to talk to NATS and to be watched; no crawling rules here.

bus.py            connecting to NATS, and the outbox that pipelines publishes and acks
pull.py           the pull request loop over nats-py
natsinternals.py  the private attributes of nats-py we rely on, in one place, checked
metrics.py        Prometheus metrics of the dispatcher and the worker
health.py         readiness checks (NATS, etcd) for ``/readyz``
endpoint.py       the HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``
bodies.py         page bodies in the ``crawl_bodies`` object store
"""

__all__: list[str] = []  # import the modules by name
