"""The measured link model (cache per host, knobs win) and the adaptive wait policy."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

import unison as un
from unison import link as linkmodel
from unison.testing import run_ranks
from unison.transport import calibrate
from unison.transport.wait_policy import SPIN_CAP_S, YIELD_CAP_S, WaitPolicy


@pytest.mark.timeout(60)
def test_measured_once_cached_per_host_and_overridable(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    env = {"UNISON_LINK_CACHE": str(tmp_path)}
    calibrate._memo.clear()
    # reading never measures: without a cache, the typical figures (not remembered)
    monkeypatch.setattr(calibrate, "measure", lambda: pytest.fail("measured on a read"))
    assert calibrate.load(env) == calibrate.typical(env)
    assert not list(tmp_path.iterdir())
    monkeypatch.undo()
    cal = calibrate.load(env, measure_missing=True)
    assert cal.source.startswith("measured")
    for tr in ("shm", "tcp"):
        p = cal.link(tr)
        assert 0 < p.alpha < 1 and 0 < p.beta < 1e-6, (tr, p)
    assert 0 < cal.overhead < 1
    # the slot barrier was measured with two ranks per core (a core each needs 2 cores)
    assert 0 < cal.sync_crowded < 1 and 0 <= cal.sync < 1
    assert (cal.sync > 0) == (calibrate.host_key()["cores"] >= 2)
    (path,) = tmp_path.glob("linkmodel-*.json")
    assert path == calibrate.cache_path(env)
    stored = json.loads(path.read_text())
    keys = ("cpu", "cores", "unison", "format")
    assert {k: stored["host"][k] for k in keys} == calibrate.host_key()
    # the rates between processes (2 forked ranks on 2 cores) and a slot call's cost
    # beyond them
    two = calibrate.host_key()["cores"] >= 2
    assert (cal.xcopy > 0 and cal.xgamma > 0 and cal.xsync > 0) == two
    assert (cal.cold_xcopy > 0 and cal.cold_xgamma > 0) == two
    if two:
        assert 1e-12 < cal.xcopy < 1e-7 and 1e-12 < cal.xgamma < 1e-7 and cal.xsync < 0.01

    # a second process (fresh memo) reads the cache instead of measuring
    calibrate._memo.clear()
    monkeypatch.setattr(calibrate, "measure", lambda: pytest.fail("measured again"))
    again = calibrate.load(env)
    assert again.source == "cache" and again.shm == cal.shm and again.tcp == cal.tcp
    assert again.sync == cal.sync and again.sync_crowded == cal.sync_crowded
    assert (again.xcopy, again.xgamma, again.xsync) == (cal.xcopy, cal.xgamma, cal.xsync)

    # knobs pin values over the measurement
    pinned = calibrate.load({**env, "UNISON_SHM_ALPHA": "3e-6", "UNISON_CALL_OVERHEAD": "1e-5"})
    assert pinned.shm.alpha == 3e-6 and pinned.call_overhead == 1e-5
    assert pinned.shm.beta == cal.shm.beta and pinned.tcp == cal.tcp
    assert "overrides" in pinned.source
    synced = calibrate.load({**env, "UNISON_SHM_SYNC": "7e-6", "UNISON_SHM_SYNC_CROWDED": "9e-5"})
    assert (synced.sync, synced.sync_crowded) == (7e-6, 9e-5) and "overrides" in synced.source

    # install hands it to the one link model that selection and cost() read
    try:
        assert calibrate.install({**env, "UNISON_CALL_OVERHEAD": "1e-5"}) is not None
        shm = linkmodel.transport_link("shm")
        assert shm.alpha == pytest.approx(cal.shm.alpha + 2 * cal.overhead)
        assert shm.beta == cal.shm.beta and shm.overhead == 1e-5
        assert linkmodel.shared_link().alpha == shm.alpha
        # the direct algorithms' rates, in cache and out of it, reach the shared link
        assert cal.copy > 0 and cal.gamma > 0 and cal.cold_copy > 0 and cal.big >= 1 << 20
        shared = linkmodel.shared_link(slots=True)
        assert shared.copy == cal.copy and shared.gamma == cal.gamma and shared.cma == cal.cma
        assert shared.at(cal.big) is shared
        assert shared.sync == (cal.sync or shm.alpha) and shared.sync_crowded == cal.sync_crowded
        assert linkmodel.shared_link().sync == 0.0  # rounds without slots: messages
        cold = shared.at(cal.big + 1)
        assert isinstance(cold, linkmodel.SharedLink) and cold.copy == cal.cold_copy
        assert cold.gamma == cal.cold_gamma and cold.cma == cal.cold_cma
        assert cold.sync == shared.sync and cold.sync_crowded == shared.sync_crowded
        # a pinned sync cost is what the direct algorithms' cost() counts per sync
        calibrate.install({**env, "UNISON_SHM_SYNC": "7e-6", "UNISON_SHM_SYNC_CROWDED": "9e-5"})
        pinned_link = linkmodel.shared_link(slots=True)
        assert (pinned_link.sync, pinned_link.sync_crowded) == (7e-6, 9e-5)
        # the rates between processes reach the link (the selector's link keeps its
        # own; predictions take them through Link.between_processes)
        shm = linkmodel.transport_link("shm")
        assert (shm.xcopy, shm.xgamma, shm.xsync) == (cal.xcopy, cal.xgamma, cal.xsync)
        assert shm.copy == cal.copy and shm.gamma == cal.gamma
        if cal.cold_xcopy > 0:
            assert shm.cold is not None and shm.cold.xcopy == cal.cold_xcopy
    finally:
        linkmodel.clear_measured()

    # a cache written before these rates existed is measured again, not half-read
    old = json.loads(path.read_text())
    for key in ("cold_copy", "sync", "xcopy", "xsync"):
        path.write_text(json.dumps({k: v for k, v in old.items() if k != key}))
        assert calibrate._read(path) is None, key
    path.write_text(json.dumps(old))

    # measured while the machine was busy, read when it is quiet: measure again
    assert calibrate._read(path) is not None
    data = json.loads(path.read_text())
    data["host"]["load"] = 100.0
    path.write_text(json.dumps(data))
    monkeypatch.setattr(calibrate, "_load", lambda: 0.0)
    assert calibrate._read(path) is None

    # a cache of another format (e.g. written by an older unison) lives elsewhere
    monkeypatch.setattr(calibrate, "FORMAT", calibrate.FORMAT - 1)
    assert calibrate.cache_path(env) != path
    monkeypatch.undo()
    monkeypatch.setattr(calibrate, "_load", lambda: 0.0)

    # another machine (other core count) does not use this host's file
    real = calibrate.host_key()
    monkeypatch.setattr(calibrate, "host_key", lambda: {**real, "cores": real["cores"] + 1})
    assert calibrate.cache_path(env) != path
    path.write_text(path.read_text())  # the old file is still there, but keyed elsewhere
    assert calibrate._read(path) is None
    assert calibrate.cache_path({"UNISON_LINK_CACHE": "off"}) is None


def _init_reads_the_model() -> tuple[float, float]:
    def refuse() -> calibrate.Calibration:
        raise AssertionError("unison.init measured the host")

    calibrate.measure = refuse  # this rank's process only (forked)
    t = __import__("time").perf_counter()
    un.init()
    took = __import__("time").perf_counter() - t
    x = np.full(1000, un.rank() + 1.0, np.float32)
    un.all_reduce(x)
    assert (x == 3.0).all(), x[:4]
    return linkmodel.transport_link("shm").hop, took


@pytest.mark.timeout(120)
def test_init_never_measures_reads_the_cache_else_typical(tmp_path: Path) -> None:
    env = {"UNISON_LINK_CACHE": str(tmp_path)}
    outs = run_ranks(_init_reads_the_model, 2, env=env, init=False, timeout=90)
    assert all(o.ok for o in outs), "\n".join(o.describe() for o in outs)
    # no cache: the typical host's figures, and nothing written (nothing was measured)
    assert [o.value[0] for o in outs] == [calibrate.typical(env).shm.alpha] * 2
    assert not list(tmp_path.glob("*.json"))
    # a cache (as `unison bench --calibrate` writes it): every rank installs it
    cached = dataclasses.replace(calibrate.typical(env), shm=calibrate.LinkParams(3e-6, 1e-10))
    path = calibrate.cache_path(env)
    assert path is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cached.to_json()))
    outs = run_ranks(_init_reads_the_model, 2, env=env, init=False, timeout=90)
    assert all(o.ok for o in outs), "\n".join(o.describe() for o in outs)
    assert [o.value[0] for o in outs] == [3e-6, 3e-6]


def test_wait_policy_oversubscribed_yields_at_once() -> None:
    p = WaitPolicy(oversubscribed=True)
    assert p.spin_s == 0.0 and 0 < p.yield_s <= YIELD_CAP_S
    for _ in range(50):
        p.observe(1e-6)
    assert p.spin_s == 0.0, "ranks outnumber cores: never spin"


def test_wait_policy_learns_from_response_times() -> None:
    p = WaitPolicy(oversubscribed=False)
    assert 0 < p.spin_s <= SPIN_CAP_S
    for _ in range(50):  # peers answer in 5 µs: spin about twice that
        p.observe(5e-6)
    assert p.spin_s == pytest.approx(10e-6, rel=0.05)
    for _ in range(50):  # peers answer in 2 ms: spinning would not pay, yield instead
        p.observe(2e-3)
    assert p.spin_s == 0.0
    assert p.yield_s == YIELD_CAP_S
    for _ in range(50):  # long compute between calls (waits that slept): bounded, no spin
        p.observe(30.0, blocked=True)
    assert p.spin_s == 0.0 and p.yield_s == YIELD_CAP_S and p.response <= 2 * YIELD_CAP_S
    for _ in range(80):  # fast again: the policy comes back to spinning
        p.observe(4e-6)
    assert 0 < p.spin_s <= SPIN_CAP_S


def _knob_on_rank0_only() -> float:
    import os

    if os.environ["UNISON_RANK"] == "0":
        os.environ["UNISON_SHM_ALPHA"] = "3e-6"  # this rank's model differs from its peer's
    hop, _ = _init_reads_the_model()
    return hop


@pytest.mark.timeout(120)
def test_ranks_whose_models_differ_all_take_the_typical_figures(tmp_path: Path) -> None:
    env = {"UNISON_LINK_CACHE": str(tmp_path)}
    outs = run_ranks(_knob_on_rank0_only, 2, env=env, init=False, timeout=90)
    assert all(o.ok for o in outs), "\n".join(o.describe() for o in outs)
    assert [o.value for o in outs] == [calibrate.typical({}).shm.alpha] * 2
