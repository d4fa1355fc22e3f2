"""Errors of the Horovod-compatible layer (Horovod's names, unison's tree)."""

from __future__ import annotations

from ..errors import CommunicationError, MismatchError

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "TensorMismatchError"]


class HorovodInternalError(CommunicationError):
    """A collective failed inside the engine (a peer was lost, a deadline passed).

    A RuntimeError, as in Horovod; :func:`unison.torch.elastic.run` catches it,
    restores the last committed state and retries.
    """


class TensorMismatchError(MismatchError):
    """Ranks submitted the same tensor name with a different op, dtype, shape or root.

    Raised on every rank of the process set, never a hang.
    """


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's signal that the set of hosts changed (never raised with fixed workers)."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts updated")
        self.skip_sync = skip_sync
