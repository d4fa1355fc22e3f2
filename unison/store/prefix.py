"""Namespacing: a view of another store in which every key gets a prefix."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InvalidArgumentError
from .base import Store

__all__ = ["PrefixStore"]


class PrefixStore(Store):
    """Every key ``k`` is stored as ``f"{prefix}/{k}"`` in ``store``.

    Closing a prefix store does not close the store beneath it (several views share
    one connection). Its default timeout is the underlying store's.
    """

    def __init__(self, prefix: str, store: Store) -> None:
        if not isinstance(prefix, str) or not prefix:
            raise InvalidArgumentError("PrefixStore needs a non-empty str prefix")
        if not isinstance(store, Store):
            raise InvalidArgumentError(f"PrefixStore wraps a Store, got {type(store).__name__}")
        self.prefix = prefix
        self.store = store

    @property
    def timeout(self) -> float:
        return self.store.timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self.store.timeout = value

    def _k(self, key: str) -> str:
        return f"{self.prefix}/{self._check_key(key)}"

    def set(self, key: str, value: bytes) -> None:
        self.store.set(self._k(key), value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        return self.store.get(self._k(key), timeout)

    def add(self, key: str, amount: int) -> int:
        return self.store.add(self._k(key), amount)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        return self.store.compare_set(self._k(key), expected, desired)

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        self.store.wait([self._k(k) for k in self._check_keys(keys)], timeout)

    def check(self, keys: Sequence[str]) -> bool:
        return self.store.check([self._k(k) for k in self._check_keys(keys)])

    def delete(self, key: str) -> bool:
        return self.store.delete(self._k(key))

    def __repr__(self) -> str:
        return f"PrefixStore({self.prefix!r}, {self.store!r})"
