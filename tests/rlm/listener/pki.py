"""Certificates for the history endpoint's TLS tests, made at test time with ``cryptography`` (EC keys: milliseconds):
a CA, the endpoint's certificate (127.0.0.1, localhost) and client certificates with the subjects asked for."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Pki", "make_pki"]


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path  # the endpoint's: SAN 127.0.0.1, localhost
    key: Path
    client_cert: Path  # the first client's
    client_key: Path
    clients: dict[str, tuple[Path, Path]]  # subject (as given) -> (certificate, key)


def _name(subject: str) -> x509.Name:
    """``CN=a,OU=b,O=c`` (RFC 4514, most specific first) or a bare common name."""
    if "=" not in subject:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    return x509.Name.from_rfc4514_string(subject)


def make_pki(d: Path, clients: tuple[str, ...] = ("reader",)) -> Pki:
    now = datetime.datetime.now(datetime.UTC)

    def write_key(key: Any, path: Path) -> Path:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        return path

    def write_cert(cert: x509.Certificate, path: Path) -> Path:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("rlm test CA")
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))

    def leaf(subject: str, usage: Any, san: list[Any] | None) -> tuple[Any, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        b = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(ca.subject)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return key, b.sign(ca_key, hashes.SHA256())

    server_key, server_cert = leaf("127.0.0.1", ExtendedKeyUsageOID.SERVER_AUTH,
                                   [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])
    made: dict[str, tuple[Path, Path]] = {}
    for i, subject in enumerate(clients):
        key, cert = leaf(subject, ExtendedKeyUsageOID.CLIENT_AUTH, None)
        made[subject] = (write_cert(cert, d / f"client-{i}.pem"), write_key(key, d / f"client-{i}.key"))
    first = made[clients[0]]
    return Pki(ca=write_cert(ca, d / "ca.pem"), cert=write_cert(server_cert, d / "server.pem"),
               key=write_key(server_key, d / "server.key"), client_cert=first[0], client_key=first[1], clients=made)
