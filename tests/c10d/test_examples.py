"""The examples run unchanged: the seeds' snippets on both APIs, DDP digits to >= 95%."""

from __future__ import annotations

from pathlib import Path

import pytest

from ._util import run_script

EX = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", ["seeds_p2p_native.py", "seeds_p2p_c10d.py"])
def test_seed_snippets(name: str) -> None:
    run_script(str(EX / name), 2)


@pytest.mark.timeout(300)
def test_ddp_digits_reaches_95_percent_with_identical_parameters() -> None:
    # the script itself exits non-zero below --min-accuracy (0.95) or if ranks differ
    run_script(str(EX / "ddp_digits.py"), 2, timeout=280)
