"""PEM certificates and keys on disk: loaded, checked, and re-read when they change.

Certificates are rotated often (cert-manager, SPIFFE agents), by replacing
the files: Kubernetes swaps a Secret volume's files at once through a
symlink, other tools write one file after the other. :class:`WatchedKeyPair`
notices a change by the files' ``stat`` (cheap enough to ask at every TLS
handshake), and takes a new pair only once it is whole: a certificate with
the key of its predecessor is not served, the previous pair is kept until
the key matches.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from relay.errors import RelayError

log = logging.getLogger("relay.tls")

__all__ = ["CertificateError", "KeyPair", "WatchedKeyPair", "file_signature", "load_ca",
           "load_key_pair"]


class CertificateError(RelayError, ValueError):
    """Files that do not hold a usable certificate, key or CA; the message says why."""


@dataclass(frozen=True)
class KeyPair:
    """A certificate chain, its private key and (optionally) the CA that client
    certificates must chain to, as PEM bytes."""

    cert_pem: bytes
    key_pem: bytes
    client_ca_pem: bytes | None
    not_after: datetime  # when the (leaf) certificate expires, UTC


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise CertificateError(f"cannot read {what} {path}: {error.strerror}") from None


def _certificates(data: bytes, path: Path, what: str) -> list[x509.Certificate]:
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        certificates = []
    if not certificates:
        raise CertificateError(f"{what} {path} holds no PEM certificate")
    return certificates


def load_ca(path: Path) -> bytes:
    """The PEM bytes of a CA bundle; :class:`CertificateError` unless it holds one."""
    data = _read(path, "CA file")
    _certificates(data, path, "CA file")
    return data


def load_key_pair(cert_file: Path, key_file: Path, client_ca_file: Path | None = None
                  ) -> KeyPair:
    """Read and check a certificate, its key and an optional client CA.

    Raises :class:`CertificateError` naming the file when one is unreadable or
    not PEM, or when the key is not the certificate's.
    """
    cert_pem = _read(cert_file, "certificate")
    key_pem = _read(key_file, "key")
    leaf = _certificates(cert_pem, cert_file, "certificate")[0]
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as error:
        # TypeError: the key is encrypted; there is nowhere to take a password from
        raise CertificateError(f"key {key_file} is not an unencrypted PEM private key: "
                               f"{error}") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.DER, public) != \
            leaf.public_key().public_bytes(serialization.Encoding.DER, public):
        raise CertificateError(f"key {key_file} is not the key of certificate {cert_file}")
    client_ca = load_ca(client_ca_file) if client_ca_file is not None else None
    return KeyPair(cert_pem, key_pem, client_ca, leaf.not_valid_after_utc)


def file_signature(paths: tuple[Path, ...]) -> tuple[tuple[int, int, int], ...] | None:
    """What changes when one of ``paths`` is replaced or rewritten (compare two
    calls); None while one is missing."""
    try:
        stats = [os.stat(path) for path in paths]  # follows Kubernetes' symlinks
    except OSError:
        return None
    return tuple((s.st_ino, s.st_size, s.st_mtime_ns) for s in stats)


class WatchedKeyPair:
    """A :class:`KeyPair` from files, re-read when they change.

    :meth:`refresh` is asked before each TLS handshake: it returns the new pair
    when the files changed into a valid one, None otherwise. A change into an
    unusable pair (half rotated, or broken) is logged once per change and the
    last good pair stays in use.
    """

    def __init__(self, cert_file: Path, key_file: Path,
                 client_ca_file: Path | None = None) -> None:
        self._files = (cert_file, key_file, client_ca_file)
        self._paths = tuple(p for p in self._files if p is not None)
        self._seen = file_signature(self._paths)
        self.current = load_key_pair(cert_file, key_file, client_ca_file)

    def refresh(self) -> KeyPair | None:
        """The new pair if the files changed into a valid one since the last call."""
        seen = file_signature(self._paths)
        if seen is None or seen == self._seen:
            return None
        self._seen = seen
        cert_file, key_file, client_ca_file = self._files
        assert cert_file is not None and key_file is not None
        try:
            pair = load_key_pair(cert_file, key_file, client_ca_file)
        except CertificateError as error:
            log.warning("TLS files changed but are not usable yet (%s); still serving the "
                        "certificate that expires %s", error, self.current.not_after)
            return None
        self.current = pair
        log.info("TLS certificate %s reloaded; it expires %s", cert_file, pair.not_after)
        return pair
