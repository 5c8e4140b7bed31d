"""A payload file's SHA-256, and the refusal of a file found written that is not the
payload its reader expects: the check :func:`.host_file.land` runs (``verify=``) before
a worker maps a file another process wrote (Spark executors' and Dask hosts' files)."""

from __future__ import annotations

import hashlib
import hmac

from spark_keras.errors import PayloadError
from spark_keras.payload import format as fmt
from spark_keras.payload import mapped

__all__ = ["file_digest", "verifies", "check_file", "altered"]


def file_digest(path: str) -> str:
    """The SHA-256 (hex) of the file at ``path``."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def verifies(path: str) -> bool:
    """True if the payload file at ``path`` is whole and passes its own digest."""
    view = mapped.map_file(path, copy_on_write=False)
    try:
        fmt.unpack(view)
        return True
    except PayloadError:
        return False
    finally:
        mapped.close(view)


def check_file(path: str, sha256: str, what: str, where: str = "this executor") -> None:
    """Refuse the payload file at ``path`` unless its SHA-256 is ``sha256``, the digest
    fixed where ``what`` (the model, named in the error) was shipped; a damaged file
    (one that fails its own digest) is let through: its load fails, and it is written
    again (:meth:`.Shipment.build_shared`)."""
    found = file_digest(path)
    if not hmac.compare_digest(found, sha256) and verifies(path):
        raise altered(path, what, f"has sha256 {found}, not {sha256}, the digest fixed as it "
                                  f"was shipped", where)


def altered(path: str, what: str, why: str, where: str = "this executor") -> PayloadError:
    """The refusal of a payload file found written that is not ``what`` but would load."""
    return PayloadError(f"the payload file {path} of {what} {why}: it was replaced or altered "
                        f"on {where} after it was written; refused, nothing was built from it "
                        f"(remove the file to have it written again)")
