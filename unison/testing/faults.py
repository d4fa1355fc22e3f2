"""Fault injection for tests of every layer: kill, stop, crash or corrupt at op k.

Set ``UNISON_FAULTS`` in a rank's environment (or pass it through
``unison.testing.spawn(env=...)`` / ``unison run``)::

    UNISON_FAULTS="kill@rank=1,op=5"              SIGKILL rank 1 as it starts its 5th collective
    UNISON_FAULTS="stop@rank=2,op=3,seconds=6"    SIGSTOP rank 2 for 6 s at its 3rd collective
    UNISON_FAULTS="exit@rank=0,op=2,code=3"       os._exit(3), no goodbye
    UNISON_FAULTS="raise@rank=1,op=4"             an uncaught RuntimeError in the caller
    UNISON_FAULTS="corrupt@rank=1,op=2"           garble the header of the next frame sent

Several faults are separated by ``;``. Operations are counted per process over all
groups, from 1. ``install`` is called by :func:`unison.init` when the knob is set;
without it nothing here is imported.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError

__all__ = ["Fault", "install", "parse", "stop_process"]

_KINDS = ("kill", "stop", "exit", "raise", "corrupt")


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    op: int
    seconds: float = 5.0
    code: int = 1


def parse(spec: str) -> list[Fault]:
    out = []
    for item in filter(None, (s.strip() for s in spec.split(";"))):
        kind, _, args = item.partition("@")
        if kind not in _KINDS:
            raise InvalidArgumentError(f"UNISON_FAULTS: unknown fault {kind!r} in {item!r}")
        fields: dict[str, str] = {}
        for part in filter(None, args.split(",")):
            k, sep, v = part.partition("=")
            if not sep:
                raise InvalidArgumentError(f"UNISON_FAULTS: {part!r} is not key=value")
            fields[k.strip()] = v.strip()
        try:
            out.append(
                Fault(
                    kind,
                    int(fields["rank"]),
                    int(fields.get("op", "1")),
                    float(fields.get("seconds", "5")),
                    int(fields.get("code", "1")),
                )
            )
        except (KeyError, ValueError) as exc:
            raise InvalidArgumentError(f"UNISON_FAULTS: bad {item!r}: {exc}") from None
    return out


def stop_process(pid: int, seconds: float) -> None:
    """SIGSTOP ``pid`` now and have a detached helper SIGCONT it after ``seconds``."""
    subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os,time,signal; time.sleep({seconds}); os.kill({pid}, signal.SIGCONT)",
        ],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    os.kill(pid, signal.SIGSTOP)


class _Injector:
    def __init__(self, rt: Any, faults: list[Fault]) -> None:
        self.rt = rt
        self.faults = [f for f in faults if f.rank == rt.rank]
        self.count = 0
        self.corrupt_next = False

    def on_op(self, comm: Any, seq: int, op: Any) -> None:
        self.count += 1
        for f in self.faults:
            if f.op != self.count:
                continue
            if f.kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif f.kind == "stop":
                stop_process(os.getpid(), f.seconds)
            elif f.kind == "exit":
                os._exit(f.code)
            elif f.kind == "raise":
                raise RuntimeError(f"injected fault at operation {self.count} on rank {f.rank}")
            elif f.kind == "corrupt":
                self.corrupt_next = True

    def on_send(self, peer: int, header: bytes) -> bytes:
        if not self.corrupt_next:
            return header
        self.corrupt_next = False
        return b"\xde\xad" + header[2:]


def install(rt: Any, spec: str) -> None:
    """Attach the faults of ``spec`` that concern this rank to runtime ``rt``."""
    inj = _Injector(rt, parse(spec))
    if inj.faults:
        rt.op_hook = inj.on_op
        for transport in rt.fabric.transports:
            if hasattr(transport, "send_hook"):
                transport.send_hook = inj.on_send
