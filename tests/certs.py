"""Certificates for tests: a CA from ``trustme`` and leaf certificates with
SPIFFE IDs (URI SANs, which ``trustme`` does not issue), written to files."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import grpc
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The name every relay certificate here carries, and clients ask for.
RELAY_NAME = "relay.test"


@dataclass(frozen=True)
class Leaf:
    """A certificate and its key, as PEM, and where they were written."""

    cert_pem: bytes
    key_pem: bytes
    cert_file: Path
    key_file: Path


class Authority:
    """A test CA that writes what it issues under ``directory``."""

    def __init__(self, directory: Path, name: str = "ca") -> None:
        self.ca = trustme.CA()
        self.directory = directory
        self.name = name
        self.cert_file = directory / f"{name}.crt"
        self.cert_file.write_bytes(self.ca.cert_pem.bytes())
        self._key = serialization.load_pem_private_key(self.ca.private_key_pem.bytes(), None)
        self._cert = x509.load_pem_x509_certificate(self.ca.cert_pem.bytes())

    @property
    def cert_pem(self) -> bytes:
        return self.ca.cert_pem.bytes()

    def issue(self, file_stem: str, *, spiffe_id: str | None = None,
              dns: tuple[str, ...] = (), ips: tuple[str, ...] = (),
              expired: bool = False) -> Leaf:
        """A leaf for ``spiffe_id``/``dns``/``ips`` (server and client use),
        written to ``<file_stem>.crt`` and ``<file_stem>.key``."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        start, end = ((now - datetime.timedelta(days=2), now - datetime.timedelta(days=1))
                      if expired else (now - datetime.timedelta(hours=1),
                                       now + datetime.timedelta(days=1)))
        names: list[x509.GeneralName] = []
        if spiffe_id:
            names.append(x509.UniformResourceIdentifier(spiffe_id))
        names += [x509.DNSName(name) for name in dns]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, file_stem)]))
                .issuer_name(self._cert.subject)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(start).not_valid_after(end)
                .add_extension(x509.SubjectAlternativeName(names), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH,
                                                      ExtendedKeyUsageOID.SERVER_AUTH]),
                               critical=False)
                .sign(self._key, hashes.SHA256()))  # type: ignore[arg-type]
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        key_pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        leaf = Leaf(cert_pem, key_pem, self.directory / f"{file_stem}.crt",
                    self.directory / f"{file_stem}.key")
        leaf.cert_file.write_bytes(cert_pem)
        leaf.key_file.write_bytes(key_pem)
        return leaf

    def relay_leaf(self, file_stem: str = "relay") -> Leaf:
        """A serving certificate for the relay on 127.0.0.1 as ``relay.test``."""
        return self.issue(file_stem, dns=(RELAY_NAME,), ips=("127.0.0.1",))


def tls_channel(port: int, trusted: Authority, client: Leaf | None = None
                ) -> grpc.aio.Channel:
    """A channel to ``127.0.0.1:port`` trusting ``trusted``, presenting ``client``."""
    credentials = grpc.ssl_channel_credentials(
        trusted.cert_pem, client.key_pem if client else None,
        client.cert_pem if client else None)
    return grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials,
                                   options=[("grpc.ssl_target_name_override", RELAY_NAME)])
