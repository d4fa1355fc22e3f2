"""The one exception tree of unison.

Every error unison raises is a :class:`UnisonError` and also the builtin that fits,
so ``except ValueError`` or ``except TimeoutError`` keep working::

    UnisonError(Exception)
    ├── InvalidArgumentError(ValueError)        bad input, raised before anything is sent
    ├── NotInitializedError(RuntimeError)       a call that needs init() before it
    ├── UnsupportedError(NotImplementedError)   a backend or algorithm cannot serve the call
    ├── AuthenticationError(PermissionError)    a peer or client failed the job-secret check
    ├── StoreError(RuntimeError)                the rendezvous store failed
    │   └── StoreTimeoutError(TimeoutError)     keys not set within the deadline
    ├── LaunchError(RuntimeError)               `unison run` could not start or supervise the job
    └── CommunicationError(RuntimeError)        an operation failed (op, sequence number, ranks)
        ├── CollectiveTimeoutError(TimeoutError)  deadline passed; names the ranks not heard from
        ├── PeerLostError(ConnectionError)        a peer's connection dropped (the rank died)
        ├── MismatchError                         ranks disagree: op, dtype, count or root
        └── AbortedError                          another rank failed this operation and told us

A :class:`CommunicationError` carries ``op``, ``seq``, ``group`` and ``ranks`` (the
peers involved, global ranks) as attributes as well as in its message.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "AbortedError",
    "AuthenticationError",
    "CollectiveTimeoutError",
    "CommunicationError",
    "InvalidArgumentError",
    "LaunchError",
    "MismatchError",
    "NotInitializedError",
    "PeerLostError",
    "StoreError",
    "StoreTimeoutError",
    "UnisonError",
    "UnsupportedError",
]


class UnisonError(Exception):
    """Base of every error raised by unison."""


class InvalidArgumentError(UnisonError, ValueError):
    """Bad input (non-contiguous buffer, wrong length, unsupported dtype/op, bad rank)."""


class NotInitializedError(UnisonError, RuntimeError):
    """A call that needs :func:`unison.init` was made before it (or after shutdown)."""


class UnsupportedError(UnisonError, NotImplementedError):
    """The selected backend, transport or algorithm cannot serve this call."""


class AuthenticationError(UnisonError, PermissionError):
    """A peer or store client did not prove knowledge of the job secret."""


class StoreError(UnisonError, RuntimeError):
    """The rendezvous store failed or could not be reached."""


class StoreTimeoutError(StoreError, TimeoutError):
    """Keys were not set in the store before the deadline."""


class LaunchError(UnisonError, RuntimeError):
    """The launcher could not start or supervise the job."""


class CommunicationError(UnisonError, RuntimeError):
    """An operation failed. ``op``, ``seq``, ``group`` and ``ranks`` say which and with whom."""

    def __init__(
        self,
        message: str,
        *,
        op: str | None = None,
        seq: int | None = None,
        group: int | None = None,
        ranks: Iterable[int] = (),
        remote: bool = False,
    ) -> None:
        super().__init__(message)
        #: True when another rank detected the failure and told this one.
        self.remote = remote
        #: the ABORT notice it came in, relayed unchanged to the group before exiting
        self.abort_payload: bytes | None = None
        self.op = op
        self.seq = seq
        self.group = group
        self.ranks: tuple[int, ...] = tuple(sorted(set(ranks)))


class CollectiveTimeoutError(CommunicationError, TimeoutError):
    """The operation's deadline passed; ``ranks`` are the peers not heard from."""


class PeerLostError(CommunicationError, ConnectionError):
    """The connection to a peer dropped (it exited, crashed or was killed)."""


class MismatchError(CommunicationError):
    """Ranks disagreed about the operation (kind, dtype, count, op, root or group)."""


class AbortedError(CommunicationError):
    """Another rank failed this operation and aborted it on every rank."""
