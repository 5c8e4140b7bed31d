"""Corrupted and incompatible payloads are refused with a PayloadError saying why."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest

import spark_keras as sk
from spark_keras.payload import format as fmt
from tests import models


@pytest.fixture(scope="module")
def payload() -> bytes:
    return sk.dumps(models.mlp())


def rewrite_header(data: bytes, edit) -> bytes:
    """Change header fields and re-seal the header checksum (the body stays as is)."""
    _, version, header_len, _ = struct.unpack_from("<8sII32s", data)
    header = json.loads(data[48 : 48 + header_len])
    edit(header)
    new_header = json.dumps(header).encode()
    body = data[len(data) - header["body_nbytes"]:]
    head = struct.pack("<8sII32s", fmt.MAGIC, version, len(new_header),
                       hashlib.sha256(new_header).digest()) + new_header
    head += bytes(-len(head) % 64)
    return head + body


def test_truncated(payload):
    for cut in (10, 60, len(payload) // 2, len(payload) - 1):
        with pytest.raises(sk.PayloadError, match="truncated"):
            sk.loads(payload[:cut])


def test_flipped_byte_in_body(payload):
    corrupted = bytearray(payload)
    corrupted[-100] ^= 0x01
    with pytest.raises(sk.PayloadError, match="body checksum"):
        sk.loads(corrupted)


@pytest.fixture(scope="module")
def large_payload() -> bytes:
    data = sk.dumps(models.mlp(n_features=1100, hidden=1024))  # a 4.5 MB kernel
    assert fmt.unpack(data).body.nbytes >= fmt.BodyCheck.THREAD_THRESHOLD  # threaded digest
    return data


def body_offset(data: bytes, kind: str) -> int:
    """Where the first section of ``kind`` starts, from the start of ``data``."""
    unpacked = fmt.unpack(data)
    section = next(s for s in unpacked.sections if s.kind == kind)
    return len(data) - unpacked.body.nbytes + section.offset


@pytest.mark.parametrize("where", ["tensor", "config"])
def test_flipped_byte_in_large_body(large_payload, where):
    """Bodies >= 4 MiB are hashed in a thread while Keras rebuilds: still refused, and
    refused as corrupted even when the flipped byte breaks the config first."""
    corrupted = bytearray(large_payload)
    corrupted[body_offset(large_payload, where) + (2_000_000 if where == "tensor" else 2)] ^= 0x04
    with pytest.raises(sk.PayloadError, match="body checksum mismatch"):
        sk.loads(corrupted)
    with pytest.raises(sk.PayloadError, match="body checksum mismatch"):
        fmt.unpack(corrupted)


def test_format_version_zero(payload):
    old = payload[:8] + struct.pack("<I", 0) + payload[12:]
    with pytest.raises(sk.PayloadError, match="format version 0 is invalid"):
        sk.loads(old)


@pytest.mark.parametrize("extra", [1, 64, 4096])
def test_trailing_bytes(payload, extra):
    with pytest.raises(sk.PayloadError, match=f"{extra} unexpected trailing bytes"):
        sk.loads(payload + bytes(extra))


def test_header_over_the_limit():
    """A header length over MAX_HEADER_BYTES is refused for that reason, even when the
    data is long enough to hold it (so it is not a truncation)."""
    claimed = fmt.MAX_HEADER_BYTES + 1
    data = struct.pack("<8sII32s", fmt.MAGIC, fmt.FORMAT_VERSION, claimed, bytes(32))
    data += bytes(claimed + 64)
    with pytest.raises(sk.PayloadError) as refused:
        sk.loads(data)
    message = str(refused.value)
    assert "header" in message and "truncated" not in message, message
    assert str(fmt.MAX_HEADER_BYTES) in message or "64 MiB" in message, message


def test_flipped_byte_in_header(payload):
    corrupted = bytearray(payload)
    corrupted[60] ^= 0x20
    with pytest.raises(sk.PayloadError, match="header checksum"):
        sk.loads(corrupted)


def test_wrong_magic(payload):
    with pytest.raises(sk.PayloadError, match="magic"):
        sk.loads(b"PK\x03\x04" + payload[4:])


def test_newer_format_version(payload):
    newer = payload[:8] + struct.pack("<I", fmt.FORMAT_VERSION + 1) + payload[12:]
    with pytest.raises(sk.PayloadError, match="newer"):
        sk.loads(newer)


def test_flavour_mismatch(payload):
    def to_tf_keras(header):
        header["keras"].update(flavour="tf_keras", version="2.21.0")

    with pytest.raises(sk.PayloadError, match="tf_keras.*TF_USE_LEGACY_KERAS"):
        sk.loads(rewrite_header(payload, to_tf_keras))


def test_keras_major_mismatch(payload):
    def to_keras4(header):
        header["keras"]["version"] = "4.0.0"

    with pytest.raises(sk.PayloadError, match="Keras 4.0.0"):
        sk.loads(rewrite_header(payload, to_keras4))


def test_huge_tensor_claim_is_refused_without_allocating(payload):
    def huge(header):
        section = next(s for s in header["sections"] if s["kind"] == "tensor")
        section["shape"] = [1 << 20, 1 << 18]  # 1 TiB of float32
        section["nbytes"] = 1 << 40

    with pytest.raises(sk.PayloadError, match="outside"):
        sk.loads(rewrite_header(payload, huge))


def test_shape_that_does_not_match_bytes(payload):
    def reshape(header):
        section = next(s for s in header["sections"] if s["kind"] == "tensor")
        section["shape"] = [3]

    with pytest.raises(sk.PayloadError, match="needs"):
        sk.loads(rewrite_header(payload, reshape))


def test_not_bytes():
    with pytest.raises(sk.PayloadError, match="bytes"):
        sk.loads("not a payload")


def test_missing_file(tmp_path):
    with pytest.raises(sk.PayloadError, match="missing.skp"):
        sk.load(tmp_path / "missing.skp")


def test_payload_error_is_a_value_error():
    assert issubclass(sk.PayloadError, ValueError)
    assert issubclass(sk.PayloadError, sk.SparkKerasError)
