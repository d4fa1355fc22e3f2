"""unison against Gloo and Open MPI on two hosts joined by veth links, beside the link's capacity.

Needs root and iproute2 (and ``unshare``): for each link setting (``--links``: unshaped,
or a tbf rate such as 10gbit, 1gbit on each host's NIC) it builds two network
namespaces on one switch (``tests/hosts/bridged.py``), then

1. measures the link's capacity the iperf way: TCP streams from host 0 to host 1 for
   ``--probe-seconds``, one stream and two, counted by the receiver (bytes received over
   the time from the first byte to the last); the capacity is the larger figure;
2. runs ``unison bench -np 2 -H h0:1,h1:1`` (one rank per host) with ``--transport tcp``
   and ``--compare gloo,mpi``: unison, Gloo and Open MPI measured across the same hosts in
   one run, Open MPI held to TCP (pml ob1, btl tcp,self) and its daemons started inside
   the namespaces (``--mpi-mca plm_ssh_agent``);
3. runs the all-reduce at np=4 (``-H h0:2,h1:2``) twice, unison's hierarchical algorithm
   (with Gloo and Open MPI in the same run) and unison's flat ring. Here each library
   uses what it has within a host: unison shared memory, Open MPI its sm layer (pml ob1,
   btl sm,tcp,self), Gloo TCP (it has nothing else).

It prints one Markdown table per link. "of link" is the fraction of the measured capacity
that the bytes which must cross the link in each direction per second reach: at np=2 (one
rank per host) that is nccl-tests' busbw (all-reduce and broadcast: size / time;
all-gather and reduce-scatter: size / 2 / time); at np=4 over two hosts, an all-reduce
must move at least its size across the link each way, so it is algbw (size / time). The
probe is one Python process on each side; on an unshaped veth it is bound by the CPU,
not the link, so there the capacity is what one process can push through the kernel's TCP.
tbf lets a burst (256 KB) pass at the unshaped speed, so sizes below it can show more than
1.0 of a shaped link. The bench JSON files and the launchers' output go to ``--out``::

    sudo .venv/bin/python benchmarks/two_hosts.py --links unshaped,10gbit,1gbit --out runs/2h

A measurement: run it on a quiet machine (``unison bench`` warns when it is not).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OPS = "all_reduce,broadcast,all_gather,reduce_scatter"
PEER_NAMES = {"unison": "unison", "gloo": "Gloo", "mpi": "OpenMPI"}
CHUNK = 1 << 20


# -- the iperf-style probe: one side in each namespace ------------------------------------
def probe_receive(port: int, streams: int, ready: str) -> None:
    """Accept ``streams`` connections, count what arrives until each closes, print JSON."""
    lst = socket.create_server(("0.0.0.0", port), backlog=streams)
    Path(ready).touch()
    conns = [lst.accept()[0] for _ in range(streams)]
    got = [0] * streams
    first: list[float] = []
    last = [0.0] * streams

    def drain(i: int, c: socket.socket) -> None:
        buf = bytearray(4 * CHUNK)
        while True:
            n = c.recv_into(buf)
            if not n:
                return
            if got[i] == 0:
                first.append(time.perf_counter())
            got[i] += n
            last[i] = time.perf_counter()

    threads = [threading.Thread(target=drain, args=(i, c)) for i, c in enumerate(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    span = max(last) - min(first)
    print(json.dumps({"streams": streams, "bytes": sum(got), "seconds": span}), flush=True)


def probe_send(addr: str, port: int, streams: int, seconds: float) -> None:
    """``streams`` TCP connections to ``addr``, each sending as fast as it can."""
    payload = memoryview(bytearray(CHUNK))
    deadline = time.perf_counter() + seconds

    def pump() -> None:
        with socket.create_connection((addr, port)) as s:
            while time.perf_counter() < deadline:
                s.sendall(payload)

    threads = [threading.Thread(target=pump) for _ in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def capacity(hosts: Any, seconds: float, workdir: Path) -> dict[str, Any]:
    """Bytes/s from host 0 to host 1 with one stream and with two; ``best`` the larger."""
    out: dict[str, Any] = {}
    me = [sys.executable, __file__]
    for streams in (1, 2):
        port = 5201 + streams
        ready = workdir / f"probe-ready-{streams}"
        ready.unlink(missing_ok=True)
        recv = subprocess.Popen(
            ["ip", "netns", "exec", hosts.names[1], *me, "--probe-receive", str(port),
             str(streams), str(ready)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            for _ in range(200):
                if ready.exists():
                    break
                time.sleep(0.05)
            subprocess.run(
                ["ip", "netns", "exec", hosts.names[0], *me, "--probe-send", hosts.host_addr(1),
                 str(port), str(streams), str(seconds)],
                check=True, timeout=seconds + 60,
            )  # fmt: skip
            text, _ = recv.communicate(timeout=60)
        finally:
            if recv.poll() is None:
                recv.kill()
                recv.wait()
            ready.unlink(missing_ok=True)
        row = json.loads(text.strip().splitlines()[-1])
        row["bytes_per_s"] = row["bytes"] / row["seconds"]
        out[f"streams{streams}"] = row
    out["best"] = max(out["streams1"]["bytes_per_s"], out["streams2"]["bytes_per_s"])
    return out


# -- the bench runs ------------------------------------------------------------------------
def bench(hosts: Any, agent: str, args: argparse.Namespace, tag: str, *extra: str) -> Path:
    """One ``unison bench`` over the two hosts; the JSON it wrote (its output: ``tag``.log)."""
    from tests.hosts.bridged import IFACE

    out = args.out / f"{tag}.json"
    cmd = [
        sys.executable, "-m", "unison.launch.cli", "bench",
        "--rsh", "ip netns exec {host}", "--store-addr", hosts.launcher_addr,
        "--network-interface", IFACE, "--sizes", args.sizes, "-n", str(args.iters),
        "-w", str(args.warmup), "--timeout", str(args.timeout), "--json", str(out),
        "--mpi-mca", f"plm_ssh_agent={agent}",
        "--mpi-mca", f"btl_tcp_if_include={hosts.subnet}",
        "--mpi-mca", f"oob_tcp_if_include={hosts.subnet}",
        *extra,
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    print(f"# {tag}: {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
    with open(args.out / f"{tag}.log", "w") as log:
        r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    if r.returncode != 0 or not out.exists():
        raise SystemExit(f"{tag}: unison bench exited with {r.returncode}; see {tag}.log")
    return out


def rows_of(path: Path) -> tuple[dict[tuple[str, str, int], dict[str, Any]], dict[str, Any]]:
    data = json.loads(path.read_text())
    rows = {(r["impl"], r["op"], r["size"]): r for r in data["rows"] if "time_us" in r}
    return rows, data["meta"]


def _us(row: dict[str, Any] | None) -> str:
    return f"{row['time_us']:.1f}" if row else "-"


def _x(peer: dict[str, Any] | None, ours: dict[str, Any] | None) -> str:
    return f"{peer['time_us'] / ours['time_us']:.2f}" if peer and ours else "-"


def _of(row: dict[str, Any] | None, key: str, link: float) -> str:
    return f"{row[key] * 1e9 / link:.2f}" if row else "-"


def _size(n: int) -> str:
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def table_np2(path: Path, link: float, peers: list[str]) -> str:
    rows, meta = rows_of(path)
    head = ["op", "size", "unison µs"] + [f"{PEER_NAMES[p]} µs" for p in peers]
    head += [f"× {PEER_NAMES[p]}" for p in peers]
    head += [f"{PEER_NAMES[i]} of link" for i in ("unison", *peers)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = sorted({(op, size) for (_, op, size) in rows}, key=lambda k: (OPS.index(k[0]), k[1]))
    for op, size in keys:
        ours = rows.get(("unison", op, size))
        theirs = [rows.get((p, op, size)) for p in peers]
        cells = [op, _size(size), _us(ours), *map(_us, theirs)]
        cells += [_x(t, ours) for t in theirs]
        cells += [_of(r, "busbw", link) for r in (ours, *theirs)]
        lines.append("| " + " | ".join(cells) + " |")
    skipped = "; ".join(f"{k} skipped: {v}" for k, v in meta.get("skipped", {}).items())
    return "\n".join(lines) + (f"\n\n{skipped}" if skipped else "")


def table_np4(hier: Path, ring: Path, link: float, peers: list[str]) -> str:
    h, meta = rows_of(hier)
    f, _ = rows_of(ring)
    head = ["size", "hierarchical µs", "ring µs"] + [f"{PEER_NAMES[p]} µs" for p in peers]
    head += ["× ring"] + [f"× {PEER_NAMES[p]}" for p in peers]
    head += ["hierarchical of link", "ring of link"] + [f"{PEER_NAMES[p]} of link" for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for size in sorted({s for (_, op, s) in h if op == "all_reduce"}):
        ours, flat = h.get(("unison", "all_reduce", size)), f.get(("unison", "all_reduce", size))
        theirs = [h.get((p, "all_reduce", size)) for p in peers]
        cells = [_size(size), _us(ours), _us(flat), *map(_us, theirs), _x(flat, ours)]
        cells += [_x(t, ours) for t in theirs]
        cells += [_of(r, "algbw", link) for r in (ours, flat, *theirs)]
        lines.append("| " + " | ".join(cells) + " |")
    skipped = "; ".join(f"{k} skipped: {v}" for k, v in meta.get("skipped", {}).items())
    return "\n".join(lines) + (f"\n\n{skipped}" if skipped else "")


def one_link(link: str, args: argparse.Namespace) -> dict[str, Any]:
    from tests.hosts.bridged import BridgedHosts

    hosts = BridgedHosts(2)
    try:
        if link != "unshaped":
            hosts.shape(link)
        agent = hosts.mpi_agent(str(args.out / "mpi-agent.sh"))
        cap = capacity(hosts, args.probe_seconds, args.out)
        print(
            f"# {link}: link capacity h0->h1 {cap['best'] * 8 / 1e9:.2f} Gbit/s "
            f"(1 stream {cap['streams1']['bytes_per_s'] * 8 / 1e9:.2f}, 2 streams "
            f"{cap['streams2']['bytes_per_s'] * 8 / 1e9:.2f})",
            file=sys.stderr,
            flush=True,
        )
        peers = args.peers
        compare = ["--compare", ",".join(peers)] if peers else []
        spec2 = ",".join(f"{n}:1" for n in hosts.names)
        np2 = bench(hosts, agent, args, f"{link}-np2", "-np", "2", "-H", spec2,
                    "--ops", OPS, "--transport", "tcp", *compare)  # fmt: skip
        result: dict[str, Any] = {"link": link, "capacity": cap, "np2": str(np2)}
        if not args.no_np4:
            spec4 = ",".join(f"{n}:2" for n in hosts.names)
            sm = ["--mpi-mca", "pml=ob1", "--mpi-mca", "btl=sm,tcp,self"]
            hier = bench(hosts, agent, args, f"{link}-np4-hierarchical", "-np", "4", "-H",
                         spec4, "--ops", "all_reduce", "--algo", "all_reduce:hierarchical",
                         *compare, *sm)  # fmt: skip
            ring = bench(hosts, agent, args, f"{link}-np4-ring", "-np", "4", "-H", spec4,
                         "--ops", "all_reduce", "--algo", "all_reduce:ring")  # fmt: skip
            result.update(np4_hierarchical=str(hier), np4_ring=str(ring))
        return result
    finally:
        hosts.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--links", default="unshaped,10gbit,1gbit", help="unshaped or tbf rates")
    ap.add_argument("--sizes", default="8,64K,1M,16M")
    ap.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size")
    ap.add_argument("-w", "--warmup", type=int, default=3)
    ap.add_argument("--peers", default="gloo,mpi", help="peers measured beside unison")
    ap.add_argument("--probe-seconds", type=float, default=3.0)
    ap.add_argument("--no-np4", action="store_true", help="leave out the np=4 all-reduce")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per implementation")
    ap.add_argument("--out", type=Path, default=Path(f"two_hosts-{time.strftime('%Y%m%d-%H%M%S')}"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("two_hosts.py: needs root (network namespaces, tc)", file=sys.stderr)
        return 2
    args.peers = [p for p in args.peers.split(",") if p]
    args.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    results = [one_link(link, args) for link in args.links.split(",") if link]
    (args.out / "summary.json").write_text(json.dumps(results, indent=1))
    for res in results:
        cap = res["capacity"]["best"]
        print(f"\n### {res['link']}: link {cap * 8 / 1e9:.2f} Gbit/s measured (h0 to h1)\n")
        print("np=2, one rank per host, TCP everywhere; of link: busbw / capacity\n")
        print(table_np2(Path(res["np2"]), cap, args.peers))
        if "np4_hierarchical" in res:
            print("\nnp=4 all_reduce, two ranks per host; of link: algbw / capacity\n")
            print(table_np4(Path(res["np4_hierarchical"]), Path(res["np4_ring"]), cap, args.peers))
    print(f"\n# files: {args.out}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--probe-receive":
        probe_receive(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "--probe-send":
        probe_send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
        sys.exit(0)
    sys.exit(main())
