"""Pieces: several arrays read and written as one (pure: no processes)."""

from __future__ import annotations

import numpy as np
import pytest

from unison.buffers.pieces import Pieces, overlapping, pieces_pair


def _arrays() -> list[np.ndarray]:
    return [np.arange(3.0), np.zeros(0), np.arange(10.0, 15.0).reshape(5, 1), np.arange(20.0, 22.0)]


def test_ranges_read_and_write_across_pieces_as_one_array() -> None:
    arrs = _arrays()
    p = Pieces(arrs)
    whole = np.concatenate([a.ravel() for a in arrs])
    assert (p.count, p.nbytes) == (10, 80)
    for start in range(11):
        for stop in range(start, 11):
            out = np.full(stop - start, -1.0)
            p.read(start, out)
            assert out.tolist() == whole[start:stop].tolist(), (start, stop)
            sp = p.spans(start, stop)
            assert sum(len(v) for _, v in sp) == stop - start
            assert all(len(v) for _, v in sp)  # empty pieces left out
    p.write(2, np.array([-1.0, -2.0, -3.0, -4.0]))
    assert arrs[0].tolist() == [0.0, 1.0, -1.0]
    assert arrs[2].ravel().tolist() == [-2.0, -3.0, -4.0, 13.0, 14.0]
    # a range inside one piece is a view of it; across pieces there is none
    v = p.view(4, 6)
    assert v is not None and np.shares_memory(v, arrs[2])
    assert p.view(2, 4) is None
    one = Pieces.of(np.arange(6.0))
    assert one.spans(1, 4)[0][1].tolist() == [1.0, 2.0, 3.0]


def test_mixed_or_strided_arrays_are_refused() -> None:
    with pytest.raises(ValueError):
        Pieces([np.zeros(3), np.zeros(3, np.float32)])
    with pytest.raises(ValueError):
        Pieces([np.zeros((4, 4)).T])
    with pytest.raises(ValueError):
        Pieces([])


def test_overlapping_allows_in_place_only() -> None:
    a, b = np.zeros(4), np.zeros(4)
    src = Pieces([a, b])
    assert not overlapping(src, src)  # in place
    assert not overlapping(src, Pieces([np.zeros(4), np.zeros(4)]))
    assert overlapping(Pieces([a, a]), Pieces([a, a]))  # one tensor twice
    assert overlapping(src, Pieces([b, np.zeros(4)]))  # an output is another's input
    assert overlapping(Pieces([a[:3], a[2:]]), Pieces([a[:3], a[2:]]))  # views that overlap
    assert overlapping(src, Pieces([np.zeros(5), np.zeros(3)]))  # other boundaries


def test_pairs_are_made_only_where_the_reduction_cannot_read_what_it_wrote() -> None:
    a, b = np.zeros(4), np.zeros(4)
    pair = pieces_pair([a, b], [a, b])
    assert pair is not None and pair[0] is pair[1]  # in place: one Pieces
    pair = pieces_pair([a, b], [np.zeros(4), np.zeros(4)])
    assert pair is not None and pair[0] is not pair[1]
    assert pieces_pair([a, a], [a, a]) is None
    assert pieces_pair([a, np.zeros(4, np.float32)], [a, b]) is None
    assert pieces_pair([np.zeros((4, 4)).T], [np.zeros(16)]) is None
