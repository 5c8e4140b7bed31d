"""The channel's credentials: the driver's TLS key and certificate, and scoped tokens.

The key and a self-signed certificate are made in memory for each channel
(:func:`tls_context`); workers pin the certificate's fingerprint (:mod:`.client`). A
token is made for one *scope* (:func:`model_scope`, :func:`budget_scope`) from the
server's secret, which never leaves the driver (:func:`scoped_token`); the channel
reads the scope back from a request's token, checked in constant time
(:func:`token_scope`), and its answers refuse a request outside that scope
(:mod:`.answers`): a token travels with one handle's plans and reads nothing of another's.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import ssl
import tempfile
import urllib.parse


def model_scope(name: str) -> str:
    """The scope of handle ``name``'s token: its ``/resolve`` and ``/payload``."""
    return f"model:{name}"


def budget_scope(key: str) -> str:
    """The scope of budget ``key``'s token: its ``/invalid`` reports."""
    return f"budget:{key}"


def handle_of(scope: str) -> str | None:
    """The handle whose token was made for ``scope`` (None: not a handle's)."""
    return scope[len("model:"):] if scope.startswith("model:") else None


def scoped_token(secret: bytes, scope: str) -> str:
    """The token of ``scope`` (``model:<handle>``, ``budget:<key>``...): the scope
    (percent-encoded) and, after a dot, its HMAC-SHA256 under the server's ``secret``
    (hex). Its holder can show it for that scope only: :func:`token_scope`."""
    quoted = urllib.parse.quote(scope, safe=":")
    return f"{quoted}.{hmac.new(secret, quoted.encode(), hashlib.sha256).hexdigest()}"


def token_scope(secret: bytes, token: bytes) -> str | None:
    """The scope ``token`` was made for with ``secret`` (:func:`scoped_token`; compared
    in constant time), else None."""
    quoted, _, mac = token.rpartition(b".")
    expected = hmac.new(secret, quoted, hashlib.sha256).hexdigest().encode()
    if not quoted or not hmac.compare_digest(mac, expected):
        return None
    return urllib.parse.unquote(quoted.decode("ascii"))  # made by scoped_token: ASCII


def tls_context() -> tuple[ssl.SSLContext, str]:
    """A TLS server context with a fresh EC P-256 key and a self-signed certificate,
    and the certificate's SHA-256 fingerprint (hex, of its DER form). The key is made
    in memory; ``ssl`` loads it from a file only, written in a private temporary folder
    (mode 0700, the file 0600) and removed at once."""
    from spark_keras._deps import require

    require("cryptography", "the driver's channel (its TLS certificate)", extra="spark")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "spark_keras driver channel")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(days=1))
                   .not_valid_after(now + datetime.timedelta(days=3650))
                   .sign(key, hashes.SHA256()))
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()) + \
        certificate.public_bytes(serialization.Encoding.PEM)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.num_tickets = 0  # clients never resume a session: no tickets to make
    with tempfile.TemporaryDirectory(prefix="spark_keras_tls_") as folder:
        path = os.path.join(folder, "key.pem")
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(pem)
        context.load_cert_chain(path)
    fingerprint = hashlib.sha256(certificate.public_bytes(serialization.Encoding.DER)).hexdigest()
    return context, fingerprint
