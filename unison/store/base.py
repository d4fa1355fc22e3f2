"""The :class:`Store` interface: a small key-value service for rendezvous only.

Ranks use a store to exchange addresses and tiny control records once, never
tensor data. Keys are ``str``, values ``bytes``. Every blocking call has a deadline:
an explicit ``timeout`` in seconds, or the store's default :attr:`Store.timeout`.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from types import TracebackType
from typing import TypeVar

from ..errors import InvalidArgumentError, StoreTimeoutError

__all__ = ["Store", "missing_keys_error"]

_S = TypeVar("_S", bound="Store")


class Store(abc.ABC):
    """A rendezvous key-value store (``torch.distributed.Store``-like semantics)."""

    #: default deadline in seconds of :meth:`get` and :meth:`wait`
    timeout: float = 300.0

    @abc.abstractmethod
    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` (replacing any previous value)."""

    @abc.abstractmethod
    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting until it exists.

        Raises :class:`~unison.errors.StoreTimeoutError` naming the key when the
        deadline passes first.
        """

    @abc.abstractmethod
    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the integer counter ``key`` (missing = 0); new value."""

    @abc.abstractmethod
    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Atomically set ``desired`` if the value is ``expected``; returns the value now stored.

        A missing key counts as matching ``expected == b""``. As in
        ``torch.distributed``, when the key is missing and ``expected`` is not empty
        nothing is stored and ``expected`` is returned. Success is ``result == desired``.
        """

    @abc.abstractmethod
    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        """Block until every key exists; :class:`StoreTimeoutError` names the missing ones."""

    @abc.abstractmethod
    def check(self, keys: Sequence[str]) -> bool:
        """Whether every key exists right now (never waits)."""

    @abc.abstractmethod
    def delete(self, key: str) -> bool:
        """Remove ``key``; whether it existed."""

    def close(self) -> None:  # noqa: B027 - optional to override
        """Release connections or files; the store is unusable afterwards."""

    # -- helpers shared by implementations -------------------------------------------
    def _timeout(self, timeout: float | None) -> float:
        value = self.timeout if timeout is None else timeout
        if math.isnan(value) or value < 0:
            raise InvalidArgumentError(f"store timeout must be >= 0 seconds, got {value!r}")
        return float(value)

    @staticmethod
    def _check_key(key: object) -> str:
        if not isinstance(key, str):
            raise InvalidArgumentError(f"store keys are str, got {type(key).__name__}")
        return key

    @staticmethod
    def _check_value(value: object) -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(f"store values are bytes, got {type(value).__name__}")
        return bytes(value)

    @staticmethod
    def _check_keys(keys: Sequence[str]) -> list[str]:
        if isinstance(keys, str):
            raise InvalidArgumentError("keys must be a sequence of str, not a single str")
        return [Store._check_key(k) for k in keys]

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def missing_keys_error(where: str, keys: Sequence[str], timeout: float) -> StoreTimeoutError:
    """The one message for keys that did not appear in time."""
    shown = ", ".join(repr(k) for k in list(keys)[:8])
    more = f" and {len(keys) - 8} more" if len(keys) > 8 else ""
    noun = "key" if len(keys) == 1 else "keys"
    return StoreTimeoutError(f"{where}: {noun} {shown}{more} not set within {timeout:g} s")
