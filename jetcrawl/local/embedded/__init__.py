"""Real nats-server and etcd processes, for ``jetcrawl crawl`` and for the tests.

    EmbeddedServerError (JetcrawlError)   a binary is missing, a server did not get ready, or died

process.py     a server binary as a subprocess (the base of both), binaries, free ports
natsserver.py  NatsServer: one nats-server with JetStream; NatsCluster: n of them on loopback
etcdserver.py  EtcdServer: a single-member etcd
"""

from jetcrawl.local.embedded.etcdserver import EtcdServer
from jetcrawl.local.embedded.natsserver import NatsCluster, NatsServer
from jetcrawl.local.embedded.process import (
    EmbeddedServerError,
    etcd_binary,
    free_ports,
    libc_prctl,
    nats_server_binary,
    parent_death_hook,
)

__all__ = [
    "EmbeddedServerError",
    "EtcdServer",
    "NatsCluster",
    "NatsServer",
    "etcd_binary",
    "free_ports",
    "libc_prctl",
    "nats_server_binary",
    "parent_death_hook",
]
