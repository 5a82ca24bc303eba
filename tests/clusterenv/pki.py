"""A throw-away PKI for the local control plane, made with the openssl command line.

One CA signs the apiserver's serving certificate and every client certificate (CN = user,
O = group); a separate RSA key pair signs service-account tokens.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

# 10.96.0.1 is the first address of the service range, what in-cluster clients dial.
APISERVER_SANS = (
    "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:127.0.0.1,IP:10.96.0.1"
)


@dataclass(frozen=True)
class ClientCert:
    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _signed(directory: Path, name: str, subject: str, extensions: str) -> ClientCert:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", subject, cwd=directory)  # fmt: skip
    (directory / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.crt", "-days", "7", "-extfile", f"{name}.ext", cwd=directory)  # fmt: skip
    return ClientCert(directory / f"{name}.crt", directory / f"{name}.key")


@dataclass(frozen=True)
class Pki:
    directory: Path
    ca_cert: Path
    ca_key: Path
    apiserver: ClientCert
    admin: ClientCert
    controller_manager: ClientCert
    scheduler: ClientCert
    sa_key: Path
    sa_pub: Path

    def client(self, name: str, user: str, group: str | None = None) -> ClientCert:
        """Another client certificate, e.g. for a test user with limited RBAC."""
        subject = f"/CN={user}" + (f"/O={group}" if group else "")
        return _signed(self.directory, name, subject, "extendedKeyUsage=clientAuth\n")


def make_pki(directory: Path, addresses: tuple[str, ...] = ()) -> Pki:
    """`addresses`: more IP addresses the API server's certificate is valid for."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "7", "-subj", "/CN=servinglab-test-ca",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", cwd=directory)  # fmt: skip
    client_ext = "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
    server_ext = (
        f"subjectAltName={','.join([APISERVER_SANS, *(f'IP:{address}' for address in addresses)])}\n"
        "extendedKeyUsage=serverAuth\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
    )
    apiserver = _signed(directory, "apiserver", "/CN=kube-apiserver", server_ext)
    admin = _signed(directory, "admin", "/CN=kubernetes-admin/O=system:masters", client_ext)
    kcm = _signed(directory, "kube-controller-manager", "/CN=system:kube-controller-manager", client_ext)
    scheduler = _signed(directory, "kube-scheduler", "/CN=system:kube-scheduler", client_ext)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
    for key in directory.glob("*.key"):
        key.chmod(0o600)
    return Pki(directory, directory / "ca.crt", directory / "ca.key", apiserver, admin, kcm, scheduler,
               directory / "sa.key", directory / "sa.pub")  # fmt: skip
