"""TLS certificates for tests: a CA, a server certificate for loopback, a client certificate,
and a second CA that trusts none of them, written as PEM files (trustme makes them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme

__all__ = ["Certs", "make_certs"]

SERVER_NAMES = ("127.0.0.1", "localhost")


@dataclass(frozen=True, slots=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed none of these: verifying against it fails

    def key_material(self) -> list[str]:
        """Lines of every private key's PEM body: none may ever appear in a log."""
        lines: list[str] = []
        for key in (self.server_key, self.client_key):
            body = key.read_text().splitlines()
            lines += [line for line in body if line and not line.startswith("-----")]
        return lines


def make_certs(directory: Path) -> Certs:
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    server = ca.issue_cert(*SERVER_NAMES)
    client = ca.issue_cert("jetcrawl-client")
    paths = Certs(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        other_ca=directory / "other-ca.pem",
    )
    ca.cert_pem.write_to_path(str(paths.ca))
    server.private_key_pem.write_to_path(str(paths.server_key))
    server.cert_chain_pems[0].write_to_path(str(paths.server_cert))
    client.private_key_pem.write_to_path(str(paths.client_key))
    client.cert_chain_pems[0].write_to_path(str(paths.client_cert))
    trustme.CA().cert_pem.write_to_path(str(paths.other_ca))
    for key in (paths.server_key, paths.client_key):
        key.chmod(0o600)
    return paths


def nats_tls_args(certs: Certs, *, verify_clients: bool = False) -> list[str]:
    """nats-server flags that require TLS with the server certificate; with ``verify_clients``,
    a client certificate signed by the CA too (a config's ``tls { verify: true }``)."""
    args = ["--tls", "--tlscert", str(certs.server_cert), "--tlskey", str(certs.server_key)]
    if verify_clients:
        args += ["--tlsverify", "--tlscacert", str(certs.ca)]
    return args
