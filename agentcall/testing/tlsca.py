"""A throwaway certificate authority for tests and demos.

``make_ca(directory)`` writes a CA certificate and key; ``ca.issue_server(directory, ...)``
writes a server certificate for the given names and addresses, signed by it. Private keys are
written 0600. :func:`ssl_endpoint_string` turns the files into a Twisted ``ssl:`` server
endpoint string, escaping paths so that any directory name works.

Never use these for anything real: the keys sit unencrypted next to the certificates.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=30)
# Certificates start a little in the past so a slightly slow clock still accepts them.
_BACKDATE = datetime.timedelta(hours=1)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        # The mode given to open() only applies to a new file; an old one keeps its own.
        os.fchmod(handle.fileno(), 0o600)
        handle.write(data)


def _write_public(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o644)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _escape(value: str) -> str:
    """Escape a value for a Twisted endpoint string, where ':' and '=' are separators."""
    return value.replace("\\", "\\\\").replace(":", "\\:").replace("=", "\\=")


def ssl_endpoint_string(
    port: int,
    cert_file: str | os.PathLike[str],
    key_file: str | os.PathLike[str],
    *,
    interface: str | None = "127.0.0.1",
) -> str:
    """``ssl:PORT:privateKey=KEY:certKey=CERT[:interface=ADDR]`` with every path escaped."""
    parts = [
        "ssl",
        str(port),
        f"privateKey={_escape(os.fspath(key_file))}",
        f"certKey={_escape(os.fspath(cert_file))}",
    ]
    if interface is not None:
        parts.append(f"interface={_escape(interface)}")
    return ":".join(parts)


@attrs.frozen
class ServerCert:
    """The files of one server certificate, and the CA certificate clients should trust."""

    cert_file: Path
    key_file: Path
    ca_cert_file: Path
    hostnames: tuple[str, ...]
    ips: tuple[str, ...]

    def endpoint_string(self, port: int = 0, *, interface: str | None = "127.0.0.1") -> str:
        return ssl_endpoint_string(port, self.cert_file, self.key_file, interface=interface)


@attrs.frozen
class CA:
    """A CA whose key stays in memory (and in ``key_file``) to sign server certificates."""

    cert_file: Path
    key_file: Path
    certificate: x509.Certificate = attrs.field(repr=False)
    _key: ec.EllipticCurvePrivateKey = attrs.field(repr=False, alias="key")

    def issue_server(
        self,
        directory: str | os.PathLike[str],
        hostnames: Sequence[str] = ("localhost",),
        ips: Sequence[str] = ("127.0.0.1",),
        *,
        name: str = "server",
        now: datetime.datetime | None = None,
    ) -> ServerCert:
        """Write ``NAME.pem`` and ``NAME.key`` for these names and addresses into directory."""
        if not hostnames and not ips:
            raise ValueError("a server certificate needs at least one name or address")
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        start = (now or datetime.datetime.now(datetime.UTC)) - _BACKDATE
        key = ec.generate_private_key(ec.SECP256R1())
        alt_names: list[x509.GeneralName] = [x509.DNSName(h) for h in hostnames]
        alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        common_name = hostnames[0] if hostnames else ips[0]
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        cert_file, key_file = folder / f"{name}.pem", folder / f"{name}.key"
        _write_private(key_file, _key_pem(key))
        _write_public(cert_file, _cert_pem(cert))
        return ServerCert(cert_file, key_file, self.cert_file, tuple(hostnames), tuple(ips))


def make_ca(
    directory: str | os.PathLike[str],
    *,
    common_name: str = "AgentCall throwaway test CA",
    now: datetime.datetime | None = None,
) -> CA:
    """Create a CA and write ``ca.pem`` (certificate) and ``ca.key`` into directory."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    start = (now or datetime.datetime.now(datetime.UTC)) - _BACKDATE
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
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
    cert_file, key_file = folder / "ca.pem", folder / "ca.key"
    _write_private(key_file, _key_pem(key))
    _write_public(cert_file, _cert_pem(cert))
    return CA(cert_file, key_file, cert, key=key)
