"""A short form of the soak (the full 20,000 operations run with `make soak`)."""

from __future__ import annotations

import pytest

from unison.testing import spawn
from unison.testing.soak import soak


@pytest.mark.timeout(240)
def test_short_soak_every_result_right_no_leaks() -> None:
    reports = spawn(soak, 4, args=(1000, 7, 4 << 20), timeout=200, env={"UNISON_TIMEOUT": "60"})
    for rep in reports:
        assert rep.wrong == 0, rep
        assert rep.unexpected_left == 0, rep
        assert rep.fd_growth <= 0 and rep.thread_growth <= 0, rep
        assert rep.anon_growth_mb < 20, rep  # heap: a leak would show here
        assert rep.rss_growth_mb < 20 + 64, rep  # plus shared-memory pool pages first touched
