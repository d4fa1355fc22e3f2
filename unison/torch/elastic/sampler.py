"""ElasticSampler: a DistributedSampler that remembers how far the epoch has got.

Horovod's semantics: ``record_batch(batch_idx, batch_size)`` counts ``batch_size``
more samples processed by this worker (``processed_num``); ``TorchState.sync`` makes
``processed_num`` the samples every worker has processed (rank 0's count times the
number of workers). ``state_dict()`` is ``{"epoch", "processed_num",
"processed_all"}`` (the last: the samples of every worker); after ``load_state_dict``
or a reset the sampler shards only the samples after the first ``processed_all`` of
the epoch's order (Python's ``random.Random(seed + epoch)`` shuffle, as Horovod; a
Horovod checkpoint without ``processed_all`` skips its ``processed_num``);
``set_epoch`` starts the next epoch from zero. Horovod's earlier API is kept too:
``record_indices(indices)`` marks given indices processed (they are skipped after a
reset, and ``TorchState.sync`` takes the union over the ranks) and
``get_indices(batch_idx, batch_size)`` returns a batch's indices on this rank.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator, Sized
from typing import Any

import torch

from ..basics import rank, size

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler[int]):
    """Shards ``dataset`` over the ranks and re-shards the unprocessed rest after a reset."""

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        # the samples of every worker processed this epoch: where a reset starts from
        self.processed_all = 0
        self.processed_indices: set[int] = set()
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.indices: list[int] = []
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` (call it at the end of an epoch): nothing is processed yet."""
        self.epoch = epoch
        self.processed_num = 0
        self.processed_all = 0
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """This worker processed one more batch of ``batch_size`` (as did every worker)."""
        self.processed_num += batch_size
        self.processed_all += batch_size * self.num_replicas

    def record_indices(self, indices: Iterable[int]) -> None:
        """These dataset indices were processed (skipped after the next reset)."""
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """The dataset indices of batch ``batch_idx`` on this rank."""
        start = batch_idx * batch_size
        return self.indices[start : min(start + batch_size, len(self.indices))]

    def state_dict(self) -> dict[str, Any]:
        sd: dict[str, Any] = {
            "epoch": self.epoch,
            "processed_num": self.processed_num,
            "processed_all": self.processed_all,
        }
        if self.processed_indices:
            sd["processed_indices"] = sorted(self.processed_indices)
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict.get("processed_num", 0)
        self.processed_all = state_dict.get("processed_all", self.processed_num)
        self.processed_indices = set(state_dict.get("processed_indices", ()))
        self.reset()

    def load_job_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load the state every worker agreed on (rank 0's, at a sync): from here on
        ``processed_num`` counts from the samples of every worker, as Horovod's does."""
        sd = dict(state_dict)
        sd["processed_num"] = sd.get("processed_all", sd.get("processed_num", 0))
        self.load_state_dict(sd)

    def reset(self) -> None:
        """Re-read the job's size and rank and shard what is left of the epoch."""
        self.num_replicas = size()
        self.rank = rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        rest = order[self.processed_all :]
        if self.processed_indices:
            rest = [i for i in rest if i not in self.processed_indices]
        self.remaining_indices = rest
        self.num_samples = math.ceil(len(rest) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        self.indices = self._shard()

    def _shard(self) -> list[int]:
        padded = list(self.remaining_indices)
        while padded and len(padded) < self.total_size:
            padded += padded[: self.total_size - len(padded)]
        return padded[self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        self.indices = self._shard()
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
