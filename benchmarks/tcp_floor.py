"""The pure-Python floor of moving bytes between two processes over loopback TCP.

No unison code: two processes joined by one TCP connection on 127.0.0.1 (``TCP_NODELAY``,
the kernel's default buffer sizes). For each size, the sender writes the message a number
of times back to back with ``sendall`` and the receiver takes each one whole with
``recv_into`` into one preallocated numpy buffer. Two shapes:

* ``stream``: the receiver answers one byte per block of messages, so messages follow one
  another as the calls of a benchmark loop do (a root that does not wait for its
  receiver);
* ``answered``: the receiver answers every message, and the sender waits for the answer
  before the next one (a call that completes on both sides before the next starts).

Prints, per size and shape, the median and minimum over blocks of the time per message
at the receiver, and the rate at the median.

This is what one Python process on each side can push through the kernel's TCP here:
the floor under unison's TCP transport (and under any Python transport) for a broadcast
between two ranks, and for each step of a ring.

    python benchmarks/tcp_floor.py --sizes 8,64K,1M,16M
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import time

import numpy as np

from unison.bench.spec import parse_size  # the sizes as `unison bench --sizes` reads them


def _sender(port: int, size: int, calls: int, blocks: int, answered: bool) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = memoryview(np.ones(size, np.uint8))
    ack = bytearray(1)
    for _ in range(blocks):
        for _ in range(calls):
            sock.sendall(data)
            if answered:
                sock.recv_into(ack, 1)
        if not answered:
            sock.recv_into(ack, 1)
    sock.close()


def _receive(conn: socket.socket, view: memoryview) -> None:
    got, n = 0, len(view)
    while got < n:
        k = conn.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("sender closed early")
        got += k


def measure(size: int, calls: int, blocks: int, answered: bool) -> tuple[float, float]:
    """(median, minimum) over ``blocks`` of the seconds per message, at the receiver."""
    lst = socket.create_server(("127.0.0.1", 0))
    port = lst.getsockname()[1]
    proc = mp.Process(target=_sender, args=(port, size, calls, blocks, answered))
    proc.start()
    conn, _ = lst.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    view = memoryview(np.empty(size, np.uint8))
    per_block = []
    try:
        for _ in range(blocks):
            t0 = time.perf_counter()
            for _ in range(calls):
                _receive(conn, view)
                if answered:
                    conn.sendall(b"k")
            if not answered:
                conn.sendall(b"k")
            per_block.append((time.perf_counter() - t0) / calls)
    finally:
        conn.close()
        lst.close()
        proc.join(60)
    return statistics.median(per_block), min(per_block)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,64K,1M,16M")
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument(
        "--bytes-per-block", type=int, default=64 << 20, help="bytes per block (20-2000 messages)"
    )
    a = ap.parse_args()
    # every line is flushed before the next process is forked, so no child prints it again
    print(
        f"loopback TCP, 2 processes, cpus={os.cpu_count()} load={os.getloadavg()[0]:.2f}",
        flush=True,
    )
    for text in a.sizes.split(","):
        size = parse_size(text)
        calls = min(2000, max(20, a.bytes_per_block // max(size, 1)))
        for shape in ("stream", "answered"):
            med, lo = measure(size, calls, a.blocks, shape == "answered")
            print(
                f"{text:>6s} {shape:8s}: median {med * 1e6:10.1f} µs, min {lo * 1e6:10.1f} µs "
                f"per message ({size / med / 1e9:.2f} GB/s at the median)",
                flush=True,
            )


if __name__ == "__main__":
    main()
