"""A rank of :func:`unison.run`: ``python -m unison.launch.call`` fetches the function
from the caller's store, calls it, and leaves its return value (or its exception, with
the traceback) there for the caller."""

from __future__ import annotations

import multiprocessing.spawn
import os
import pickle
import sys
import time
import traceback
from typing import Any

from .. import config as C
from ..store import TCPStore
from .function import FUNCTION_KEY, RESULT_KEY

__all__ = ["main"]


def _record(rank: int, store: TCPStore, record: dict[str, Any]) -> None:
    store.set(RESULT_KEY.format(rank=rank), pickle.dumps(record))


def main() -> int:
    """A rank of :func:`run`: fetch the function, call it, leave what it gave."""
    spec = os.environ.pop(C.ENV_RUN_FUNCTION, "")
    host, _, rest = spec.rpartition(":")
    host, _, port = host.rpartition(":")
    if not (host and port.isdigit() and rest):
        print(f"unison.launch.call: {C.ENV_RUN_FUNCTION} is not set", file=sys.stderr)
        return 2
    rank = int(os.environ.get(C.ENV_RANK, "0"))
    store = TCPStore(host, int(port), bytes.fromhex(rest), timeout=60.0)
    prep, payload = pickle.loads(store.get(FUNCTION_KEY))
    multiprocessing.spawn.prepare(prep)  # sys.path, cwd and the caller's main module
    try:
        fn, args, kwargs = pickle.loads(payload)
        value = fn(*args, **kwargs)
        raw = pickle.dumps({"ok": True, "value": value})
    except BaseException as exc:  # the caller re-raises it; this rank fails the job
        try:
            error: bytes | None = pickle.dumps(exc)
        except Exception:
            error = None
        _record(
            rank,
            store,
            {
                "ok": False,
                "error": error,
                "type": type(exc).__qualname__,
                "message": str(exc),
                "traceback": traceback.format_exc(),
                "when": time.time(),
            },
        )
        print(f"{type(exc).__qualname__}: {exc}", file=sys.stderr, flush=True)
        return 1
    store.set(RESULT_KEY.format(rank=rank), raw)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
