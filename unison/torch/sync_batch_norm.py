"""SyncBatchNorm: batch normalization with statistics over every rank's batch.

Horovod's ``hvd.SyncBatchNorm``: in training, the mean and variance are those of the
whole global batch (every rank's samples), so the result equals one process running
``BatchNorm`` on the concatenated batch; running statistics are updated with the
global ones (unbiased variance over the global count). In eval mode with running
statistics, and in a job of one process, it is plain batch normalization.

The statistics travel through the differentiable :func:`allreduce` (op Sum), so
autograd gives each rank the gradient of its inputs through the global statistics;
weight and bias gradients stay local (the DistributedOptimizer averages them), as in
Horovod. Unlike Horovod, CPU tensors are accepted (unison moves CPU tensors only).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from .basics import size
from .collectives import allreduce
from .ops import Sum

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_BatchNorm):
    """Batch normalization synchronized over the ranks (Horovod's signature)."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def _run_bn(self, input: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(
            input,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            self.training or not self.track_running_stats,
            self.momentum if self.momentum is not None else 0.0,
            self.eps,
        )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if self.training and self.track_running_stats:
            assert self.num_batches_tracked is not None
            self.num_batches_tracked.add_(1)
        if not self.training and self.track_running_stats:
            return self._run_bn(input)
        if size() == 1:
            if self.momentum is None and self.training and self.track_running_stats:
                return self._sync_bn(input)  # cumulative average needs the batch count
            return self._run_bn(input)
        return self._sync_bn(input)

    def _factor(self) -> float:
        if self.momentum is None:
            assert self.num_batches_tracked is not None
            return 1.0 / float(self.num_batches_tracked.item())
        return float(self.momentum)

    def _sync_bn(self, input: torch.Tensor) -> torch.Tensor:
        c = input.shape[1]
        dims = [0, *range(2, input.dim())]
        shape = [1, c] + [1] * (input.dim() - 2)
        count = torch.tensor([input.numel() // c], dtype=input.dtype)
        # two passes (mean, then squared deviations): as exact as one process's BatchNorm
        first = allreduce(
            torch.cat([input.sum(dims), count]), op=Sum, name="sync_batch_norm.sum_count"
        )
        total = first[c].detach()
        mean = first[:c] / total
        centered = input - mean.view(shape)
        sq = allreduce((centered * centered).sum(dims), op=Sum, name="sync_batch_norm.sq")
        var = sq / total
        if self.training and self.track_running_stats:
            assert self.running_mean is not None and self.running_var is not None
            f = self._factor()
            n = float(total.item())
            with torch.no_grad():
                self.running_mean.mul_(1 - f).add_(mean.detach().to(self.running_mean.dtype) * f)
                unbiased = var.detach() * (n / max(n - 1.0, 1.0))
                self.running_var.mul_(1 - f).add_(unbiased.to(self.running_var.dtype) * f)
        out = centered * torch.rsqrt(var + self.eps).view(shape)
        if self.weight is not None:
            out = out * self.weight.view(shape)
        if self.bias is not None:
            out = out + self.bias.view(shape)
        return out

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module) -> Any:
        """Replace every BatchNorm*D in ``module`` by a SyncBatchNorm with its state."""
        out: torch.nn.Module = module
        if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
            out = cls(
                module.num_features,
                module.eps,
                module.momentum,
                module.affine,
                module.track_running_stats,
            )
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child))
        return out
