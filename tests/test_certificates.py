"""relay.certificates: key pairs checked when loaded, and re-read only once a
rotation is whole (files replaced one by one, or swapped at once by Kubernetes)."""

from __future__ import annotations

import logging
import os
from datetime import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from relay.certificates import (
    CertificateError,
    KeyPair,
    WatchedKeyPair,
    file_signature,
    load_ca,
    load_key_pair,
)
from tests.certs import Authority, Leaf


@pytest.fixture
def authority(tmp_path: Path) -> Authority:
    return Authority(tmp_path)


def replace(path: Path, data: bytes) -> None:
    """Write ``path`` as rotation tools do: a new file (a new inode) renamed over it."""
    staged = path.with_name(path.name + ".new")
    staged.write_bytes(data)
    os.replace(staged, path)


def not_after(cert_pem: bytes) -> datetime:
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


# --------------------------------------------------------------------------- load_key_pair


def test_a_matching_pair_loads(authority: Authority) -> None:
    leaf = authority.relay_leaf()
    pair = load_key_pair(leaf.cert_file, leaf.key_file)
    assert pair == KeyPair(leaf.cert_pem, leaf.key_pem, None, not_after(leaf.cert_pem))
    assert pair.not_after.utcoffset() is not None  # aware, UTC


def test_a_pair_with_a_client_ca_carries_the_ca(authority: Authority) -> None:
    leaf = authority.relay_leaf()
    pair = load_key_pair(leaf.cert_file, leaf.key_file, authority.cert_file)
    assert pair.client_ca_pem == authority.cert_pem


def test_the_first_certificate_of_a_chain_is_the_leaf(authority: Authority,
                                                      tmp_path: Path) -> None:
    leaf = authority.relay_leaf()
    chain = tmp_path / "chain.pem"
    chain.write_bytes(leaf.cert_pem + authority.cert_pem)
    pair = load_key_pair(chain, leaf.key_file)
    assert pair.cert_pem == leaf.cert_pem + authority.cert_pem
    assert pair.not_after == not_after(leaf.cert_pem)


def test_the_key_of_another_certificate_is_refused(authority: Authority) -> None:
    served, other = authority.relay_leaf("served"), authority.relay_leaf("other")
    with pytest.raises(CertificateError) as info:
        load_key_pair(served.cert_file, other.key_file)
    assert str(info.value) == (f"key {other.key_file} is not the key of certificate "
                               f"{served.cert_file}")


def test_a_certificate_file_without_pem_is_refused(authority: Authority,
                                                    tmp_path: Path) -> None:
    leaf = authority.relay_leaf()
    text = tmp_path / "notes.txt"
    text.write_text("not a certificate\n")
    with pytest.raises(CertificateError) as info:
        load_key_pair(text, leaf.key_file)
    assert str(info.value) == f"certificate {text} holds no PEM certificate"


def test_a_key_given_as_the_certificate_is_refused(authority: Authority) -> None:
    leaf = authority.relay_leaf()
    with pytest.raises(CertificateError) as info:
        load_key_pair(leaf.key_file, leaf.key_file)
    assert str(info.value) == f"certificate {leaf.key_file} holds no PEM certificate"


def test_a_key_file_without_pem_is_refused(authority: Authority, tmp_path: Path) -> None:
    leaf = authority.relay_leaf()
    text = tmp_path / "notes.txt"
    text.write_text("not a key\n")
    with pytest.raises(CertificateError) as info:
        load_key_pair(leaf.cert_file, text)
    # the rest is cryptography's own explanation
    assert str(info.value).startswith(f"key {text} is not an unencrypted PEM private key: ")


def test_a_certificate_given_as_the_key_is_refused(authority: Authority) -> None:
    leaf = authority.relay_leaf()
    with pytest.raises(CertificateError) as info:
        load_key_pair(leaf.cert_file, leaf.cert_file)
    assert str(info.value).startswith(
        f"key {leaf.cert_file} is not an unencrypted PEM private key: ")


def test_an_encrypted_key_is_refused(authority: Authority, tmp_path: Path) -> None:
    leaf = authority.relay_leaf()
    key = serialization.load_pem_private_key(leaf.key_pem, None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase")))
    with pytest.raises(CertificateError) as info:
        load_key_pair(leaf.cert_file, encrypted)
    assert str(info.value) == (f"key {encrypted} is not an unencrypted PEM private key: "
                               "Password was not given but private key is encrypted")


@pytest.mark.parametrize("missing", ["cert", "key", "ca"])
def test_a_missing_file_is_named(authority: Authority, tmp_path: Path, missing: str) -> None:
    leaf = authority.relay_leaf()
    gone = tmp_path / "gone.pem"
    files = {"cert": leaf.cert_file, "key": leaf.key_file, "ca": authority.cert_file}
    files[missing] = gone
    with pytest.raises(CertificateError) as info:
        load_key_pair(files["cert"], files["key"], files["ca"])
    what = {"cert": "certificate", "key": "key", "ca": "CA file"}[missing]
    assert str(info.value) == f"cannot read {what} {gone}: No such file or directory"


def test_a_directory_is_not_a_certificate(authority: Authority, tmp_path: Path) -> None:
    leaf = authority.relay_leaf()
    with pytest.raises(CertificateError) as info:
        load_key_pair(tmp_path, leaf.key_file)
    assert str(info.value) == f"cannot read certificate {tmp_path}: Is a directory"


@pytest.mark.parametrize("content", ["not a CA\n", "key"])
def test_a_client_ca_without_a_certificate_is_refused(authority: Authority, tmp_path: Path,
                                                      content: str) -> None:
    leaf = authority.relay_leaf()
    ca = tmp_path / "ca.pem"
    ca.write_bytes(leaf.key_pem if content == "key" else content.encode())
    with pytest.raises(CertificateError) as info:
        load_key_pair(leaf.cert_file, leaf.key_file, ca)
    assert str(info.value) == f"CA file {ca} holds no PEM certificate"


def test_load_ca_returns_the_bundle_as_is(authority: Authority, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle.pem"
    other = Authority(tmp_path, "other")
    bundle.write_bytes(authority.cert_pem + other.cert_pem)
    assert load_ca(bundle) == authority.cert_pem + other.cert_pem


# --------------------------------------------------------------------------- file_signature


def test_a_signature_is_none_while_a_file_is_missing(authority: Authority,
                                                     tmp_path: Path) -> None:
    leaf = authority.relay_leaf()
    assert file_signature((leaf.cert_file, leaf.key_file)) is not None
    assert file_signature((leaf.cert_file, tmp_path / "gone")) is None


def test_a_signature_changes_when_a_file_is_replaced(authority: Authority) -> None:
    leaf = authority.relay_leaf()
    before = file_signature((leaf.cert_file,))
    assert file_signature((leaf.cert_file,)) == before
    replace(leaf.cert_file, leaf.cert_pem)  # the same bytes, a new inode
    assert file_signature((leaf.cert_file,)) != before


# --------------------------------------------------------------------------- WatchedKeyPair


class Served:
    """A certificate, key and client CA at fixed paths, as a relay is configured."""

    def __init__(self, authority: Authority, directory: Path) -> None:
        self.authority = authority
        self.cert_file = directory / "tls.crt"
        self.key_file = directory / "tls.key"
        self.ca_file = directory / "ca.crt"
        self.generation = 0
        first = self.next_leaf()
        self.cert_file.write_bytes(first.cert_pem)
        self.key_file.write_bytes(first.key_pem)
        self.ca_file.write_bytes(authority.cert_pem)
        self.first = first

    def next_leaf(self) -> Leaf:
        self.generation += 1
        return self.authority.relay_leaf(f"issued-{self.generation}")

    def watch(self) -> WatchedKeyPair:
        return WatchedKeyPair(self.cert_file, self.key_file, self.ca_file)


@pytest.fixture
def served(authority: Authority, tmp_path: Path) -> Served:
    directory = tmp_path / "served"
    directory.mkdir()
    return Served(authority, directory)


def test_a_watched_pair_starts_with_the_files(served: Served) -> None:
    watched = served.watch()
    assert watched.current.cert_pem == served.first.cert_pem
    assert watched.current.key_pem == served.first.key_pem
    assert watched.current.client_ca_pem == served.authority.cert_pem


def test_a_watched_pair_refuses_bad_files_at_the_start(served: Served) -> None:
    served.key_file.write_bytes(served.next_leaf().key_pem)
    with pytest.raises(CertificateError):
        served.watch()


def test_unchanged_files_give_nothing_new(served: Served,
                                          caplog: pytest.LogCaptureFixture) -> None:
    watched = served.watch()
    with caplog.at_level(logging.INFO, logger="relay.tls"):
        assert watched.refresh() is None
        assert watched.refresh() is None
    assert watched.current.cert_pem == served.first.cert_pem
    assert caplog.records == []


def test_a_new_valid_pair_is_taken(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    watched = served.watch()
    new = served.next_leaf()
    replace(served.cert_file, new.cert_pem)
    replace(served.key_file, new.key_pem)
    with caplog.at_level(logging.INFO, logger="relay.tls"):
        pair = watched.refresh()
    assert pair is not None
    assert (pair.cert_pem, pair.key_pem) == (new.cert_pem, new.key_pem)
    assert watched.current is pair
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, f"TLS certificate {served.cert_file} reloaded; it expires "
                       f"{pair.not_after}")]
    assert watched.refresh() is None  # taken once


def test_a_file_rewritten_in_place_is_noticed(served: Served) -> None:
    watched = served.watch()
    new = served.next_leaf()
    served.cert_file.write_bytes(new.cert_pem)
    served.key_file.write_bytes(new.key_pem)
    # Make sure the change shows even where mtime is coarse and the sizes are equal.
    for path in (served.cert_file, served.key_file):
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    pair = watched.refresh()
    assert pair is not None and pair.cert_pem == new.cert_pem


def test_a_new_client_ca_is_taken(served: Served, tmp_path: Path) -> None:
    watched = served.watch()
    other = Authority(tmp_path, "other")
    replace(served.ca_file, served.authority.cert_pem + other.cert_pem)
    pair = watched.refresh()
    assert pair is not None
    assert pair.client_ca_pem == served.authority.cert_pem + other.cert_pem
    assert pair.cert_pem == served.first.cert_pem


def test_a_half_rotated_pair_is_not_served_until_the_key_follows(
        served: Served, caplog: pytest.LogCaptureFixture) -> None:
    watched = served.watch()
    first = watched.current
    new = served.next_leaf()
    with caplog.at_level(logging.INFO, logger="relay.tls"):
        replace(served.cert_file, new.cert_pem)  # the certificate first, the old key still
        assert watched.refresh() is None
        assert watched.current is first
        assert watched.refresh() is None  # the same half-rotated files: logged once
        assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
            (logging.WARNING,
             f"TLS files changed but are not usable yet (key {served.key_file} is not the "
             f"key of certificate {served.cert_file}); still serving the certificate that "
             f"expires {first.not_after}")]
        caplog.clear()
        replace(served.key_file, new.key_pem)
        pair = watched.refresh()
    assert pair is not None and pair.cert_pem == new.cert_pem and pair.key_pem == new.key_pem
    assert watched.current is pair
    assert [r.levelno for r in caplog.records] == [logging.INFO]


def test_a_key_rotated_before_its_certificate_waits_too(served: Served) -> None:
    watched = served.watch()
    new = served.next_leaf()
    replace(served.key_file, new.key_pem)
    assert watched.refresh() is None
    assert watched.current.key_pem == served.first.key_pem
    replace(served.cert_file, new.cert_pem)
    pair = watched.refresh()
    assert pair is not None and pair.key_pem == new.key_pem


def test_each_broken_change_is_logged_once(served: Served,
                                           caplog: pytest.LogCaptureFixture) -> None:
    watched = served.watch()
    with caplog.at_level(logging.WARNING, logger="relay.tls"):
        replace(served.cert_file, served.next_leaf().cert_pem)
        assert watched.refresh() is None
        replace(served.cert_file, served.next_leaf().cert_pem)
        assert watched.refresh() is None
        assert watched.refresh() is None
    assert len(caplog.records) == 2


def test_a_file_missing_mid_rotation_is_waited_for(served: Served,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    watched = served.watch()
    first = watched.current
    new = served.next_leaf()
    with caplog.at_level(logging.INFO, logger="relay.tls"):
        served.key_file.unlink()
        replace(served.cert_file, new.cert_pem)
        assert watched.refresh() is None
        assert watched.refresh() is None
        assert watched.current is first
        assert caplog.records == []
        served.key_file.write_bytes(new.key_pem)
        pair = watched.refresh()
    assert pair is not None and pair.cert_pem == new.cert_pem


def test_a_kubernetes_secret_volume_swap_is_noticed(authority: Authority,
                                                    tmp_path: Path) -> None:
    # kubelet writes a new timestamped directory, then renames a ..data symlink
    # over the old one; tls.crt and tls.key are symlinks through ..data.
    volume = tmp_path / "volume"
    volume.mkdir()

    def write_generation(name: str, leaf: Leaf) -> None:
        directory = volume / name
        directory.mkdir()
        (directory / "tls.crt").write_bytes(leaf.cert_pem)
        (directory / "tls.key").write_bytes(leaf.key_pem)
        (directory / "ca.crt").write_bytes(authority.cert_pem)
        (volume / "..data_tmp").symlink_to(name)
        os.replace(volume / "..data_tmp", volume / "..data")

    old, new = authority.relay_leaf("old"), authority.relay_leaf("new")
    write_generation("..2026_01_01_00_00_00.1", old)
    for name in ("tls.crt", "tls.key", "ca.crt"):
        (volume / name).symlink_to(f"..data/{name}")
    watched = WatchedKeyPair(volume / "tls.crt", volume / "tls.key", volume / "ca.crt")
    assert watched.current.cert_pem == old.cert_pem
    assert watched.refresh() is None

    write_generation("..2026_02_01_00_00_00.2", new)
    for stale in (volume / "..2026_01_01_00_00_00.1").iterdir():
        stale.unlink()
    (volume / "..2026_01_01_00_00_00.1").rmdir()
    pair = watched.refresh()
    assert pair is not None
    assert (pair.cert_pem, pair.key_pem) == (new.cert_pem, new.key_pem)
    assert watched.refresh() is None
