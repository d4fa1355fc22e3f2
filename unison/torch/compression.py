"""Gradient compression for the wire: ``Compression.none`` and ``Compression.fp16``."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]


class Compressor:
    """Turns a tensor into what travels (``compress``) and back (``decompress``)."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16; other dtypes are left alone."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        dtype = tensor.dtype
        if dtype.is_floating_point and dtype is not torch.float16:
            return tensor.to(torch.float16), dtype
        return tensor, dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        if ctx is not None and ctx.is_floating_point and tensor.dtype is not ctx:
            return tensor.to(ctx)
        return tensor


class Compression:
    """The available compressors (Horovod's names)."""

    none = NoneCompressor
    fp16 = FP16Compressor
