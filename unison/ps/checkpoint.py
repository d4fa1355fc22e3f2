"""Checkpoints: each server writes its own pieces; :func:`load` puts keys back together.

A checkpoint is a directory::

    manifest.json        written last by the worker that called kv.save: servers, keys
    server-<i>.npz       pieces of server i, with where each piece sits in its key

The format does not depend on the placement, so a checkpoint can be loaded into a
job with a different number of servers (``kv.init_params(ps.load(path))``).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError

__all__ = ["load", "write_manifest", "write_server"]

MANIFEST = "manifest.json"


def write_server(
    path: str,
    index: int,
    shards: dict[tuple[str, int], np.ndarray],
    info: dict[tuple[str, int], dict[str, Any]],
) -> str:
    """Write server ``index``'s pieces under ``path``; the file name."""
    os.makedirs(path, exist_ok=True)
    name = f"server-{index}.npz"
    entries = []
    arrays: dict[str, np.ndarray] = {}
    for n, (pk, arr) in enumerate(sorted(shards.items())):
        entries.append({"key": pk[0], "piece": pk[1], "array": f"a{n}", **info[pk]})
        arrays[f"a{n}"] = arr
    index_blob = np.frombuffer(json.dumps(entries).encode(), np.uint8)
    tmp = os.path.join(path, f".{name}.tmp.npz")
    np.savez(tmp, __index__=index_blob, **arrays)  # type: ignore[arg-type]
    os.replace(tmp, os.path.join(path, name))
    return name


def write_manifest(path: str, num_servers: int, keys: dict[str, dict[str, Any]]) -> None:
    tmp = os.path.join(path, f".{MANIFEST}.tmp")
    with open(tmp, "w") as f:
        json.dump({"format": 1, "num_servers": num_servers, "keys": keys}, f, indent=1)
    os.replace(tmp, os.path.join(path, MANIFEST))


def load(path: str) -> dict[str, np.ndarray]:
    """Every key of a checkpoint written by ``kv.save(path)``, as full numpy arrays."""
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise InvalidArgumentError(
            f"{path!r} is not a complete parameter-server checkpoint (no {MANIFEST})"
        ) from None
    keys: dict[str, Any] = manifest["keys"]
    out = {k: np.empty(int(np.prod(m["shape"])), np.dtype(m["dtype"])) for k, m in keys.items()}
    filled = dict.fromkeys(keys, 0)
    for i in range(int(manifest["num_servers"])):
        with np.load(os.path.join(path, f"server-{i}.npz")) as z:
            for e in json.loads(z["__index__"].tobytes().decode()):
                if e["key"] in out:
                    out[e["key"]][e["start"] : e["stop"]] = z[e["array"]]
                    filled[e["key"]] += e["stop"] - e["start"]
    short = [k for k in keys if filled[k] != out[k].size]
    if short:
        raise InvalidArgumentError(f"checkpoint {path!r} is missing pieces of keys {short}")
    return {k: out[k].reshape(keys[k]["shape"]) for k in keys}
