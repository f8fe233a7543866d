"""Certificates for a TLS Kafka listener on loopback: a throwaway CA, the broker's PKCS12 key store and a
client's PEM key and chain. For the tests and the demo only; nothing here is fit for production."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

from dev.process import LOOPBACK

VALID_DAYS = 7


@dataclass(frozen=True)
class TlsFiles:
    ca_pem: Path  # the CA certificate: the clients' (and the broker's) trust store
    broker_keystore: Path  # PKCS12: the broker's key and certificate
    keystore_password: str
    client_pem: Path  # the client's private key (PKCS#8) and certificate, in one PEM file


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Certificate | None,
    issuer_key: ec.EllipticCurvePrivateKey, ca: bool,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer.subject if issuer else _name(subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(LOOPBACK))]),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def create_tls_files(directory: Path, password: str = "tierlog-test") -> TlsFiles:
    """A CA, a broker certificate for 127.0.0.1 and a client certificate, written under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("tierlog test CA", ca_key, None, ca_key, ca=True)
    broker_key = ec.generate_private_key(ec.SECP256R1())
    broker = _certificate("broker", broker_key, ca, ca_key, ca=False)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _certificate("tierlog-client", client_key, ca, ca_key, ca=False)

    files = TlsFiles(directory / "ca.pem", directory / "broker.p12", password, directory / "client.pem")
    files.ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.broker_keystore.write_bytes(pkcs12.serialize_key_and_certificates(
        b"broker", broker_key, broker, [ca], serialization.BestAvailableEncryption(password.encode())
    ))
    files.client_pem.write_bytes(
        client_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())
        + client.public_bytes(serialization.Encoding.PEM) + ca.public_bytes(serialization.Encoding.PEM)
    )
    files.client_pem.chmod(0o600)
    return files
