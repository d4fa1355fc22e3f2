"""Every transport passes the same conformance suite (unison.testing.conformance)."""

from __future__ import annotations

import pytest

from unison.testing import run_ranks
from unison.testing.conformance import CASES, EXPECTED

TRANSPORTS = ["tcp", "shm"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_conformance(case: str, transport: str) -> None:
    fn, np_ = CASES[case]
    env = {"UNISON_TRANSPORT": transport, "UNISON_TIMEOUT": "60"}
    outs = run_ranks(fn, np_, args=(EXPECTED[transport],), env=env, timeout=80)
    if case == "peer_dies_mid_message":
        assert outs[1].exitcode == 3 or not outs[1].ok
        assert outs[0].ok, outs[0].describe()
        assert "rank 1" in outs[0].value
        return
    bad = [o.describe() for o in outs if not o.ok]
    assert not bad, "\n".join(bad)
