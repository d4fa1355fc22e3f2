"""unison.keras on Keras 3's torch and jax backends (the TensorFlow backend runs inside
tests/tensorflow's job): one np=2 job per backend."""

from __future__ import annotations

import importlib.util

import pytest

from unison.testing import spawn


def _job() -> dict:
    from tests.keras._checks import keras_job

    return keras_job()


@pytest.mark.timeout(400)
@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_keras_backend(backend: str) -> None:
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec(backend) is None:
        pytest.skip(f"needs keras and {backend}")
    env = {"UNISON_TIMEOUT": "60", "KERAS_BACKEND": backend, "JAX_PLATFORMS": "cpu",
           "TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": "1"}  # fmt: skip
    outs = spawn(_job, 2, env=env, timeout=360, start_method="spawn")
    assert [o["backend"] for o in outs] == [backend, backend]
    assert outs[0]["lrs"] == outs[1]["lrs"]
