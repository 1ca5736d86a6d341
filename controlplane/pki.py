"""The certificates and keys of one control plane, made fresh for each run: a CA, the API server's serving
certificate for loopback, an admin client certificate (group system:masters) and the service-account
signing key pair that the TokenRequest API signs tokens with. `client` issues more client certificates from
the same CA (the real node's kubelet, kube-scheduler, kube-proxy: controlplane/node.py), and `front_proxy`
the aggregation layer's own CA and client certificate."""
from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The `kubernetes` Service's ClusterIP (the first address of kube-apiserver's --service-cluster-ip-range), and the
# real node's address inside its network namespace (controlplane/node.py), where a forwarder reaches kube-apiserver:
# pods' in-cluster clients and the kubelet check the serving certificate against them.
SERVICE_IP = "10.0.0.1"
NODE_IP = "10.200.0.1"


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    admin_cert: Path
    admin_key: Path
    sa_public: Path
    sa_private: Path

    @property
    def ca_key(self) -> Path:
        return self.ca_cert.with_name("ca.key")


def _name(common: str, organization: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common)]
    if organization:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(parts)


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def make(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    later = now + datetime.timedelta(days=30)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("vmevents-local-ca")).issuer_name(_name("vmevents-local-ca"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now).not_valid_after(later)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))

    def leaf(subject: x509.Name, usage, san: list | None = None):
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now).not_valid_after(later)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(ca_key, hashes.SHA256()), key

    server, server_key = leaf(_name("kube-apiserver"), ExtendedKeyUsageOID.SERVER_AUTH, [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address(SERVICE_IP)), x509.IPAddress(ipaddress.ip_address(NODE_IP)),
        x509.DNSName("kubernetes"), x509.DNSName("kubernetes.default"), x509.DNSName("kubernetes.default.svc")])
    admin, admin_key = leaf(_name("vmevents-admin", "system:masters"), ExtendedKeyUsageOID.CLIENT_AUTH)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = serialization.Encoding.PEM
    _write(directory / "ca.key", _pem_key(ca_key))
    return Pki(
        ca_cert=_write(directory / "ca.crt", ca.public_bytes(pem)),
        server_cert=_write(directory / "apiserver.crt", server.public_bytes(pem)),
        server_key=_write(directory / "apiserver.key", _pem_key(server_key)),
        admin_cert=_write(directory / "admin.crt", admin.public_bytes(pem)),
        admin_key=_write(directory / "admin.key", _pem_key(admin_key)),
        sa_public=_write(directory / "sa.pub", sa_key.public_key().public_bytes(
            pem, serialization.PublicFormat.SubjectPublicKeyInfo)),
        sa_private=_write(directory / "sa.key", _pem_key(sa_key)),
    )


def _issue(ca_cert: Path, ca_key: Path, subject: x509.Name, usage, san: list | None = None):
    ca = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    signer = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=30))
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(signer, hashes.SHA256()), key  # type: ignore[arg-type]


def client(pki: Pki, name: str, common: str, organization: str | None = None) -> tuple[Path, Path]:
    """A client certificate of the control plane's CA for `common` (the user) in `organization` (its group), as
    kube-apiserver's x509 authenticator reads them: the kubelet's `system:node:<node>` in `system:nodes`."""
    cert, key = _issue(pki.ca_cert, pki.ca_key, _name(common, organization), ExtendedKeyUsageOID.CLIENT_AUTH)
    directory = pki.ca_cert.parent
    return (_write(directory / f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM)),
            _write(directory / f"{name}.key", _pem_key(key)))


@dataclass(frozen=True)
class FrontProxy:
    """The aggregation layer's credentials: kube-apiserver proxies a request to an aggregated API server (virt-api's
    subresources) with this client certificate, and the aggregated server trusts the user it names in
    X-Remote-User only from a certificate of this CA (published in kube-system/extension-apiserver-authentication)."""
    ca_cert: Path
    client_cert: Path
    client_key: Path
    client_name: str = "front-proxy-client"


def front_proxy(directory: Path) -> FrontProxy:
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("vmevents-front-proxy-ca"))
          .issuer_name(_name("vmevents-front-proxy-ca")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now)
          .not_valid_after(now + datetime.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    ca_path = _write(directory / "front-proxy-ca.crt", ca.public_bytes(serialization.Encoding.PEM))
    ca_key_path = _write(directory / "front-proxy-ca.key", _pem_key(ca_key))
    cert, key = _issue(ca_path, ca_key_path, _name(FrontProxy.client_name), ExtendedKeyUsageOID.CLIENT_AUTH)
    return FrontProxy(ca_path, _write(directory / "front-proxy-client.crt",
                                      cert.public_bytes(serialization.Encoding.PEM)),
                      _write(directory / "front-proxy-client.key", _pem_key(key)))
