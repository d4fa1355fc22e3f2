"""unison.tensorflow on real processes: one np=3 job runs every check (TF imports are slow),
the Keras checks on the TensorFlow backend included. Three ranks: a size that is not a power
of two, and a process set of one rank (the odd ranks)."""

from __future__ import annotations

import importlib.util

import pytest

from unison.testing import spawn

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None, reason="needs the [tensorflow] extra"
)


def _job() -> dict:
    from tests.tensorflow._checks import tf_job

    return tf_job()


@pytest.mark.timeout(600)
def test_tensorflow_np3() -> None:
    env = {"UNISON_TIMEOUT": "60", "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow",
           "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}  # fmt: skip
    outs = spawn(_job, 3, env=env, timeout=540)
    assert all(o["ops"] == 20 for o in outs)
    assert all(o["keras"]["backend"] == "tensorflow" for o in outs)


def test_import_unison_torch_does_not_import_tensorflow() -> None:
    import subprocess
    import sys

    code = (
        "import sys, unison, unison.torch; "
        "bad = [m for m in ('tensorflow', 'jax', 'keras') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
