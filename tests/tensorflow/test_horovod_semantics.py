"""Horovod's TensorFlow semantics (issue 30), each stated by a check of
tests/tensorflow/_semantics.py: one np=2 job runs them all (TF imports are slow), and
each check is reported as a test of its own."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from typing import Any

import pytest

from unison.testing import spawn

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None, reason="needs the [tensorflow] extra"
)

KERAS3 = [
    "alltoall_returns",
    "moved_dtypes",
    "gradients",
    "missing_pieces",
    "error_types",
    "local_sources",
    "sync_batch_norm",
    "legacy_optimizer",
    "keras_local",
    "graph_any_order",
    "broadcast_inplace",
]
ENV = {"UNISON_TIMEOUT": "60", "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow",
       "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}  # fmt: skip


def _job(names: list[str]) -> dict[str, Any]:
    from tests.tensorflow._semantics import semantics_job

    return semantics_job(names)


@pytest.fixture(scope="module")
def keras3_results() -> list[dict[str, Any]]:
    return spawn(_job, 2, args=(KERAS3,), env=ENV, timeout=800, start_method="spawn")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("check", KERAS3)
def test_horovod_semantics(keras3_results: list[dict[str, Any]], check: str) -> None:
    for rank, res in enumerate(keras3_results):
        assert res[check] is None, f"rank {rank}: {res[check]}"


KERAS2 = ["keras2_fit", "keras2_through_keras", "keras2_elastic_state", "keras2_aggregation"]


@pytest.fixture(scope="module")
def keras2_results() -> list[dict[str, Any]]:
    if importlib.util.find_spec("tf_keras") is None:
        pytest.skip("needs tf_keras (Keras 2)")
    env = {**ENV, "TF_USE_LEGACY_KERAS": "1"}
    return spawn(_job, 2, args=(KERAS2,), env=env, timeout=500, start_method="spawn")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("check", KERAS2)
def test_tf_keras(keras2_results: list[dict[str, Any]], check: str) -> None:
    """Keras 2 users: tf_keras with TF_USE_LEGACY_KERAS=1."""
    for rank, res in enumerate(keras2_results):
        assert res[check] is None, f"rank {rank}: {res[check]}"


@pytest.mark.timeout(120)
def test_tf_keras_front_whatever_tf_keras_is_named() -> None:
    """Under TF_USE_LEGACY_KERAS=1 ``unison.tensorflow.keras`` serves Keras 2's wrapper
    even where ``tf.keras`` is named ``tensorflow.keras`` (after ``from
    tensorflow.keras.optimizers import Optimizer``, as Horovod's test_tensorflow2_keras.py
    does before importing ``horovod.tensorflow.keras``)."""
    if importlib.util.find_spec("tf_keras") is None:
        pytest.skip("needs tf_keras (Keras 2)")
    code = (
        "import tensorflow as tf\n"
        "from tensorflow.keras.optimizers import Optimizer\n"
        "import unison.keras\n"
        "import unison.tensorflow.keras as hk\n"
        "print('FRONT', hk.DistributedOptimizer.__module__)\n"
    )
    env = {**os.environ, **ENV, "TF_USE_LEGACY_KERAS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=100
    )
    assert out.returncode == 0, out.stderr[-2000:]
    fronts = [ln.split()[1] for ln in out.stdout.splitlines() if ln.startswith("FRONT ")]
    assert fronts == ["unison.tensorflow.keras.keras2"], out.stdout
