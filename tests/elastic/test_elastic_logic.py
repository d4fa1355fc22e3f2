"""The driver-independent pieces of elastic jobs, in one process: discovery output,
blacklist cool-downs, which workers to start, who gets which rank, rounds in a store."""

from __future__ import annotations

import pytest

from unison.elastic import (
    Assignment,
    Blacklist,
    FixedHosts,
    Member,
    Round,
    ScriptDiscovery,
    assign,
    latest_round,
    parse_hosts_output,
    plan,
    publish,
    read_round,
)
from unison.errors import InvalidArgumentError, LaunchError
from unison.launch.cli import build_parser
from unison.store import TCPStore, TCPStoreServer


def test_discovery_output_format() -> None:
    text = "a:4\n\n  b  \n# a comment\nc:2 # trailing\n"
    assert parse_hosts_output(text, default_slots=3) == {"a": 4, "b": 3, "c": 2}
    assert list(parse_hosts_output("z:1\na:1\n")) == ["z", "a"]  # order kept
    for bad in ("a:x", ":3", "a:-1"):
        with pytest.raises(InvalidArgumentError, match="host or host:slots"):
            parse_hosts_output(bad)


def test_script_discovery_runs_the_script(tmp_path: pytest.TempPathFactory) -> None:
    ok = ScriptDiscovery("printf 'h1:2\\nh2\\n'", default_slots=5)
    assert ok.find_available_hosts_and_slots() == {"h1": 2, "h2": 5}
    with pytest.raises(LaunchError, match=r"Failed to execute discovery script.*Exit code: 3"):
        ScriptDiscovery("exit 3").find_available_hosts_and_slots()
    fixed = FixedHosts({"a": 2})
    fixed.set({"a": 2, "b": 1})
    assert fixed.find_available_hosts_and_slots() == {"a": 2, "b": 1}


def test_blacklist_cooldown_doubles_up_to_max() -> None:
    now = [100.0]
    bl = Blacklist((2, 5), clock=lambda: now[0])
    assert bl.add("h") == 2.0
    assert bl.is_blacklisted("h") and not bl.is_blacklisted("other")
    assert bl.filter({"h": 2, "other": 1}) == {"other": 1}
    now[0] += 2.0
    assert not bl.is_blacklisted("h")
    assert bl.add("h") == 4.0 and bl.add("h") == 5.0  # 2, 4, then capped at 5
    forever = Blacklist(None, clock=lambda: now[0])
    assert forever.add("h") is None
    now[0] += 1e9
    assert forever.is_blacklisted("h")
    with pytest.raises(InvalidArgumentError, match="cooldown"):
        Blacklist((5, 2))


def test_plan_fills_free_slots_in_host_order_up_to_max_np() -> None:
    live = [Member("a[0]", "a", 0), Member("b[1]", "b", 1)]
    hosts = {"c": 2, "a": 2, "b": 1}
    assert plan(live, hosts, None, host_order=["a", "b"]) == ["a", "c", "c"]
    assert plan(live, hosts, 4, host_order=["a", "b"]) == ["a", "c"]
    assert plan(live, hosts, 2, host_order=["a", "b"]) == []
    assert plan(live, {"a": 1}, None) == []  # b is gone (blacklisted): nothing to start


def test_assign_keeps_old_ranks_first_and_hosts_contiguous() -> None:
    # the old rank 0's host (a) lost nothing; host b's rank 1 survived; two new workers
    members = [
        Member("b[1]", "b", 1),
        Member("a[0]", "a", 0),
        Member("c[5]", "c"),
        Member("a[6]", "a"),
    ]
    got = assign(members)
    assert [got[m].rank for m in ("a[0]", "a[6]", "b[1]", "c[5]")] == [0, 1, 2, 3]
    assert got["a[6]"] == Assignment(1, 4, 1, 2, 0, 3, "a")
    assert got["c[5]"] == Assignment(3, 4, 0, 1, 2, 3, "c")
    # rank 0 of a new world is a survivor even when the first host lost everything
    got = assign([Member("x[9]", "x"), Member("b[1]", "b", 3)])
    assert got["b[1]"].rank == 0 and got["x[9]"].rank == 1


def test_rounds_in_the_store() -> None:
    secret = b"s" * 32
    with TCPStoreServer("127.0.0.1", 0, secret) as server:
        server.start()
        store = TCPStore("127.0.0.1", server.address[1], secret, timeout=10)
        try:
            assert latest_round(store) == -1
            rnd = Round(0, "initial world", assign([Member("h[0]", "h"), Member("h[1]", "h")]))
            publish(store, rnd)
            publish(store, Round(1, "why", {}))
            assert latest_round(store) == 1
            back = read_round(store, 0, timeout=5)
            assert back == rnd and back.size == 2 and back.workers["h[1]"].local_rank == 1
        finally:
            store.close()


def test_cli_flags_parse_like_horovodrun() -> None:
    argv = [
        "run", "-np", "4", "--min-np", "2", "--max-np", "6",
        "--host-discovery-script", "./d.sh", "--elastic-timeout", "30", "--reset-limit", "3",
        "--blacklist-cooldown-range", "10", "100", "--slots-per-host", "2", "python", "t.py",
    ]  # fmt: skip
    args = build_parser("run").parse_args(argv)
    assert (args.np, args.min_np, args.max_np, args.reset_limit) == (4, 2, 6, 3)
    assert args.host_discovery_script == "./d.sh" and args.elastic_timeout == 30.0
    assert args.blacklist_cooldown_range == [10.0, 100.0] and args.slots_per_host == 2


def test_cancelled_rendezvous_stops_waiting_for_a_member() -> None:
    # ranks 0 and 1 of a world of 3 wait for rank 2, which never comes; the driver
    # cancels that world's rendezvous: both stop at once with the reason
    import threading

    from unison.bootstrap import connect_mesh
    from unison.elastic import cancel
    from unison.elastic.rendezvous import epoch_of
    from unison.errors import AbortedError

    secret = b"k" * 32
    with TCPStoreServer("127.0.0.1", 0, secret) as server:
        server.start()
        port = server.address[1]
        errors: dict[int, BaseException] = {}

        def member(rank: int) -> None:
            store = TCPStore("127.0.0.1", port, secret, timeout=60)
            try:
                connect_mesh(
                    store, rank, 3, secret, "job", advertise="127.0.0.1", bind="",
                    timeout=60, epoch=epoch_of(7), adopt=lambda peer, sock: sock.close(),
                )  # fmt: skip
            except BaseException as exc:
                errors[rank] = exc
            finally:
                store.close()

        threads = [threading.Thread(target=member, args=(r,)) for r in (0, 1)]
        for t in threads:
            t.start()
        driver = TCPStore("127.0.0.1", port, secret, timeout=30)
        try:
            driver.wait([f"unison/{epoch_of(7)}/peer/{r}" for r in (0, 1)], timeout=30)
            cancel(driver, 7, "superseded by world 8: rank 2 died")
        finally:
            driver.close()
        for t in threads:
            t.join(timeout=30)
    assert sorted(errors) == [0, 1], errors
    for rank, exc in errors.items():
        assert isinstance(exc, AbortedError) and exc.op == "init", repr(exc)
        assert f"rank {rank}: the rendezvous was cancelled: superseded by world 8" in str(exc)
