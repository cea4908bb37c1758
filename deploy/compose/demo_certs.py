#!/usr/bin/env python3
"""Demo certificates for the compose stack over mutual TLS. Never use them in production.

    python deploy/compose/demo_certs.py --out DIR [--owner UID:GID] [--days N] [--force]

docker-compose.tls.yml runs this once (service `certs`, in the relay image, which
has `cryptography`) into the volume the relays and Envoys mount read-only. DIR gets:

    ca.crt                      the demo CA, which every service trusts
    NAME.crt, NAME.key          a certificate and its key for each service NAME below

Each certificate names its service twice: a DNS SAN (the compose service name,
which clients check the server against and which is also the service's xDS node
id) and a SPIFFE ID, spiffe://xds-relay.demo/relay/... or .../envoy/..., which the
relays' server.authorization.allow matches. The CA's private key is never
written: nothing can be signed with it later, and --force starts over.

An existing, complete and unexpired set is kept (so `docker compose up` again
changes nothing); --force replaces it. Files are written atomically (a temporary
file renamed), certificates 0644 and keys 0400, owned by --owner when given (run
as root for that): the relays and, in the demo, the Envoys read them as UID 10001.
After --force restart the stack: the relays re-read their files, but the Envoys
read theirs once, at start, and the new CA is not the one they trust.
Needs only the `cryptography` package.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

TRUST_DOMAIN = "xds-relay.demo"
CA_FILE = "ca.crt"
DEFAULT_DAYS = 365
# A set that expires sooner than this is replaced rather than kept.
MIN_LEFT = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Identity:
    """A service of the compose stack and what its certificate is for."""

    name: str          # the compose service: the DNS SAN, the file names, the node id
    spiffe_path: str   # spiffe://TRUST_DOMAIN/<spiffe_path>
    server: bool       # serves xDS (serverAuth)
    client: bool       # connects to a relay (clientAuth)


IDENTITIES = (
    Identity("origin", "relay/origin", server=True, client=False),
    Identity("relay-zone-a", "relay/zone-a", server=True, client=True),
    Identity("relay-zone-b", "relay/zone-b", server=True, client=True),
    Identity("envoy-zone-a", "envoy/zone-a", server=False, client=True),
    Identity("envoy-zone-b", "envoy/zone-b", server=False, client=True),
)


def spiffe_id(identity: Identity) -> str:
    return f"spiffe://{TRUST_DOMAIN}/{identity.spiffe_path}"


def expected_files() -> list[str]:
    """Every file a run writes, relative to its output directory."""
    return [CA_FILE, *(f"{i.name}.{ext}" for i in IDENTITIES for ext in ("crt", "key"))]


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _ca(now: datetime.datetime, days: int) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "xds-relay demo"),
                      x509.NameAttribute(NameOID.COMMON_NAME, "xds-relay demo CA")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days + 1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(identity: Identity, ca: x509.Certificate,
          ca_key: ec.EllipticCurvePrivateKey, now: datetime.datetime, days: int,
          ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if identity.server else []) + \
        ([ExtendedKeyUsageOID.CLIENT_AUTH] if identity.client else [])
    # gRPC reports a SPIFFE ID only for a certificate with exactly one URI SAN.
    names: list[x509.GeneralName] = [
        x509.DNSName(identity.name),
        x509.UniformResourceIdentifier(spiffe_id(identity)),
    ]
    ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "xds-relay demo"),
            x509.NameAttribute(NameOID.COMMON_NAME, identity.name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def _write(path: Path, data: bytes, mode: int, owner: tuple[int, int] | None) -> None:
    """Replace ``path`` at once, so that a reader never sees half a file."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chmod(temporary, mode)
        if owner is not None:
            os.chown(temporary, *owner)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _public(key: object) -> bytes:
    public = key.public_key() if isinstance(key, ec.EllipticCurvePrivateKey) else key
    if not isinstance(public, ec.EllipticCurvePublicKey):
        raise TypeError(f"not an EC key: {type(public).__name__}")
    return public.public_bytes(serialization.Encoding.DER,
                               serialization.PublicFormat.SubjectPublicKeyInfo)


def existing_set_is_usable(out: Path, now: datetime.datetime) -> bool:
    """Whether ``out`` holds every file, each certificate signed by ca.crt,
    matching its key and valid for at least MIN_LEFT more."""
    try:
        ca = x509.load_pem_x509_certificate((out / CA_FILE).read_bytes())
        certs = [ca]
        for identity in IDENTITIES:
            cert = x509.load_pem_x509_certificate((out / f"{identity.name}.crt").read_bytes())
            key = serialization.load_pem_private_key(
                (out / f"{identity.name}.key").read_bytes(), password=None)
            cert.verify_directly_issued_by(ca)
            if _public(key) != _public(cert.public_key()):
                return False
            certs.append(cert)
    except (OSError, ValueError, TypeError, InvalidSignature):
        return False
    return all(cert.not_valid_after_utc - now >= MIN_LEFT for cert in certs)


def generate(out: Path, *, days: int = DEFAULT_DAYS, owner: tuple[int, int] | None = None,
             force: bool = False) -> bool:
    """Write the demo CA and every service's certificate into ``out``; False
    when a usable set was already there and is kept."""
    now = datetime.datetime.now(datetime.UTC)
    out.mkdir(parents=True, exist_ok=True)
    if not force and existing_set_is_usable(out, now):
        return False
    ca, ca_key = _ca(now, days)
    # Keys and certificates first, the CA last: a relay that re-reads its files
    # keeps its previous pair until certificate and key match again.
    for identity in IDENTITIES:
        cert, key = _leaf(identity, ca, ca_key, now, days)
        _write(out / f"{identity.name}.key", _key_pem(key), 0o400, owner)
        _write(out / f"{identity.name}.crt", cert.public_bytes(serialization.Encoding.PEM),
               0o644, owner)
    _write(out / CA_FILE, ca.public_bytes(serialization.Encoding.PEM), 0o644, owner)
    return True


def _owner(text: str) -> tuple[int, int]:
    uid, sep, gid = text.partition(":")
    try:
        return int(uid), int(gid if sep else uid)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected UID:GID (numbers), got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write a demo CA and a certificate per compose service (never for "
                    "production).")
    parser.add_argument("--out", type=Path, required=True, help="the directory to write to")
    parser.add_argument("--days", type=int, default=DEFAULT_DAYS,
                        help=f"how long the certificates are valid (default {DEFAULT_DAYS})")
    parser.add_argument("--owner", type=_owner, default=None, metavar="UID:GID",
                        help="chown every file to this (needs root)")
    parser.add_argument("--force", action="store_true",
                        help="replace a usable set instead of keeping it")
    args = parser.parse_args(argv)
    if args.days < 2:
        parser.error("--days: at least 2")
    written = generate(args.out, days=args.days, owner=args.owner, force=args.force)
    verb = "wrote" if written else "kept (complete and unexpired; --force replaces it)"
    print(f"demo_certs: {verb} {', '.join(expected_files())} in {args.out}", file=sys.stderr)
    for identity in IDENTITIES:
        print(f"  {identity.name}: DNS {identity.name}, "
              f"{spiffe_id(identity)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
