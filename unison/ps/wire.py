"""The parameter server's messages over unison point-to-point.

There is no any-source receive, so every server keeps one receive posted per
worker and every worker one per server it waits on. A request or reply is a
sequence of messages on one tag (messages with one tag arrive in order):

1. a fixed :data:`HEADER` (op or status, how many arrays follow, request id, clock,
   length of the metadata);
2. the metadata, JSON (absent when its length is 0): key names, pieces, shapes,
   and the dtype and length of every array that follows;
3. the arrays, one message each, received straight into their destination.

Workers send requests on :data:`TAG_REQUEST`; servers answer on :data:`TAG_REPLY`.
An error reply carries the error's type, message and the ranks it names.
"""

from __future__ import annotations

import enum
import json
import struct
from typing import Any

import numpy as np

from ..errors import (
    AbortedError,
    CollectiveTimeoutError,
    CommunicationError,
    InvalidArgumentError,
    PeerLostError,
    UnisonError,
)

__all__ = [
    "HEADER",
    "TAG_REPLY",
    "TAG_REQUEST",
    "PsOp",
    "PsStatus",
    "decode_error",
    "encode_error",
    "pack_header",
    "pack_meta",
    "unpack_header",
    "unpack_meta",
]

TAG_REQUEST = 0x50530001
TAG_REPLY = 0x50530002

#: op/status (u32), number of arrays that follow (u32), request id (u64), clock (i64),
#: metadata bytes (u64)
HEADER = struct.Struct("<IIQqQ")


class PsOp(enum.IntEnum):
    CLAIM = 1  # look keys up at their home; claim the unknown ones (init_params)
    INIT = 2  # the first value of pieces a worker claimed
    COMMIT = 3  # claimed keys are complete on every server
    PUSH = 4
    PULL = 5
    CLOCK = 6  # no reply
    RULE = 7  # set the update rule (a pickled Rule follows)
    SAVE = 8
    BARRIER = 10  # wait until every worker still in the job has called barrier as often
    BYE = 9  # the worker leaves (metadata 'failed': it is exiting with an error)
    JOIN = 11  # elastic: a worker joins a running job; the reply says its first clock


class PsStatus(enum.IntEnum):
    OK = 0
    ERROR = 1


def pack_header(op: int, count: int, req_id: int, clock: int, meta_len: int) -> np.ndarray:
    return np.frombuffer(HEADER.pack(int(op), count, req_id, clock, meta_len), np.uint8).copy()


def unpack_header(buf: np.ndarray) -> tuple[int, int, int, int, int]:
    """(op or status, number of arrays, request id, clock, metadata length)."""
    op, count, req_id, clock, meta_len = HEADER.unpack(buf.tobytes())
    return int(op), int(count), int(req_id), int(clock), int(meta_len)


def pack_meta(meta: dict[str, Any] | None) -> np.ndarray:
    if not meta:
        return np.empty(0, np.uint8)
    return np.frombuffer(json.dumps(meta, separators=(",", ":")).encode(), np.uint8).copy()


def unpack_meta(buf: np.ndarray) -> dict[str, Any]:
    if buf.size == 0:
        return {}
    out = json.loads(buf.tobytes().decode())
    if not isinstance(out, dict):
        raise InvalidArgumentError("parameter-server metadata must be a JSON object")
    return out


_ERRORS: dict[str, type[UnisonError]] = {
    "InvalidArgumentError": InvalidArgumentError,
    "CollectiveTimeoutError": CollectiveTimeoutError,
    "PeerLostError": PeerLostError,
    "AbortedError": AbortedError,
}


def encode_error(exc: BaseException) -> dict[str, Any]:
    name = type(exc).__name__
    for cls_name, cls in _ERRORS.items():
        if isinstance(exc, cls):
            name = cls_name
            break
    ranks = list(getattr(exc, "ranks", ()))
    return {"error": name, "message": str(exc), "ranks": ranks}


def decode_error(meta: dict[str, Any], op: str, server: int) -> UnisonError:
    """The exception a worker raises for an error reply of server rank ``server``."""
    name = str(meta.get("error", "UnisonError"))
    where = "" if f"server rank {server}" in op else f"server rank {server}: "
    text = f"{op}: {where}{meta.get('message', 'unknown error')}"
    ranks = [int(r) for r in meta.get("ranks", []) if isinstance(r, int)]
    cls = _ERRORS.get(name)
    if cls is None:
        return AbortedError(text, op=op, ranks=(server, *ranks), remote=True)
    if issubclass(cls, CommunicationError):
        return cls(text, op=op, ranks=(server, *ranks), remote=True)
    return cls(text)
