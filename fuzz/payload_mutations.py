"""Mutations of valid payloads, shared by the hypothesis test and the atheris fuzzer."""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

from spark_keras.payload import format as fmt

PREAMBLE = struct.Struct("<8sII32s")


def split(data: bytes) -> tuple[int, dict, bytes]:
    _, version, header_len, _ = PREAMBLE.unpack_from(data)
    header = json.loads(data[48 : 48 + header_len])
    return version, header, data[len(data) - header["body_nbytes"]:]


def seal(version: int, header: dict, body: bytes, *, reseal_body: bool) -> bytes:
    """Re-pack with valid checksums so a mutation reaches the deeper checks."""
    if reseal_body:
        header = dict(header, body_sha256=hashlib.sha256(body).hexdigest(), body_nbytes=len(body))
    raw = json.dumps(header).encode()
    head = PREAMBLE.pack(fmt.MAGIC, version, len(raw), hashlib.sha256(raw).digest()) + raw
    return head + bytes(-len(head) % 64) + body


INTERESTING = [0, 1, -1, 63, 64, 2**31, 2**40, 2**63, None, "x", [], {}, [2**20, 2**20], 1.5, True]


def mutate_header(data: bytes, section: int, field: str, value: Any) -> bytes:
    version, header, body = split(data)
    sections = header["sections"]
    if sections:
        sections[section % len(sections)][field] = value
    return seal(version, header, body, reseal_body=False)


def mutate_body(data: bytes, position: int, byte: int) -> bytes:
    version, header, body = split(data)
    if not body:
        return data
    body = bytearray(body)
    body[position % len(body)] = byte
    return seal(version, header, bytes(body), reseal_body=True)
