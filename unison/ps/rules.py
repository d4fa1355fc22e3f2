"""Server-side update rules: how a pushed value changes the stored one.

A rule sees one stored piece (a flat numpy array the server owns), the update
pushed for it (same dtype and length) and a per-piece state dict it may fill
(momentum, Adam moments). Rules work element-wise, so a tensor split across
servers is updated piece by piece with the same result as in one piece.

Under :class:`~unison.ps.BSP` the updates of one clock are summed (in worker
order) before the rule runs once; under SSP(s > 0) and ASP the rule runs once per
push. Gradients are therefore summed over workers, as in MXNet's ``dist_sync``:
divide them by ``kv.num_workers`` (or scale the learning rate) for a mean.

Rules travel to the servers pickled: a :class:`Custom` function must be importable
there (a module-level function of a module, or of the script defined before
``ps.init()``).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgumentError

__all__ = ["SGD", "Adam", "Assign", "Custom", "Rule", "Sum"]

State = dict[str, np.ndarray]


def _float_only(dtype: np.dtype, name: str) -> str | None:
    if np.issubdtype(dtype, np.floating):
        return None
    return f"{name} needs a floating-point parameter, not {dtype}"


class Rule(abc.ABC):
    """An update rule run by the servers."""

    def check(self, dtype: np.dtype) -> str | None:
        """Why this rule cannot update parameters of ``dtype``, or None if it can."""
        return None

    @abc.abstractmethod
    def apply(self, key: str, stored: np.ndarray, update: np.ndarray, state: State) -> None:
        """Change ``stored`` in place with ``update``."""


@dataclass(frozen=True)
class Assign(Rule):
    """The stored value becomes the pushed one (under BSP: the clock's sum). The default."""

    def apply(self, key: str, stored: np.ndarray, update: np.ndarray, state: State) -> None:
        stored[...] = update


@dataclass(frozen=True)
class Sum(Rule):
    """The pushed value is added to the stored one."""

    def apply(self, key: str, stored: np.ndarray, update: np.ndarray, state: State) -> None:
        stored += update


@dataclass(frozen=True)
class SGD(Rule):
    """SGD with momentum and weight decay, as ``torch.optim.SGD`` (dampening 0).

    ``g = update + weight_decay * p``; ``v = momentum * v + g`` (v starts at 0);
    ``p -= lr * v`` (with ``nesterov``: ``p -= lr * (g + momentum * v)``).
    """

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise InvalidArgumentError(f"SGD lr must be > 0, got {self.lr}")
        if not 0.0 <= self.momentum < 1.0:
            raise InvalidArgumentError(f"SGD momentum must be in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            raise InvalidArgumentError(f"SGD weight_decay must be >= 0, got {self.weight_decay}")

    def check(self, dtype: np.dtype) -> str | None:
        return _float_only(dtype, "SGD")

    def apply(self, key: str, stored: np.ndarray, update: np.ndarray, state: State) -> None:
        g = update if self.weight_decay == 0 else update + self.weight_decay * stored
        if self.momentum == 0:
            stored -= self.lr * g
            return
        v = state.get("momentum")
        if v is None:
            v = state["momentum"] = np.zeros_like(stored)
        v *= self.momentum
        v += g
        if self.nesterov:
            stored -= self.lr * (g + self.momentum * v)
        else:
            stored -= self.lr * v


@dataclass(frozen=True)
class Adam(Rule):
    """Adam (Kingma & Ba) with bias correction and L2 weight decay, as ``torch.optim.Adam``."""

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if not self.lr > 0 or not self.eps > 0:
            raise InvalidArgumentError(f"Adam lr and eps must be > 0, got {self.lr}, {self.eps}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise InvalidArgumentError(f"Adam {name} must be in [0, 1)")

    def check(self, dtype: np.dtype) -> str | None:
        return _float_only(dtype, "Adam")

    def apply(self, key: str, stored: np.ndarray, update: np.ndarray, state: State) -> None:
        g = update if self.weight_decay == 0 else update + self.weight_decay * stored
        if "m" not in state:
            state["m"] = np.zeros_like(stored)
            state["v"] = np.zeros_like(stored)
            state["step"] = np.zeros(1, np.int64)
        m, v, step = state["m"], state["v"], state["step"]
        step += 1
        t = int(step[0])
        m *= self.beta1
        m += (1 - self.beta1) * g
        v *= self.beta2
        v += (1 - self.beta2) * (g * g)
        m_hat = m / (1 - self.beta1**t)
        v_hat = v / (1 - self.beta2**t)
        stored -= (self.lr * m_hat / (np.sqrt(v_hat) + self.eps)).astype(stored.dtype)


@dataclass(frozen=True)
class Custom(Rule):
    """A user function ``fn(key, stored, update, state)`` that changes ``stored`` in place."""

    fn: Callable[[str, np.ndarray, np.ndarray, State], None]

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise InvalidArgumentError(f"Custom rule needs a callable, got {self.fn!r}")

    def apply(self, key: str, stored: np.ndarray, update: np.ndarray, state: State) -> None:
        self.fn(key, stored, update, state)
