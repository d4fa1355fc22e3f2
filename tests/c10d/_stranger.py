"""A process of another user attacking a c10d job through torch's store (test_trust).

Run as ``python -m tests.c10d._stranger PORT SECRET_DIR`` (as root: it becomes the
user ``nobody`` before it touches the job; the interpreter of this venv lives where
``nobody`` cannot read, hence no ``setpriv``) while
rank 0 of a 2-rank job waits for rank 1. It does what any local user can: lists the
store's keys, takes whatever secret it can find, tries the peer handshake as rank 1,
then replaces rank 0's address with its own listener and waits for rank 1 to connect
to it, answering as rank 0. One JSON line on stdout says how each step went; the
line ``REPLACED`` tells the test to start rank 1.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401  (loaded now: nobody cannot read the stdlib later)
import json
import os
import pwd
import re
import secrets
import socket
import sys
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from unison.transport.handshake import accept_handshake, connect_handshake, job_digest

_PEER0 = re.compile(r"unison/\d+/peer/0$")


def become_nobody() -> None:
    """Drop to the user ``nobody`` (after every import: nothing is loaded later)."""
    who = pwd.getpwnam("nobody")
    os.setgroups([])
    os.setgid(who.pw_gid)
    os.setuid(who.pw_uid)


def main(port: int, secret_dir: str) -> None:
    if os.geteuid() == 0:
        become_nobody()
    report: dict[str, Any] = {"uid": os.geteuid()}
    # wait_for_workers (the default) counts this client as one of the job's ranks, which
    # lets rank 0 go on before the real rank 1 has connected: no permission needed
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
    deadline = time.monotonic() + 120
    peer_key = None
    while peer_key is None and time.monotonic() < deadline:
        peer_key = next((k for k in store.list_keys() if _PEER0.search(k)), None)
        time.sleep(0.05)
    if peer_key is None:
        raise SystemExit("rank 0 never published its address")
    keys = store.list_keys()
    report["keys"] = sorted(keys)
    secret: bytes | None = None
    jobs = ["c10d"]
    for k in keys:
        if k.endswith("unison/c10d/secret"):  # where the secret used to be
            secret = bytes(store.get(k))
        if k.endswith("unison/c10d/secret-file"):
            name = json.loads(bytes(store.get(k)))["name"]
            jobs.insert(0, "c10d-" + name.rsplit("-", 1)[1])
            try:
                with open(os.path.join(secret_dir, name), "rb") as f:
                    secret = f.read()
            except OSError as exc:
                report["file_error"] = type(exc).__name__
    report["secret_read"] = secret is not None
    key = secret if secret is not None else secrets.token_bytes(32)
    peer = json.loads(bytes(store.get(peer_key)))
    outcome = []
    for job in jobs:
        try:
            with socket.create_connection((peer["addr"], peer["port"]), timeout=10) as sock:
                connect_handshake(sock, key, job_digest(job), 1, 0, time.monotonic() + 5)
            outcome.append(f"{job}: accepted")
            break
        except Exception as exc:
            outcome.append(f"{job}: {type(exc).__name__}: {exc}")
    report["as_rank1"] = outcome
    # the store is writable: put our own listener where rank 1 will look for rank 0
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(120)
    store.set(peer_key, json.dumps({**peer, "port": listener.getsockname()[1]}).encode())
    print("REPLACED", flush=True)
    try:
        sock, _ = listener.accept()
        with sock:
            rank = accept_handshake(sock, key, job_digest(jobs[0]), 0, 2, time.monotonic() + 10)
        report["as_rank0"] = f"accepted rank {rank}"
    except Exception as exc:
        report["as_rank0"] = f"{type(exc).__name__}: {exc}"
    print("STRANGER " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
