"""config.py parsing and the error tree's builtin bases."""

from __future__ import annotations

import pytest

import unison as un
from unison import errors as E
from unison.config import KNOBS, Config, load_config, unknown_variables


def test_defaults_and_parsing() -> None:
    assert load_config({}) == Config()
    cfg = load_config(
        {
            "UNISON_TIMEOUT": "2.5",
            "UNISON_SEGMENT_BYTES": "64K",
            "UNISON_CHECK_MISMATCH": "off",
            "UNISON_TRANSPORT": "TCP",
        }
    )
    assert (cfg.timeout, cfg.segment_bytes, cfg.check_mismatch, cfg.transport) == (
        2.5,
        65536,
        False,
        "tcp",
    )


@pytest.mark.parametrize(
    "env",
    [
        {"UNISON_TIMEOUT": "-1"},
        {"UNISON_TIMEOUT": "soon"},
        {"UNISON_TRANSPORT": "carrier-pigeon"},
        {"UNISON_CHECK_MISMATCH": "maybe"},
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str]) -> None:
    with pytest.raises(E.InvalidArgumentError, match=next(iter(env))):
        load_config(env)


def test_every_knob_is_a_config_field_and_typos_are_reported() -> None:
    fields = set(Config.__dataclass_fields__)
    assert all(k.field in fields and k.env.startswith("UNISON_") for k in KNOBS)
    assert unknown_variables({"UNISON_TIMEOUTT": "3", "UNISON_RANK": "0"}) == ["UNISON_TIMEOUTT"]


def test_errors_inherit_the_builtin_that_fits() -> None:
    assert issubclass(E.InvalidArgumentError, ValueError)
    assert issubclass(E.CollectiveTimeoutError, TimeoutError)
    assert issubclass(E.PeerLostError, ConnectionError)
    assert issubclass(E.StoreTimeoutError, TimeoutError)
    assert issubclass(E.MismatchError, RuntimeError)
    for name in E.__all__:
        assert issubclass(getattr(E, name), E.UnisonError)
    err = E.CollectiveTimeoutError("x", op="all_reduce", seq=3, group=0, ranks=[2, 1, 2])
    assert (err.op, err.seq, err.ranks) == ("all_reduce", 3, (1, 2))


def test_public_api_is_pinned() -> None:
    assert sorted(un.__all__) == sorted(set(un.__all__))
    for name in un.__all__:
        assert hasattr(un, name), name


def test_job_warnings_once_per_job_from_rank_0(caplog: pytest.LogCaptureFixture) -> None:
    from unison import jobenv

    jobenv._warned_unknown.clear()
    base = {
        "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x", "UNISON_TIMEUOT": "3",
    }  # fmt: skip
    with caplog.at_level("WARNING", logger="unison"):
        jobenv.detect_job({**base, "RANK": "1", "LOCAL_RANK": "1"})
        assert caplog.records == []  # rank 1 says nothing: rank 0 speaks for the job
        for _ in range(2):
            jobenv.detect_job({**base, "RANK": "0", "LOCAL_RANK": "0"})
    texts = [r.getMessage() for r in caplog.records]
    typo = [t for t in texts if "UNISON_TIMEUOT" in t]
    assert typo == ["unknown variable UNISON_TIMEUOT is ignored; did you mean UNISON_TIMEOUT?"]
    # the store listens on loopback: the derived secret is said at INFO only
    assert not any("UNISON_SECRET" in t for t in texts), texts
