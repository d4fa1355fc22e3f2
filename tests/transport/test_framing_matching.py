"""Frame header and tag matching, in one process (parsers fuzzed with hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unison.transport import framing as F
from unison.transport.matching import Matcher, Unexpected
from unison.transport.request import Request

u32 = st.integers(0, 2**32 - 1)


@given(
    kind=st.sampled_from(list(F.FrameKind)),
    group=u32,
    tag=u32,
    seq=st.integers(0, 2**64 - 1),
    op=st.integers(0, 255),
    root=st.integers(-(2**31), 2**31 - 1),
    count=st.integers(0, 2**64 - 1),
    length=st.integers(0, F.MAX_PAYLOAD),
)
def test_header_round_trip(
    kind: F.FrameKind, group: int, tag: int, seq: int, op: int, root: int, count: int, length: int
) -> None:
    sig = F.OpSig(op, 3, 1, root, count)
    fr = F.unpack(F.pack(kind, group, seq, tag, sig, length))
    assert (fr.kind, fr.group, fr.seq, fr.tag, fr.sig, fr.length) == (
        kind,
        group,
        seq,
        tag,
        sig,
        length,
    )


@settings(max_examples=500)
@given(st.binary(min_size=F.HEADER.size, max_size=F.HEADER.size))
def test_random_headers_are_rejected_or_parsed_never_crash(data: bytes) -> None:
    try:
        fr = F.unpack(data)
    except F.FrameError:
        return
    assert fr.length <= F.MAX_PAYLOAD


def test_huge_length_is_refused_before_allocation() -> None:
    raw = bytearray(F.pack(F.FrameKind.P2P, 0, 0, 0, F.OpSig(), 0))
    F.HEADER.pack_into(raw, 0, *[*list(F.HEADER.unpack(raw))[:-1], 2**62])
    with pytest.raises(F.FrameError, match="limit"):
        F.unpack(bytes(raw))


def test_matcher_fifo_per_key_and_independent_keys() -> None:
    m = Matcher()
    k1, k2 = (1, 0, 0, 1), (1, 0, 0, 2)
    a = Request(3, k1, np.empty(1, np.uint8), F.OpSig())
    b = Request(3, k1, np.empty(1, np.uint8), F.OpSig())
    assert m.post(a) is None and m.post(b) is None
    assert m.take_posted(3, k2) is None
    assert m.take_posted(3, k1) is a and m.take_posted(3, k1) is b
    m.add_unexpected(3, k2, Unexpected(bytearray(b"x"), F.OpSig()))
    m.add_unexpected(3, k2, Unexpected(bytearray(b"y"), F.OpSig()))
    c = Request(3, k2, np.empty(1, np.uint8), F.OpSig())
    got = m.post(c)
    assert got is not None and bytes(got.data) == b"x"
    assert m.pending_unexpected() == 1
    m.drop_group_seq(0, 0)
    assert m.pending_unexpected() == 0
