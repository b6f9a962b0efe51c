"""The one-command crawl (``jetcrawl crawl``): the whole mesh on one machine.

crawl.py      orchestration: servers, services, progress, drain, results
services.py   the dispatcher and workers as child processes (forked or spawned)
embedded.py   nats-server and etcd from their wheels, in a temporary directory
drain.py      "drained" read exactly from JetStream snapshots
"""

__all__: list[str] = []  # import the modules by name
