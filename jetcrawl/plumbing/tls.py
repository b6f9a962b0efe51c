"""TLS for the clients: the settings' CA, certificate and key files, for NATS and for etcd.

NATS (nats-py) takes an ``ssl.SSLContext``; etcd's gRPC channel takes the PEM bytes. Both come
from one ``TlsFiles``, which names the setting of a file it cannot read, so a wrong path is one
clear line. The server's certificate is always verified (hostname included) when TLS is on.
Keys are read from their files when a connection is made and never kept in the settings.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from jetcrawl.contract.errors import SettingsError
from jetcrawl.contract.settings import Settings

__all__ = ["TlsFiles", "describe_tls_error"]


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The TLS files of one server's client side; ``server`` ("nats", "etcd") names the settings."""

    server: str
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    @classmethod
    def nats(cls, settings: Settings) -> TlsFiles:
        return cls(
            "nats",
            settings.nats_tls_ca_file,
            settings.nats_tls_cert_file,
            settings.nats_tls_key_file,
        )

    @classmethod
    def etcd(cls, settings: Settings) -> TlsFiles:
        return cls(
            "etcd",
            settings.etcd_tls_ca_file,
            settings.etcd_tls_cert_file,
            settings.etcd_tls_key_file,
        )

    @property
    def configured(self) -> bool:
        """Whether a file is set: TLS is on whatever the URLs say."""
        return bool(self.ca_file or self.cert_file)

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that verifies the server (against the CA file, or the system's CAs)
        and presents the client certificate if one is set."""
        ca = self._read("ca_file", self.ca_file) if self.ca_file else None
        try:
            context = ssl.create_default_context(cadata=ca.decode("ascii") if ca else None)
        except (ssl.SSLError, UnicodeDecodeError):
            raise SettingsError(
                f"{self.server}_tls_ca_file", f"{self.ca_file} holds no CA certificate"
            ) from None
        if self.cert_file:
            self._read("cert_file", self.cert_file)
            self._read("key_file", self.key_file)
            try:
                context.load_cert_chain(self.cert_file, self.key_file)
            except ssl.SSLError as e:
                raise SettingsError(
                    f"{self.server}_tls_cert_file",
                    f"{self.cert_file} and {self.key_file} are not a certificate and its key "
                    f"({e.reason or e})",
                ) from None
        return context

    def pem(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """The CA, key and certificate as PEM bytes (gRPC's order), None where unset."""
        ca = self._read("ca_file", self.ca_file) if self.ca_file else None
        if not self.cert_file:
            return ca, None, None
        return ca, self._read("key_file", self.key_file), self._read("cert_file", self.cert_file)

    def _read(self, which: str, path: str) -> bytes:
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise SettingsError(
                f"{self.server}_tls_{which}", f"cannot read {path}: {e.strerror}"
            ) from None
        if b"-----BEGIN " not in data:
            raise SettingsError(f"{self.server}_tls_{which}", f"{path} is not a PEM file")
        return data


def describe_tls_error(e: ssl.SSLError) -> str:
    """An ``ssl`` error in words: the verification failure (``certificate verify failed:
    unable to get local issuer certificate``) rather than OpenSSL's bracketed codes."""
    if isinstance(e, ssl.SSLCertVerificationError) and e.verify_message:
        return f"TLS: certificate verify failed: {e.verify_message}"
    return f"TLS: {str(e.reason or e).lower().replace('_', ' ')}"
