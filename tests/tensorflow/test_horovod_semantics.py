"""Horovod's TensorFlow semantics (issue 30), each stated by a check of
tests/tensorflow/_semantics.py: one np=2 job runs them all (TF imports are slow), and
each check is reported as a test of its own."""

from __future__ import annotations

import importlib.util
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


@pytest.mark.timeout(600)
def test_tf_keras_distributed_optimizer_and_callbacks() -> None:
    """Keras 2 users: tf_keras with TF_USE_LEGACY_KERAS=1."""
    if importlib.util.find_spec("tf_keras") is None:
        pytest.skip("needs tf_keras (Keras 2)")
    env = {**ENV, "TF_USE_LEGACY_KERAS": "1"}
    for rank, res in enumerate(
        spawn(_job, 2, args=(["keras2_fit"],), env=env, timeout=500, start_method="spawn")
    ):
        assert res["keras2_fit"] is None, f"rank {rank}: {res['keras2_fit']}"
