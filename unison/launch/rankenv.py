"""The environment each rank starts with: unison's, Horovod's and torchrun's variables."""

from __future__ import annotations

import sys
from collections.abc import Mapping

from .. import config as C
from .hosts import Slot
from .output import _isatty

__all__ = ["rank_environment"]


def rank_environment(
    base: Mapping[str, str],
    *,
    rank: int,
    size: int,
    store: tuple[str, int],
    secret: bytes,
    job_id: str,
    timeout: float | None = None,
    servers: int = 0,
    slot: Slot | None = None,
    network_interface: str | None = None,
    master: tuple[str, int] | None = None,
) -> dict[str, str]:
    """The environment of one rank (the last ``servers`` ranks serve); ``slot`` places it
    on a host of a multi-host job (else every rank shares this host)."""
    env = dict(base)
    slot = slot or Slot(rank, "localhost", rank, size, 0, 1)
    ident = {
        "RANK": rank,
        "SIZE": size,
        "LOCAL_RANK": slot.local_rank,
        "LOCAL_SIZE": slot.local_size,
        "CROSS_RANK": slot.cross_rank,
        "CROSS_SIZE": slot.cross_size,
    }
    for name, value in ident.items():
        env[f"UNISON_{name}"] = str(value)
        env[f"HOROVOD_{name}"] = str(value)
    # torchrun's variables, so an unchanged torch.distributed script runs (env://)
    torchrun = {
        "RANK": rank,
        "WORLD_SIZE": size,
        "LOCAL_RANK": slot.local_rank,
        "LOCAL_WORLD_SIZE": slot.local_size,
        "GROUP_RANK": slot.cross_rank,
        "GROUP_WORLD_SIZE": slot.cross_size,
        "ROLE_RANK": rank,
        "ROLE_WORLD_SIZE": size,
        "ROLE_NAME": "default",
    }
    env.update({k: str(v) for k, v in torchrun.items()})
    if master is not None:
        env["MASTER_ADDR"], env["MASTER_PORT"] = master[0], str(master[1])
    env[C.ENV_STORE_ADDR] = f"{store[0]}:{store[1]}"
    env[C.ENV_SECRET] = secret.hex()
    env[C.ENV_JOB_ID] = job_id
    env["HOROVOD_HOSTNAME"] = slot.host
    if network_interface:
        env["UNISON_NETWORK_INTERFACE"] = network_interface
    env["PYTHONUNBUFFERED"] = "1"
    env[C.ENV_OUTPUT_TTY] = "1" if _isatty(sys.stderr) else "0"
    if timeout is not None:
        env["UNISON_TIMEOUT"] = repr(float(timeout))
    if servers:
        env[C.ENV_NUM_SERVERS] = str(servers)
        env[C.ENV_ROLE] = "server" if rank >= size - servers else "worker"
    return env
