"""The stack's TLS material: made once, renewed when it must be, owner-only, and usable by
Python's ssl as a server (key + certificate) and a client (the CA)."""

from __future__ import annotations

import ssl
import stat
from datetime import UTC, datetime, timedelta

from cryptography import x509

from twinstream.stack.tls import RENEW_BEFORE, SERVER_CN, ensure_tls


def test_made_once_owner_only_and_loadable(tmp_path):
    files, wrote = ensure_tls(tmp_path / "tls")
    assert wrote
    assert stat.S_IMODE(files.folder.stat().st_mode) == 0o700
    for path in (files.ca, files.ca_key, files.cert, files.key, files.bundle):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(files.bundle)  # key and certificate in one file, as Kafka reads it
    client = ssl.create_default_context(cafile=str(files.ca))
    assert client.verify_mode == ssl.CERT_REQUIRED
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    assert cert.subject.rfc4514_string() == f"CN={SERVER_CN}"
    before = {p: p.read_bytes() for p in (files.ca, files.cert)}
    again, wrote = ensure_tls(tmp_path / "tls")
    assert not wrote
    assert {p: p.read_bytes() for p in (again.ca, again.cert)} == before


def test_a_new_name_or_a_near_expiry_renews_the_certificate_and_keeps_the_ca(tmp_path):
    files, _ = ensure_tls(tmp_path, names=["127.0.0.1"], cert_days=40)
    ca = files.ca.read_bytes()
    cert = files.cert.read_bytes()
    _, wrote = ensure_tls(tmp_path, names=["127.0.0.1", "kafka-1"], cert_days=40)
    assert wrote
    assert files.ca.read_bytes() == ca
    assert files.cert.read_bytes() != cert
    cert = files.cert.read_bytes()
    later = datetime.now(UTC) + timedelta(days=40) - RENEW_BEFORE + timedelta(days=1)
    _, wrote = ensure_tls(tmp_path, names=["127.0.0.1", "kafka-1"], now=later)
    assert wrote
    assert files.ca.read_bytes() == ca
    assert files.cert.read_bytes() != cert
    san = x509.load_pem_x509_certificate(files.cert.read_bytes()).extensions
    names = san.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["kafka-1"]
