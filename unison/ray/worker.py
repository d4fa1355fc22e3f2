"""The actor behind each rank of a :class:`~unison.ray.RayExecutor`.

One instance per rank, in its own Ray worker process. The driver reads where it was
placed (:meth:`UnisonRayWorker.node_info`), then writes the rank's environment into
the process (:meth:`UnisonRayWorker.update_env_vars`: the same ``UNISON_*``,
``HOROVOD_*`` and torchrun variables ``unison run`` gives a rank), so ``unison.init()``,
``unison.torch.init()`` (``hvd.init()``) or ``unison.ps`` inside the function joins the
job through the driver's authenticated store.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import LaunchError

__all__ = ["THREADS_HOW", "UnisonRayWorker"]

#: how a Ray user chooses the thread counts (the notice's hint)
THREADS_HOW = "env_vars / extra_env_vars, or the driver's environment"


def _leave_job() -> None:
    """After the function raised: leave the job so peers blocked on this rank fail at once
    (they see the connection drop) instead of waiting out their deadline."""
    torch_mod = sys.modules.get("unison.torch")
    if torch_mod is not None:
        try:
            if torch_mod.is_initialized():
                torch_mod.shutdown()
        except Exception:  # best effort, on an error path
            pass
    try:
        import unison

        unison.shutdown()
    except Exception:  # best effort, on an error path
        pass


class UnisonRayWorker:
    """Holds the executable (an ``executable_cls`` instance, or None) and runs functions."""

    def __init__(self) -> None:
        self.executable: Any = None

    def node_info(self) -> tuple[str, str, str, int]:
        """(Ray node id, hostname, node IP address, pid) of this actor."""
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        return node_id, socket.gethostname(), ip, os.getpid()

    def gpu_ids(self) -> list[str]:
        """The GPUs Ray assigned to this actor."""
        import ray

        return [str(g) for g in ray.get_gpu_ids()]

    def free_port(self) -> int:
        """A port nothing listens on now, on this node (torchrun's MASTER_PORT)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return int(s.getsockname()[1])

    def update_env_vars(self, env_vars: Mapping[str, object], share_cores: int = 0) -> str | None:
        """Set environment variables in this actor's process. ``share_cores``: the ranks
        on this node that divide its cores among them as their thread counts (the
        driver's :func:`~unison.launch.rankenv.thread_share`; 0 leaves them alone), as
        ``unison run`` does; returns the notice saying so, or None. Call it before the
        rank's function imports its framework (the counts are read at import)."""
        from ..jobenv import usable_cores
        from ..launch.rankenv import thread_environment, thread_notice

        os.environ.update({str(k): str(v) for k, v in env_vars.items()})
        if not share_cores:
            return None
        # Ray's own OMP_NUM_THREADS (its per-actor default) is not the user's choice:
        # the driver made that call with the user's variables
        cores = usable_cores()
        os.environ.update(thread_environment({}, share_cores, cores))
        return thread_notice({}, share_cores, cores, how=THREADS_HOW)

    def env_vars(self) -> dict[str, str]:
        """This actor's environment."""
        return dict(os.environ)

    def start_executable(
        self,
        executable_cls: type | None = None,
        executable_args: Sequence[Any] | None = None,
        executable_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        """Instantiate ``executable_cls`` in this actor (None leaves the executable None)."""
        if executable_cls is not None:
            self.executable = executable_cls(
                *(executable_args or ()), **dict(executable_kwargs or {})
            )

    def set_queue(self, queue: Any) -> None:
        """Send this process's ``ray_logger.log`` values to ``queue`` (the driver's
        callbacks)."""
        from . import ray_logger

        ray_logger.configure(queue)

    def execute(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)``; if it raises, this rank leaves the unison job first.

        ``sys.exit()`` in ``fn`` (a ``unison.ps`` server exits when its workers are done)
        ends the call, not the actor: status 0 or None returns None, another status
        raises :class:`~unison.errors.LaunchError`.
        """
        try:
            return fn(self.executable)
        except SystemExit as exc:
            _leave_job()
            if exc.code in (0, None):
                return None
            rank = os.environ.get("UNISON_RANK", "?")
            raise LaunchError(f"rank {rank}: the function exited with status {exc.code}") from None
        except BaseException:
            _leave_job()
            raise
