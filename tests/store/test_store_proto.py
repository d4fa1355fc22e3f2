"""The TCP store's wire format: body encoding round-trips, parser raises only ProtocolError."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unison.store import protocol as p

pytestmark = pytest.mark.timeout(60)

fields_st = st.lists(st.binary(max_size=64), max_size=12)


@settings(max_examples=300, deadline=None)
@given(code=st.integers(0, 255), fields=fields_st)
def test_body_roundtrip(code: int, fields: list[bytes]) -> None:
    assert p.decode_body(p.encode_body(code, fields)) == (code, fields)


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=200))
def test_decode_random_bytes_only_raises_protocol_error(data: bytes) -> None:
    try:
        code, fields = p.decode_body(data)
    except p.ProtocolError:
        return
    # whatever parses must re-encode to exactly the input
    assert p.encode_body(code, fields) == data


@settings(max_examples=300, deadline=None)
@given(
    code=st.integers(0, 255),
    fields=fields_st,
    cut=st.integers(1, 40),
    junk=st.binary(min_size=1, max_size=8),
)
def test_truncated_or_extended_bodies_rejected(
    code: int, fields: list[bytes], cut: int, junk: bytes
) -> None:
    body = p.encode_body(code, fields)
    if cut < len(body):
        with pytest.raises(p.ProtocolError):
            p.decode_body(body[:-cut])
    with pytest.raises(p.ProtocolError):
        p.decode_body(body + junk)


@settings(max_examples=200, deadline=None)
@given(field=st.binary(max_size=16))
def test_field_parsers_raise_only_protocol_error(field: bytes) -> None:
    for parse in (p.parse_i64, p.parse_f64, p.parse_key):
        try:
            parse(field)
        except p.ProtocolError:
            pass


def test_huge_field_count_and_length_rejected_without_allocation() -> None:
    with pytest.raises(p.ProtocolError, match="fields announced"):
        p.decode_body(b"\x01" + struct.pack("!I", 2**32 - 1))
    with pytest.raises(p.ProtocolError, match="past the end"):
        p.decode_body(b"\x01" + struct.pack("!I", 1) + struct.pack("!I", 2**31))


def test_scalars_roundtrip_and_nan_rejected() -> None:
    assert p.parse_i64(p.i64(-(2**63))) == -(2**63)
    assert p.parse_f64(p.f64(2.5)) == 2.5
    with pytest.raises(p.ProtocolError):
        p.parse_f64(p.f64(float("nan")))
    with pytest.raises(p.ProtocolError):
        p.parse_key(b"\xff\xfe")
    with pytest.raises(p.ProtocolError):
        p.encode_body(256, [])


def test_mac_binds_direction_nonce_counter_and_secret() -> None:
    tag = p.mac(b"s", p.C2S, b"n" * 32, 0, b"body")
    assert p.verify(b"s", p.C2S, b"n" * 32, 0, b"body", tag)
    assert not p.verify(b"s", p.S2C, b"n" * 32, 0, b"body", tag)
    assert not p.verify(b"s", p.C2S, b"m" * 32, 0, b"body", tag)
    assert not p.verify(b"s", p.C2S, b"n" * 32, 1, b"body", tag)
    assert not p.verify(b"t", p.C2S, b"n" * 32, 0, b"body", tag)
    assert not p.verify(b"s", p.C2S, b"n" * 32, 0, b"bodY", tag)
