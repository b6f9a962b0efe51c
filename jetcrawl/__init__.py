"""jetcrawl: a distributed web crawler on NATS JetStream and etcd, traced with OpenTelemetry.

One import name, in layers (checked by import-linter, see pyproject.toml)::

    cli                                   the composition root: flags, settings, services
    local, ops                            the one-command crawl; operator commands
    dispatcher | worker | registry        the services (root folders of the repo)
      | sinks                             and the sinks (jetcrawl sink NAME)
    plumbing                              NATS bus, pulls, metrics, health endpoint, bodies
    otel                                  OpenTelemetry setup and W3C propagation
    contract                              messages, topology, URL rules, settings, errors
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
