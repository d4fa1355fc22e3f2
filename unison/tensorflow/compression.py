"""Gradient compression on ``tf.Tensor``: ``Compression.none`` and ``Compression.fp16``."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]


class Compressor:
    """Turns a tensor into what travels (``compress``) and back (``decompress``)."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16; other dtypes are left alone."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        dtype = tensor.dtype
        if dtype.is_floating and dtype != tf.float16:
            return tf.cast(tensor, tf.float16), dtype
        return tensor, dtype

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        if ctx is not None and ctx.is_floating and tensor.dtype != ctx:
            return tf.cast(tensor, ctx)
        return tensor


class Compression:
    """The available compressors (Horovod's names)."""

    none = NoneCompressor
    fp16 = FP16Compressor
