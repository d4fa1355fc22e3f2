"""The runner of PyTorch's own distributed suite (unison.testing.torch_suite)."""

from __future__ import annotations

from unison.testing import torch_suite as ts


def test_compare_flags_gloo_passes_missing_on_unison_except_the_named_ones() -> None:
    gloo = {"test_a": "pass", "test_b": "pass", "test_get_backend": "pass", "test_c": "skip"}
    unison = {"test_a": "pass", "test_b": "fail", "test_get_backend": "fail", "test_c": "fail"}
    gaps, expected = ts.compare(gloo, unison)
    assert gaps == ["test_b"]
    assert expected == ["test_get_backend"]
    # a test absent from the unison run is a gap too
    assert ts.compare({"test_d": "pass"}, {}) == (["test_d"], [])


def test_groups_asked_for_on_gloo_are_made_on_unison() -> None:
    assert ts._held_backend("gloo") == "unison"
    assert ts._held_backend("GLOO") == "unison"
    assert ts._held_backend(None) == "unison"
    assert ts._held_backend("nccl") == "nccl"  # never silently replaced


def test_failure_text_extracts_the_exception_lines() -> None:
    log = "\n".join(
        [
            "=" * 70,
            "ERROR: test_x (__main__.TorchSuite.test_x)",
            "-" * 70,
            "Traceback (most recent call last):",
            '  File "a.py", line 1, in f',
            "ValueError: monitored_barrier is only implemented for GLOO backend.",
            "=" * 70,
            "ERROR: test_y (__main__.TorchSuite.test_y)",
        ]
    )
    assert "ValueError: monitored_barrier" in ts._failure_text(log, "test_x")
    assert ts._failure_text(log, "test_z") == "(no failure report found)"


def test_run_fails_on_a_failed_test_or_when_nothing_passed() -> None:
    assert ts.run_status({"test_a": "pass", "test_b": "skip"}) == 0
    assert ts.run_status({"test_a": "pass", "test_b": "fail"}) == 1
    assert ts.run_status({"test_a": "skip"}) == 1  # nothing ran
    assert ts.run_status({}) == 1
