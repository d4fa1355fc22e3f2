"""copy_into: the same bytes as ``dst[...] = src`` at every relative alignment, and the
short-distance detour taken exactly where ``memmove`` would alias (on real shared memory)."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from unison.buffers import copy_into
from unison.buffers.copy import NEAR_BYTES, copy_bytes, short_distance


@pytest.mark.parametrize("dtype", ["uint8", "float32", "float64", "int64", "float16"])
def test_copy_into_matches_assignment_at_every_distance(dtype: str) -> None:
    item = np.dtype(dtype).itemsize
    seg = mmap.mmap(-1, 1 << 20, mmap.MAP_SHARED)  # page-aligned shared memory, as a slot
    slot = np.frombuffer(seg, np.uint8)
    heap = np.zeros((1 << 20) + 8192, np.uint8)
    heap_page = (-heap.ctypes.data) % 4096
    n = (64 << 10) // item  # inside the window where the detour applies
    rng = np.random.default_rng(7)
    seen_near = seen_far = 0
    for shift in [*range(0, 2 * NEAR_BYTES, item), *range(2 * NEAR_BYTES, 4096, 248)]:
        src = slot[: n * item].view(dtype)
        src[...] = rng.integers(0, 100, n).astype(dtype)
        dst = heap[heap_page + shift : heap_page + shift + n * item].view(dtype)
        dst[...] = 0
        near = short_distance(dst, src)
        assert near == (0 < shift < NEAR_BYTES), shift
        seen_near += near
        seen_far += not near
        copy_into(dst, src)
        assert np.array_equal(dst, src), (dtype, shift)
        back = slot[4096 : 4096 + n * item].view(dtype)  # and into shared memory
        copy_into(back, dst)
        assert np.array_equal(back, dst), (dtype, shift)
    assert seen_near and seen_far


def test_copy_into_other_shapes_and_small_or_strided_arrays() -> None:
    a = np.arange(24 * 1024, dtype=np.float32).reshape(24, 1024)
    b = np.zeros_like(a)
    copy_into(b, a)
    assert np.array_equal(a, b)
    s = np.zeros(48 * 1024, np.float32)[::2].reshape(24, 1024)  # not contiguous
    copy_into(s, a)
    assert np.array_equal(s, a)
    small = np.zeros(5, np.int32)
    copy_into(small, np.arange(5, dtype=np.int32))
    assert small.tolist() == [0, 1, 2, 3, 4]


def test_copy_bytes_on_memoryviews_as_the_shm_rings_use_them() -> None:
    ring = memoryview(mmap.mmap(-1, 1 << 20, mmap.MAP_SHARED))
    user = np.zeros((256 << 10) + 4096, np.uint8)
    base = (-user.ctypes.data) % 4096 + 16  # the user buffer 16 bytes ahead of the ring
    src = np.frombuffer(ring, np.uint8)
    off = (512 << 10) + 32  # 16 bytes ahead of the user buffer: short-distance back too
    for k in (100, 64 << 10, 256 << 10):
        src[:k] = np.arange(k) % 251
        dst = memoryview(user)[base : base + k]
        assert short_distance(np.frombuffer(dst, np.uint8), src[:k])
        copy_bytes(dst, ring[:k])
        assert np.array_equal(user[base : base + k], src[:k]), k
        copy_bytes(ring[off : off + k], dst)  # and back into the ring
        assert np.array_equal(src[off : off + k], src[:k]), k
    del src
