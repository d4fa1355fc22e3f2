"""The digits job (examples/ray_digits.py, the CNN of examples/pytorch_digits.py) through
RayExecutor: the same accuracy bar as under `unison run`, identical parameters on every
rank."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'unison-collectives[ray]')")
pytest.importorskip("torch", reason="the digits job needs torch")
pytest.importorskip("sklearn", reason="the digits job needs scikit-learn")

from ray import cloudpickle

from unison.ray import RayExecutor

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ray_digits.py"
MIN_ACCURACY = 0.95  # examples/pytorch_digits.py's --min-accuracy default


@pytest.mark.usefixtures("ray_local")
@pytest.mark.timeout(240)
def test_digits_through_ray_executor_reaches_the_unison_run_bar(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = importlib.util.spec_from_file_location("ray_digits_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)  # the actors cannot import examples/
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=120), num_workers=2)
    ex.start()
    try:
        results = ex.run(module.train)
    finally:
        ex.shutdown()
        cloudpickle.unregister_pickle_by_value(module)
    assert [r["rank"] for r in results] == [0, 1]
    assert {r["size"] for r in results} == {2}
    assert all(r["identical"] for r in results)
    assert results[0]["accuracy"] == results[1]["accuracy"] >= MIN_ACCURACY
