"""``recv(src=None)``: receive from whichever rank of the group sends first."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ...errors import UnsupportedError

if TYPE_CHECKING:
    from ._pg import UnisonProcessGroup
    from ._work import UnisonWork

__all__ = ["recv_anysource"]


def recv_anysource(pg: UnisonProcessGroup, tensors: list[torch.Tensor], tag: int) -> UnisonWork:
    raise UnsupportedError("unison: recv from any source is not available yet")
