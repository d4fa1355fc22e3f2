"""monitored_barrier on the rank that arrives after rank 0 gave up: Gloo's error."""

from __future__ import annotations

import pytest

from . import _faults
from ._util import run


@pytest.mark.timeout(150)
def test_late_rank_gets_gloos_error_not_an_internal_one() -> None:
    outs = run(_faults.late_to_monitored_barrier, 2, timeout=120)
    assert outs[1].ok, outs[1].describe()
    assert outs[1].value is not None, "the late rank passed the barrier alone"
    name, text = outs[1].value
    assert name == "DistBackendError", (name, text)
    assert text.startswith(
        "Rank 1 successfully reached monitoredBarrier, but received errors while waiting "
        "for send/recv from rank 0. Please check rank 0 logs for faulty rank."
    ), text
    assert "tag" not in text, text  # the barrier's internal tag is no user's business
