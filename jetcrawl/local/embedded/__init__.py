"""Real nats-server and etcd processes, for ``jetcrawl crawl`` and for the tests.

    EmbeddedServerError (JetcrawlError)   a binary is missing, a server did not get ready, or died

process.py     a server binary as a subprocess (the base of both), binaries, free ports
natsserver.py  NatsServer: one nats-server with JetStream; NatsCluster: n of them on loopback
etcdserver.py  EtcdServer: one etcd member, optionally over TLS; EtcdCluster: n of them on loopback
"""

from jetcrawl.local.embedded.etcdserver import EtcdCluster, EtcdServer, EtcdTls
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
    "EtcdCluster",
    "EtcdServer",
    "EtcdTls",
    "NatsCluster",
    "NatsServer",
    "etcd_binary",
    "free_ports",
    "libc_prctl",
    "nats_server_binary",
    "parent_death_hook",
]
