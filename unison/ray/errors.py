"""The errors :class:`~unison.ray.RayExecutor` raises on the driver.

Each is in unison's tree (:class:`~unison.errors.LaunchError`) and also the type a
Horovod-on-Ray user already catches: a lost worker is a
:class:`ray.exceptions.RayActorError` (what ``ray.get`` raises for a dead actor under
``horovod.ray``), a placement group that never became ready a :class:`TimeoutError`.
"""

from __future__ import annotations

from collections.abc import Iterable

from ray.exceptions import RayActorError

from ..errors import LaunchError

__all__ = ["RayStartTimeoutError", "RayWorkerLostError"]


class RayWorkerLostError(LaunchError, RayActorError):
    """A worker actor died (killed, crashed, its node lost) while the job ran.

    ``rank`` is the first lost rank, ``ranks`` every rank found lost, ``size`` the
    job's size; the message names them and the lost rank's last recorded failure.
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int,
        size: int,
        ranks: Iterable[int] = (),
        actor_id: str | None = None,
    ) -> None:
        RayActorError.__init__(self, actor_id, message)  # type: ignore[arg-type]
        LaunchError.__init__(self, message)
        self.rank = rank
        self.size = size
        self.ranks: tuple[int, ...] = tuple(sorted(set(ranks) | {rank}))

    def __str__(self) -> str:
        return str(self.error_msg)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_lost, (str(self), self.rank, self.size, self.ranks, self.actor_id))


def _rebuild_lost(
    message: str, rank: int, size: int, ranks: tuple[int, ...], actor_id: str | None
) -> RayWorkerLostError:
    return RayWorkerLostError(message, rank=rank, size=size, ranks=ranks, actor_id=actor_id)


class RayStartTimeoutError(LaunchError, TimeoutError):
    """The workers could not be placed or started within the settings' deadline."""
