"""ElasticSampler: a DistributedSampler that remembers which samples were processed."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from typing import Any

import torch

from ..basics import rank, size

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler[int]):
    """Shards ``dataset`` over the ranks; after ``record_batch``/``record_indices`` a
    restored state skips the samples already processed this epoch."""

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        start = batch_idx * batch_size
        self.record_indices(self.indices[start : start + batch_size])

    def record_indices(self, indices: list[int]) -> None:
        self.processed_indices.update(indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        start = batch_idx * batch_size
        return self.indices[start : start + batch_size]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = state["epoch"]
        self.processed_indices = set(state["processed_indices"])
        self.reset()

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed_indices)}

    def reset(self) -> None:
        self.num_replicas = size()
        self.rank = rank()
        n = len(self.dataset)
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=g).tolist()
        else:
            order = list(range(n))
        self.remaining_indices = [i for i in order if i not in self.processed_indices]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        padded = list(self.remaining_indices)
        if padded:
            while len(padded) < self.total_size:
                padded += padded[: self.total_size - len(padded)]
        self.indices = padded[self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
