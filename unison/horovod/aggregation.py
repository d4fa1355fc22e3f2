"""Horovod's rule for gradients aggregated locally over ``backward_passes_per_step``
passes, framework-neutral: what the Keras 3 and the Keras 2 optimizer wrappers share."""

from __future__ import annotations

__all__ = ["aggregated_gradient_factor", "check_passes"]


def check_passes(backward_passes_per_step: int) -> int:
    """``backward_passes_per_step`` as an int, or ValueError where it is below one."""
    passes = int(backward_passes_per_step)
    if passes < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    return passes


def aggregated_gradient_factor(backward_passes_per_step: int, average: bool) -> float:
    """What Horovod multiplies the reduced sum of ``backward_passes_per_step`` passes'
    gradients by before applying it: the sum stays a sum, unless
    ``average_aggregated_gradients`` (``average``) asks for the mean over the passes."""
    passes = check_passes(backward_passes_per_step)
    return 1.0 / passes if average else 1.0
