"""torch.distributed's ``Store`` as a unison :class:`~unison.store.Store`, for rendezvous.

When ``init_process_group("unison")`` creates the first group and unison is not
initialized yet, unison joins the job through the store torch already connected
(``MASTER_ADDR``/``MASTER_PORT``, ``env://``, ``tcp://``, ``file://``): no second
rendezvous service and no second port.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ...errors import StoreError, StoreTimeoutError
from ...store import Store

__all__ = ["TorchStore"]


class TorchStore(Store):
    def __init__(self, store: Any, timeout: float) -> None:
        self._s = store
        self.timeout = timeout

    def _wait(self, keys: Sequence[str], timeout: float | None) -> None:
        secs = self._timeout(timeout)
        try:
            self._s.wait(list(keys), timedelta(seconds=max(secs, 0.001)))
        except (dist.DistStoreError, RuntimeError) as exc:
            # torch's FileStore reports its timeout as a plain RuntimeError ("Wait
            # timeout"). Keys still missing after a timeout are a timeout (callers retry
            # those within their own deadline); keys that appeared as the wait gave up
            # are there: the wait is over. Anything else is a store failure.
            timed_out = isinstance(exc, dist.DistStoreError) or "timeout" in str(exc).lower()
            if not timed_out:
                raise StoreError(f"store: wait for {list(keys)} failed: {exc}") from None
            missing = self._missing(keys)
            if missing:
                raise StoreTimeoutError(
                    f"store: keys {missing} did not appear within {secs:g}s ({exc})"
                ) from None

    def _missing(self, keys: Sequence[str]) -> list[str]:
        try:
            return [k for k in keys if not self._s.check([k])]
        except RuntimeError:
            return list(keys)

    def set(self, key: str, value: bytes) -> None:
        self._s.set(self._check_key(key), self._check_value(value))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        self._wait([self._check_key(key)], timeout)
        return bytes(self._s.get(key))

    def add(self, key: str, amount: int) -> int:
        return int(self._s.add(self._check_key(key), int(amount)))

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        return bytes(self._s.compare_set(self._check_key(key), expected, desired))

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        self._wait(self._check_keys(keys), timeout)

    def check(self, keys: Sequence[str]) -> bool:
        return bool(self._s.check(self._check_keys(keys)))

    def delete(self, key: str) -> bool:
        return bool(self._s.delete_key(self._check_key(key)))
