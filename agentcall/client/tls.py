"""TLS trust for connections to the relay.

The relay certificate is always verified, and its name checked against the host we dialled
(service-identity, through :func:`twisted.internet.ssl.optionsForClientTLS`). What is trusted is
either the platform's roots or, for a private relay, one CA file: given explicitly (``--ca-file``
or config ``ca_file``) or through ``SSL_CERT_FILE``. There is no switch that turns checking off.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.internet.ssl import (
    Certificate,
    optionsForClientTLS,
    platformTrust,
    trustRootFromCertificates,
)
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer

from agentcall.errors import AgentCallError

# An TrustRoot provider. The interface lives in a private Twisted module and zope
# declarations are invisible to mypy, so the alias only documents intent.
TrustRoot = Any

CA_FILE_ENV = "SSL_CERT_FILE"
# A CA bundle is a few hundred kilobytes at most; refuse to read something unreasonable.
_MAX_CA_FILE_BYTES = 8 * 1024 * 1024


class CaFileError(AgentCallError):
    """The CA file to trust is missing, unreadable, or holds no PEM certificate."""


def chosen_ca_file(ca_file: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The CA file to trust: the explicit one first, then ``SSL_CERT_FILE``, else None."""
    if ca_file:
        return ca_file
    env = os.environ if environ is None else environ
    return env.get(CA_FILE_ENV) or None


def load_ca_certificates(path: str) -> list[Certificate]:
    """Every certificate in a PEM file, as Twisted certificates."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(_MAX_CA_FILE_BYTES + 1)
    except OSError as exc:
        raise CaFileError(f"cannot read CA file {path}: {exc.strerror or exc}") from None
    if len(data) > _MAX_CA_FILE_BYTES:
        raise CaFileError(f"CA file {path} is larger than {_MAX_CA_FILE_BYTES} bytes")
    try:
        parsed = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise CaFileError(f"CA file {path} holds no PEM certificate") from None
    return [Certificate.loadPEM(cert.public_bytes(Encoding.PEM)) for cert in parsed]


def trust_root(ca_file: str | None = None, environ: Mapping[str, str] | None = None) -> TrustRoot:
    """The roots to verify the relay against: the chosen CA file, or the platform's."""
    return roots_from(chosen_ca_file(ca_file, environ))


def roots_from(path: str | None) -> TrustRoot:
    """The certificates in ``path`` as a trust root, or the platform's roots for None."""
    if path is None:
        return platformTrust()
    return trustRootFromCertificates(load_ca_certificates(path))


def client_tls_options(hostname: str, trust: TrustRoot) -> IOpenSSLClientConnectionCreator:
    """Connection options that verify the chain to ``trust`` and the name ``hostname``."""
    return optionsForClientTLS(hostname, trustRoot=trust)


@implementer(IPolicyForHTTPS)
class RelayTlsPolicy:
    """The ``contextFactory`` for :class:`twisted.web.client.Agent` when talking to a relay.

    Like ``BrowserLikePolicyForHTTPS`` but with our choice of roots. The CA file is read once,
    when the policy is built, so a bad path is reported before anything is dialled.
    """

    def __init__(
        self, ca_file: str | None = None, *, environ: Mapping[str, str] | None = None
    ) -> None:
        self.ca_file = chosen_ca_file(ca_file, environ)
        self.trust = roots_from(self.ca_file)

    def creatorForNetloc(self, hostname: bytes, port: int) -> IOpenSSLClientConnectionCreator:
        return client_tls_options(hostname.decode("ascii"), self.trust)

    def for_host(self, hostname: str) -> IOpenSSLClientConnectionCreator:
        return client_tls_options(hostname, self.trust)
