"""Short property-based fuzzing of the payload reader (a longer run: `make fuzz`)."""

from __future__ import annotations

import keras
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spark_keras as sk
from fuzz import payload_mutations as mut

SEED = sk.dumps(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.BatchNormalization()]))
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def loads_or_payload_error(data) -> None:
    try:
        model = sk.loads(data)
    except sk.PayloadError:
        return
    assert isinstance(model, keras.Model)


@FUZZ
@given(st.binary(max_size=600))
def test_random_bytes(data):
    with pytest.raises(sk.PayloadError):
        sk.loads(data)


@FUZZ
@given(st.integers(0, len(SEED) - 1), st.integers(0, 255))
def test_single_byte_changes(position, byte):
    data = bytearray(SEED)
    data[position] = byte
    loads_or_payload_error(bytes(data))


@FUZZ
@given(st.integers(0, 64), st.sampled_from(["offset", "nbytes", "shape", "dtype", "kind", "name"]),
       st.sampled_from(mut.INTERESTING))
def test_resealed_header_mutations(section, field, value):
    loads_or_payload_error(mut.mutate_header(SEED, section, field, value))


@FUZZ
@given(st.integers(0, 1 << 16), st.integers(0, 255))
def test_resealed_body_mutations(position, byte):
    loads_or_payload_error(mut.mutate_body(SEED, position, byte))


@FUZZ
@given(st.integers(0, len(SEED)))
def test_truncations(length):
    data = SEED[:length]
    if length == len(SEED):
        assert isinstance(sk.loads(data), keras.Model)
    else:
        with pytest.raises(sk.PayloadError):
            sk.loads(data)
