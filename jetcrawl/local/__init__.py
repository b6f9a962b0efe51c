"""The one-command crawl (``jetcrawl crawl``): the whole mesh on one machine.

crawl.py      orchestration: servers, services, seeds, the wait for the drain, the summary
children.py   the crawl's dispatcher and workers: started, watched, stopped
services.py   how a service process starts: forked before the event loop, or spawned
collector.py  follows the results stream into the summary and the output file
progress.py   the progress line
drain.py      "drained" read exactly from JetStream snapshots, and how often to look
interrupt.py  Ctrl-C as events, and how long the services have to stop
embedded.py   nats-server and etcd from their wheels, in a temporary directory
"""

__all__: list[str] = []  # import the modules by name
