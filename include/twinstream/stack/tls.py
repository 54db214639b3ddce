"""TLS material of a stack: a private CA and one certificate its servers share.

Guarantee: `ensure_tls` leaves a CA and a certificate it signed, for every name and address
given, valid for at least `RENEW_BEFORE` more, as PEM files only the owner can read (the
folder 0700, the files 0600). It makes nothing when they are there and fit; it renews the
certificate (not the CA, which clients trust) when a name is missing or it expires soon,
and both when the CA itself expires soon. Kafka (brokers and clients, Java and librdkafka),
ZooKeeper, uvicorn and httpx all read these PEM files as they are.

Keys are EC P-256, PKCS#8 and unencrypted: Kafka's PEM key store reads PKCS#8 only, and an
encrypted key would need its password next to it in the same folder anyway.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from twinstream.platform.kafka import admin_config
from twinstream.platform.settings import Settings

CA_DAYS = 3650
CERT_DAYS = 825
RENEW_BEFORE = timedelta(days=30)
# The subject of the servers' certificate. Kafka's controllers authenticate one another
# with it (mutual TLS), as the principal User:CN=twinstream-server; keep it a bare CN.
SERVER_CN = "twinstream-server"


@dataclass(frozen=True)
class TlsFiles:
    folder: Path

    @property
    def ca(self) -> Path:
        """The CA's certificate: what every client trusts."""
        return self.folder / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.folder / "ca-key.pem"

    @property
    def cert(self) -> Path:
        return self.folder / "server.pem"

    @property
    def key(self) -> Path:
        return self.folder / "server-key.pem"

    @property
    def bundle(self) -> Path:
        """Key and certificate in one file: Kafka's PEM key store (ssl.keystore.location)."""
        return self.folder / "server-bundle.pem"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    tmp.replace(path)


def _subject_alt_names(names: Sequence[str]) -> list[x509.GeneralName]:
    result: list[x509.GeneralName] = []
    for name in names:
        try:
            result.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            result.append(x509.DNSName(name))
    return result


def _valid(cert: x509.Certificate, now: datetime) -> bool:
    return cert.not_valid_after_utc - now > RENEW_BEFORE


def _new_ca(now: datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("Twinstream local CA"))
        .issuer_name(_name("Twinstream local CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _new_cert(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    names: Sequence[str],
    now: datetime,
    days: int,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(SERVER_CN))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(_subject_alt_names(names)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        # Server and client: a Kafka controller is both to its peers.
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def ensure_tls(
    folder: Path,
    names: Sequence[str] = ("127.0.0.1", "localhost"),
    now: datetime | None = None,
    cert_days: int = CERT_DAYS,
) -> tuple[TlsFiles, bool]:
    """The stack's TLS files in `folder`, made or renewed as the module says; (files,
    whether anything was written)."""
    now = now or datetime.now(UTC)
    files = TlsFiles(folder)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    loaded_ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate] | None = None
    if files.ca.exists() and files.ca_key.exists():
        ca_cert = x509.load_pem_x509_certificate(files.ca.read_bytes())
        loaded = serialization.load_pem_private_key(files.ca_key.read_bytes(), password=None)
        if isinstance(loaded, ec.EllipticCurvePrivateKey) and _valid(ca_cert, now):
            loaded_ca = (loaded, ca_cert)
    renew_ca = loaded_ca is None
    if loaded_ca is None:
        ca_key, ca_cert = _new_ca(now)
        _write_private(files.ca_key, _key_pem(ca_key))
        _write_private(files.ca, ca_cert.public_bytes(serialization.Encoding.PEM))
    else:
        ca_key, ca_cert = loaded_ca
    fits = False
    if not renew_ca and files.cert.exists() and files.key.exists() and files.bundle.exists():
        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        fits = _valid(cert, now) and set(_subject_alt_names(names)) <= set(san)
    if fits:
        return files, renew_ca
    key, cert = _new_cert(ca_key, ca_cert, names, now, cert_days)
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    _write_private(files.key, _key_pem(key))
    _write_private(files.cert, cert_pem)
    _write_private(files.bundle, _key_pem(key) + cert_pem)
    return files, True


def kafka_superuser_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """An admin client as the stack itself: the servers' certificate over the brokers'
    mutual-TLS listeners, a super user that needs no SCRAM user. For what only the stack
    does (`up`: users, ACLs, topics; its health checks), where the servers' key is; the
    admin's SCRAM login (twinstream.platform.kafka.admin_config) for everything else. Without Kafka
    security, that same admin_config."""
    if not settings.kafka_security:
        return admin_config(settings, **overrides)
    tls = TlsFiles(settings.tls_dir)
    plain = admin_config(settings.model_copy(update={"kafka_security": False}))
    return {
        **plain,
        "bootstrap.servers": settings.broker_listener_servers,
        "security.protocol": "SSL",
        "ssl.ca.location": str(tls.ca),
        # Who the stack is: User:CN=twinstream-server, a super user (render.kafka_listeners).
        "ssl.certificate.location": str(tls.cert),
        "ssl.key.location": str(tls.key),
        **overrides,
    }
