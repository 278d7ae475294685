"""A throw-away certificate authority and a server certificate for the dev cluster's TLS listeners.

Generated at fixture time with the ``cryptography`` package (no openssl or keytool on the path needed):

- ``ca.pem``: the CA certificate (PEM), what clients trust (librdkafka's ``ssl.ca.location``, the broker's
  ``ssl.truststore.location`` with ``ssl.truststore.type=PEM``);
- ``server.p12``: a PKCS#12 keystore holding the server's key and its certificate chain (leaf, then the CA),
  encrypted with ``keystore_password`` (the broker's ``ssl.keystore.location``, ``ssl.keystore.type=PKCS12``,
  ``ssl.keystore.password`` and ``ssl.key.password``: both the same password);
- ``server.pem`` / ``server-key.pem``: the same certificate chain and its unencrypted key in PEM.

The server certificate names ``127.0.0.1`` (IP SAN) and ``localhost`` (DNS SAN), so clients keep hostname
verification on (librdkafka's ``ssl.endpoint.identification.algorithm=https``, Kafka's default too).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TlsFiles", "make_tls_files"]


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Where :func:`make_tls_files` wrote the CA and the server's key material."""

    ca_pem: Path
    server_pem: Path
    server_key_pem: Path
    keystore_p12: Path
    keystore_password: str

    def __repr__(self) -> str:  # the password stays out of test reports
        return f"TlsFiles(ca_pem={self.ca_pem!s}, keystore_p12={self.keystore_p12!s}, keystore_password=***)"


def make_tls_files(directory: Path, keystore_password: str, *, days: int = 2,
                   hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> TlsFiles:
    """Create a CA and a server certificate for ``hosts`` under ``directory`` (see the module docstring)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import pkcs12
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    not_before, not_after = now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rlm dev cluster CA")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    pem = serialization.Encoding.PEM
    files = TlsFiles(ca_pem=directory / "ca.pem", server_pem=directory / "server.pem",
                     server_key_pem=directory / "server-key.pem", keystore_p12=directory / "server.p12",
                     keystore_password=keystore_password)
    files.ca_pem.write_bytes(ca_cert.public_bytes(pem))
    files.server_pem.write_bytes(cert.public_bytes(pem) + ca_cert.public_bytes(pem))
    files.server_key_pem.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    files.server_key_pem.chmod(0o600)
    files.keystore_p12.write_bytes(pkcs12.serialize_key_and_certificates(
        b"server", key, cert, [ca_cert],
        serialization.BestAvailableEncryption(keystore_password.encode())))
    files.keystore_p12.chmod(0o600)
    return files
