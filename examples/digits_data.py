"""The digits CNN and data set shared by the digits examples (pytorch_digits.py,
ddp_digits.py, elastic_digits.py): plain torch and scikit-learn, nothing of unison, so
the DDP example stays a torch.distributed script whose only unison line is the backend."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

__all__ = ["Net", "load_data"]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def load_data(seed: int) -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's 8x8 digits scaled to [0, 1], a stratified 80/20 split by ``seed``."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    return (
        TensorDataset(torch.from_numpy(xtr), torch.from_numpy(ytr)),
        TensorDataset(torch.from_numpy(xte), torch.from_numpy(yte)),
    )
