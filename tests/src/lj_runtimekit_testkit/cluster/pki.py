"""Certificates for the local control plane: a CA, the apiserver's serving certificate, the admin
client certificate (group ``system:masters``) and the service-account signing key."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=7)


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files written by :func:`write_pki`."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _issue(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    usages: list[x509.ObjectIdentifier] | None = None,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=not ca,
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
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def write_pki(
    directory: Path, service_ip: str = "10.96.0.1", extra_ips: tuple[str, ...] = ()
) -> Pki:
    """Write a fresh CA and the certificates the control plane needs into ``directory``.

    ``extra_ips`` join the serving certificate's IP SANs (the node bridge address, where real
    nodes reach the apiserver)."""
    directory.mkdir(parents=True, exist_ok=True)
    curve = ec.SECP256R1()
    ca_key = ec.generate_private_key(curve)
    ca_name = _name("lj-runtimekit-test-ca")
    ca = _issue(ca_name, ca_key, ca_name, ca_key, ca=True)

    serving_key = ec.generate_private_key(curve)
    dns = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    sans += [
        x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", service_ip, *extra_ips)
    ]
    serving = _issue(
        _name("kube-apiserver"),
        serving_key,
        ca_name,
        ca_key,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        sans=sans,
    )
    admin_key = ec.generate_private_key(curve)
    admin = _issue(
        _name("lj-runtimekit-admin", "system:masters"),
        admin_key,
        ca_name,
        ca_key,
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    pki = Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
    )
    pem = serialization.Encoding.PEM
    pki.ca_cert.write_bytes(ca.public_bytes(pem))
    pki.ca_key.write_bytes(_key_pem(ca_key))
    pki.serving_cert.write_bytes(serving.public_bytes(pem))
    pki.serving_key.write_bytes(_key_pem(serving_key))
    pki.admin_cert.write_bytes(admin.public_bytes(pem))
    pki.admin_key.write_bytes(_key_pem(admin_key))
    pki.sa_key.write_bytes(_key_pem(sa_key))
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    for key_file in (pki.ca_key, pki.serving_key, pki.admin_key, pki.sa_key):
        key_file.chmod(0o600)
    return pki


def issue_from_ca(
    pki: Pki,
    cert_path: Path,
    key_path: Path,
    cn: str,
    org: str | None = None,
    *,
    server_ips: tuple[str, ...] = (),
    dns_names: tuple[str, ...] = (),
) -> None:
    """Write a certificate signed by the harness CA: a client one (``cn``/``org``, e.g.
    ``system:node:<name>``/``system:nodes``), or also a serving one when ``server_ips`` or
    ``dns_names`` are given."""
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{pki.ca_key}: expected an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
    if sans:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    cert = _issue(_name(cn, org), key, ca.subject, ca_key, usages=usages, sans=sans or None)
    cert_path.parent.mkdir(parents=True, exist_ok=True)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(_key_pem(key))
    key_path.chmod(0o600)
