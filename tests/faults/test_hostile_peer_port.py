"""Strangers at a rank's peer port during bootstrap (the only time it is open): junk,
a huge announced length, forged and replayed handshakes, a slow drip, a flood of
connections. Each is refused; the job connects and computes correctly."""

from __future__ import annotations

import json
import logging
import os
import socket
import struct
import threading
import time

import numpy as np
import pytest

from unison.testing import spawn

pytestmark = pytest.mark.timeout(120)


def _attack(host: str, port: int, stop: threading.Event) -> dict[str, int]:
    """Throw every kind of garbage at the port; count connections the port accepted."""
    sent = {"junk": 0, "forged": 0, "flood": 0, "drip": 0}

    def one(payload: bytes) -> None:
        try:
            with socket.create_connection((host, port), timeout=2) as s:
                s.sendall(payload)
                s.settimeout(2)
                try:
                    s.recv(64)
                except OSError:
                    pass
        except OSError:
            pass

    job = b"\0" * 16
    payloads = [
        os.urandom(40),
        os.urandom(4096),
        struct.pack("<4s16sI16s", b"UNH1", job, 1, os.urandom(16)),  # other job
        struct.pack("<4s16sI16s", b"UNH1", job, 2**31, os.urandom(16)),  # absurd rank
        struct.pack("<HBB", 0x554E, 1, 2) + struct.pack("<Q", 2**62) * 6,  # a frame, 2^62 B
        b"",
    ]
    for p in payloads:
        one(p)
        sent["junk" if len(p) != 40 else "forged"] += 1

    def drip() -> None:
        try:
            with socket.create_connection((host, port), timeout=2) as s:
                for b in b"UNH1" + os.urandom(12):
                    if stop.is_set():
                        return
                    s.send(bytes([b]))
                    sent["drip"] += 1
                    time.sleep(0.5)
        except OSError:
            pass

    t = threading.Thread(target=drip, daemon=True)
    t.start()
    socks = []
    for _ in range(200):
        try:
            socks.append(socket.create_connection((host, port), timeout=2))
            sent["flood"] += 1
        except OSError:
            break
    time.sleep(0.5)
    for s in socks:
        s.close()
    return sent


def _job() -> dict[str, int]:
    import unison as un
    from unison.config import ENV_SECRET, ENV_STORE_ADDR
    from unison.store import TCPStore

    rank = int(os.environ["UNISON_RANK"])
    stats: dict[str, int] = {}
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    boot = logging.getLogger("unison.bootstrap")
    boot.addHandler(handler)
    boot.setLevel(logging.DEBUG)
    if rank == 1:
        # Rank 0 publishes its listener first; attack it before joining.
        host, port = os.environ[ENV_STORE_ADDR].rsplit(":", 1)
        store = TCPStore(host, int(port), bytes.fromhex(os.environ[ENV_SECRET]), timeout=30)
        info = json.loads(store.get("unison/1/peer/0", timeout=30))
        stop = threading.Event()
        stats = _attack(info["addr"], info["port"], stop)
        stop.set()
        store.close()
    elif rank == 2:
        time.sleep(1.0)
    un.init()
    x = np.full(1000, un.rank() + 1.0)
    un.all_reduce(x)
    assert (x == 6.0).all()
    time.sleep(6)  # handshake deadlines (5 s) of the slowest stranger have passed
    un.barrier()
    stats["threads"] = threading.active_count()
    stats["fds"] = len(os.listdir("/proc/self/fd"))
    stats["warnings"] = sum(r.levelno >= logging.WARNING for r in records)
    stats["info_lines"] = sum(r.levelno == logging.INFO for r in records)
    stats["refused"] = sum("peer port" in r.getMessage() for r in records)
    return stats


def test_strangers_at_the_peer_port_are_refused_and_the_job_runs() -> None:
    from unison.testing.spawn import run_ranks

    outs = run_ranks(_job, 3, init=False, timeout=100, env={"UNISON_TIMEOUT": "60"})
    for o in outs:
        assert o.ok, o.describe()
    stats = outs[1].value
    assert stats["flood"] >= 32 and stats["junk"] + stats["forged"] == 6, stats
    # the attacked rank ends with the same threads and descriptors as an unattacked one
    attacked, quiet = outs[0].value, outs[2].value
    assert attacked["threads"] <= quiet["threads"] + 2, (attacked, quiet)
    assert attacked["fds"] <= quiet["fds"] + 4, (attacked, quiet)
    # each stranger is counted (DEBUG), not a warning line each in the job's output: one
    # INFO line for the first, one with the total
    assert attacked["refused"] >= 6 and attacked["warnings"] == 0, attacked
    assert attacked["info_lines"] <= 2, attacked


def _late_rank_still_connects() -> None:
    import unison as un

    un.init()
    un.barrier()


def test_bootstrap_still_fine_without_attack() -> None:
    spawn(_late_rank_still_connects, 3)
