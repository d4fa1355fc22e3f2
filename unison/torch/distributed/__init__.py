"""unison as a torch.distributed backend.

    import unison.torch.distributed   # registers the backend "unison"
    import torch.distributed as dist
    dist.init_process_group("unison")            # or "cpu:unison,cuda:nccl"

Every torch.distributed call on CPU tensors of a group created with the backend
``"unison"`` runs on unison's transports (shared memory between ranks of a host,
TCP between hosts) and algorithms. ``DistributedDataParallel``, its communication
hooks, ``torch.distributed.checkpoint`` and the object collectives work unchanged.
Under ``mpirun`` and Slurm's ``srun``, torch's default ``env://`` rendezvous gets the
variables torchrun would export (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT`` ...) from the launcher's own, where absent.
See docs/torch-distributed.md.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from ._launchers import install as _install_env_rendezvous
from ._monitored import install as _install_monitored_barrier
from ._monitored import monitored_barrier
from ._pg import UnisonProcessGroup
from ._rendezvous import communicator, join
from ._work import UnisonWork, translate

__all__ = ["BACKEND", "UnisonProcessGroup", "UnisonWork", "monitored_barrier", "translate"]

#: the name to pass to ``torch.distributed.init_process_group``
BACKEND = "unison"


def _create(opts: Any, pg_options: Any = None) -> UnisonProcessGroup:
    """torch's backend constructor (extended API: store, ranks, timeout, group name)."""
    default = not dist.is_initialized()
    ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    if default:
        rt = join(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    else:
        from ...backends.native.runtime import Runtime
        from ...world import current

        world = current()
        if not isinstance(world, Runtime):
            raise RuntimeError("unison: the default group must use the 'unison' backend too")
        rt = world
    comm = communicator(rt, str(opts.group_id), ranks, default, opts.timeout)
    pg = UnisonProcessGroup(
        opts.store, opts.group_rank, opts.group_size, opts.timeout, comm, default
    )
    # torch names only C++ backends itself; FSDP2 and DTensor look groups up by name
    pg._set_group_name(opts.group_id)
    return pg


# env:// under mpirun/Slurm: the torchrun variables they do not set (see _launchers)
_install_env_rendezvous()
# torch's dist.monitored_barrier accepts only Gloo's groups: extended to unison's
_install_monitored_barrier()

if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
