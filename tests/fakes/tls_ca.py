"""A certificate authority made for one test, and a server certificate it signs for the names a fake
answers as (provider hosts, 127.0.0.1). Nothing trusts it but what the test points at its file.

    ca = TestCa.create(folder, ["api.anthropic.com", "127.0.0.1"])
    ca.ca_file, ca.cert_file, ca.key_file   # PEM files: the CA (to trust), the server's pair (to serve)
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ISSUER = "Conclave test CA"


@dataclass(frozen=True)
class TestCa:
    ca_file: Path
    cert_file: Path
    key_file: Path

    __test__ = False  # its name is not a pytest class's

    @classmethod
    def create(cls, folder: Path, names: Sequence[str]) -> TestCa:
        """The CA and a server certificate for `names` (DNS names or IP addresses), valid for a day."""
        folder.mkdir(parents=True, exist_ok=True)
        ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
        ca = _certificate(ISSUER, ca_key, ca_key, ca=True)
        server = _certificate(names[0], server_key, ca_key, ca=False, names=names)
        found = cls(folder / "ca.pem", folder / "server.pem", folder / "server.key")
        found.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        found.cert_file.write_bytes(server.public_bytes(serialization.Encoding.PEM))
        found.key_file.write_bytes(
            server_key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        found.key_file.chmod(0o600)
        return found


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    signer: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
    names: Sequence[str] = (),
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    if ca:
        builder = builder.add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
        )
    else:
        # rustls (Codex) insists on a leaf with SANs and serverAuth; the names are what clients check
        builder = (
            builder.add_extension(x509.SubjectAlternativeName([_san(n) for n in names]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False
            )
        )
    return builder.sign(signer, hashes.SHA256())
