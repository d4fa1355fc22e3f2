"""PyTorch's own distributed test suite, on backend "unison" beside Gloo.

torch ships the suite behind its ``test/distributed/test_distributed_spawn.py``:
``torch.testing._internal.distributed.distributed_test.DistributedTest._DistTestBase``.
This module runs it on CPU, one world size and one backend per process::

    python -m unison.testing.torch_suite run --backend unison --world-size 2

and compares the two backends (the pass sets of one run, per world size)::

    python -m unison.testing.torch_suite compare --world-sizes 2 3

``compare`` fails when a test that passes on Gloo does not pass on unison, except the
tests named in :data:`EXPECTED` (each with its reason).

How the suite is held to unison. The suite chooses its tests by the environment
variable ``BACKEND`` when it is imported; it is imported with ``BACKEND=gloo`` for
both backends, so both run the same selection, Gloo's. For the unison run, every
process group the suite asks for on "gloo" (``init_process_group``, ``new_group``,
explicitly or by default) is made on "unison", every group created is checked to
be unison's (a test that ends up with another backend's group fails), and the
suite's profiler checks, which it holds only backends on its allow-lists to, are
held to unison as well (events named ``unison:<op>``). torch's files are not edited.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["EXPECTED", "SuiteResult", "compare", "main", "run_status", "run_suite"]

#: tests that may pass on Gloo and fail on unison, and why that is not a defect
EXPECTED: dict[str, str] = {
    "test_get_backend": (
        "asserts that the default group's backend is named 'gloo' (it is 'unison')"
    ),
}

_BACKEND_VAR = "UNISON_TORCH_SUITE_BACKEND"  # the backend the groups are really made on


def _held_backend(backend: Any) -> Any:
    """The backend a group the suite asks for is made on in a unison run."""
    if backend is None:
        return "unison"
    name = str(backend).lower()
    if name == "gloo":
        return "unison"
    return backend


def _check_unison(pg: Any, what: str) -> Any:
    import torch.distributed as dist

    if pg is None or pg is dist.GroupMember.NON_GROUP_MEMBER:
        return pg
    name = dist.get_backend(pg)
    if name != "unison":
        raise AssertionError(f"torch_suite: {what} made a group on backend {name!r}, not unison")
    return pg


def _hold_to_unison() -> None:
    """Make the suite's groups on "unison" and hold its profiler checks to unison."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.testing._internal.distributed import distributed_test as suite

    import unison.torch.distributed  # noqa: F401  (registers the backend)

    init, new = c10d.init_process_group, c10d.new_group

    @functools.wraps(init)
    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> None:
        init(_held_backend(backend), *args, **kwargs)
        _check_unison(dist.group.WORLD, "init_process_group")

    @functools.wraps(new)
    def new_group(
        ranks: Any = None, timeout: Any = None, backend: Any = None, *args: Any, **kwargs: Any
    ) -> Any:
        pg = new(ranks, timeout, _held_backend(backend), *args, **kwargs)
        return _check_unison(pg, "new_group")

    for mod in (dist, c10d):
        mod.init_process_group = init_process_group  # type: ignore[attr-defined]
        mod.new_group = new_group  # type: ignore[attr-defined]
    for allow in (
        suite.PROFILING_SUPPORTED_BACKENDS,
        suite.CUDA_PROFILING_SUPPORTED_BACKENDS,
        suite.SEND_RECV_PROFILING_SUPPORTED_BACKENDS,
    ):
        if "unison" not in allow:
            allow.append("unison")


def _decorators(fn: Any) -> list[str]:
    """The names of the decorators around a suite test (outermost first)."""
    names = []
    while fn is not None:
        code = getattr(fn, "__code__", None)
        if code is not None:
            names.append(code.co_qualname.split(".", 1)[0])
        fn = getattr(fn, "__wrapped__", None)
    return names[:-1]


def _skipped_in_ranks(fn: Any) -> str:
    """Why the ranks of this test would skip it at once, where that is certain here.

    Some of the suite's skips are decided inside the ranks, after they started and
    joined a group (the test exits with a skip code): tests that need a GPU and tests
    that need more than two ranks. On a machine without an accelerator, and at world
    size 2, they are skipped before the ranks start (the outcome is the same)."""
    import torch

    names = _decorators(fn)
    accelerator = torch.cuda.is_available() or any(
        getattr(torch, dev, None) is not None and getattr(torch, dev).is_available()
        for dev in ("xpu", "hpu")
    )
    if not accelerator and {"skip_if_no_gpu", "skip_if_lt_x_gpu"} & set(names):
        return "needs a GPU (skipped before the ranks start)"
    if "skip_if_small_worldsize" in names and int(os.environ["WORLD_SIZE"]) <= 2:
        return "needs a world size above 2 (skipped before the ranks start)"
    return ""


def _suite_class(start: str) -> type:
    from torch.testing._internal.distributed.distributed_test import (
        DistributedTest,
        TestDistBackend,
    )

    class TorchSuite(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self) -> None:
            why = _skipped_in_ranks(getattr(self, self._testMethodName))
            if why:
                self.skipTest(why)
            super().setUp()  # type: ignore[no-untyped-call]
            if start == "spawn":
                self._spawn_processes()
            else:  # torch's helper for fork start went with its fork test file
                import torch.multiprocessing as mp

                self._start_processes(mp.get_context("fork").Process)

    TorchSuite.__qualname__ = TorchSuite.__name__ = "TorchSuite"
    return TorchSuite


def _configure(backend: str, world_size: int) -> None:
    """The environment the suite reads at import (it must precede the import)."""
    os.environ["BACKEND"] = "gloo"
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ[_BACKEND_VAR] = backend
    os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="unison-torch-suite-"))
    # the suite's processes die on a timed-out test instead of hanging the run
    os.environ.setdefault("UNISON_TIMEOUT", "60")


# spawned ranks import this module afresh: they hold the suite to unison as well
if os.environ.get(_BACKEND_VAR) == "unison" and os.environ.get("BACKEND") == "gloo":
    _hold_to_unison()
if os.environ.get(_BACKEND_VAR) and os.environ.get("BACKEND") == "gloo":
    TorchSuite = _suite_class(os.environ.get("UNISON_TORCH_SUITE_START", "fork"))


class SuiteResult(unittest.TextTestResult):
    """unittest's result, plus the outcome of each test by its short name."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outcomes: dict[str, str] = {}
        self.times: dict[str, float] = {}
        self._t0 = 0.0

    def startTest(self, test: unittest.TestCase) -> None:
        self._t0 = time.monotonic()
        super().startTest(test)

    def _set(self, test: unittest.TestCase, outcome: str) -> None:
        name = test.id().rsplit(".", 1)[-1]
        self.outcomes[name] = outcome
        self.times[name] = round(time.monotonic() - self._t0, 3)

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self._set(test, "pass")

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addFailure(test, err)
        self._set(test, "fail")

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        super().addError(test, err)
        self._set(test, "fail")

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        super().addSkip(test, reason)
        self._set(test, "skip")

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addExpectedFailure(test, err)
        self._set(test, "pass")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        super().addUnexpectedSuccess(test)
        self._set(test, "fail")


def run_suite(
    backend: str,
    world_size: int,
    patterns: Sequence[str] = (),
    start: str = "fork",
    verbosity: int = 1,
) -> dict[str, Any]:
    """Run the suite in this process (the parent of the ranks); the outcome per test."""
    os.environ["UNISON_TORCH_SUITE_START"] = start
    _configure(backend, world_size)
    if backend == "unison":
        _hold_to_unison()
    cls = _suite_class(start)
    globals()["TorchSuite"] = cls  # spawned ranks find the class here by name
    cls.__module__ = __name__
    loader = unittest.TestLoader()
    if patterns:
        loader.testNamePatterns = [p if "*" in p else f"*{p}*" for p in patterns]
    tests = loader.loadTestsFromTestCase(cls)
    t0 = time.monotonic()
    runner = unittest.TextTestRunner(
        stream=sys.stderr, verbosity=verbosity, resultclass=SuiteResult
    )
    result = runner.run(tests)
    assert isinstance(result, SuiteResult)
    return {
        "backend": backend,
        "world_size": world_size,
        "start": start,
        "wall_s": round(time.monotonic() - t0, 1),
        "outcomes": result.outcomes,
        "times": result.times,
    }


def _run_child(
    backend: str, world_size: int, patterns: Sequence[str], start: str, out: str, timeout: float
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "unison.testing.torch_suite",
        "run",
        "--backend",
        backend,
        "--world-size",
        str(world_size),
        "--start",
        start,
        "--json",
        out,
    ]
    for p in patterns:
        cmd += ["-k", p]
    env = {k: v for k, v in os.environ.items() if k not in ("BACKEND", "TEMP_DIR", _BACKEND_VAR)}
    print(f"torch_suite: {backend} at world size {world_size} ...", flush=True)
    proc = subprocess.run(
        cmd, env=env, timeout=timeout, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    if not os.path.exists(out):
        sys.stderr.write(proc.stderr[-20000:])
        raise RuntimeError(
            f"torch_suite: the {backend} run at world size {world_size} "
            f"ended with status {proc.returncode} and no results"
        )
    with open(out) as f:
        res: dict[str, Any] = json.load(f)
    res["log_tail"] = proc.stderr[-4000:]
    res["log"] = proc.stderr
    return res


def compare(gloo: dict[str, str], unison: dict[str, str]) -> tuple[list[str], list[str]]:
    """(tests passing on Gloo but not on unison, less EXPECTED; the EXPECTED ones seen)."""
    missing = sorted(t for t, o in gloo.items() if o == "pass" and unison.get(t) != "pass")
    return [t for t in missing if t not in EXPECTED], [t for t in missing if t in EXPECTED]


def run_status(outcomes: dict[str, str]) -> int:
    """The exit status of ``run``: 1 when a selected test failed or none passed (a
    selection that ran nothing proves nothing), else 0."""
    values = list(outcomes.values())
    return 1 if "fail" in values or "pass" not in values else 0


def _failure_text(log: str, test: str) -> str:
    """The exception lines of ``test``'s failure report in a run's log."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(("ERROR: ", "FAIL: ")) and line.split()[1] == test:
            block: list[str] = []
            for later in lines[i + 1 :]:
                if later.startswith("=" * 20):
                    break
                block.append(later)
            errors = [b.strip() for b in block if _EXC.match(b.strip())]
            return "\n    ".join(errors[-3:]) or "(no exception line)"
    return "(no failure report found)"


_EXC = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Failure)\w*: ")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m unison.testing.torch_suite")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one backend at one world size, in this process")
    r.add_argument("--backend", choices=("gloo", "unison"), required=True)
    r.add_argument("--world-size", type=int, required=True)
    r.add_argument("--start", choices=("fork", "spawn"), default="fork")
    r.add_argument("-k", dest="patterns", action="append", default=[])
    r.add_argument("--json", help="write the outcomes here")
    r.add_argument("-v", dest="verbosity", action="count", default=1)
    c = sub.add_parser("compare", help="gloo and unison at each world size; fail on a gap")
    c.add_argument("--world-sizes", type=int, nargs="+", default=[2, 3])
    c.add_argument("--start", choices=("fork", "spawn"), default="fork")
    c.add_argument("-k", dest="patterns", action="append", default=[])
    c.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    c.add_argument("--keep", help="a folder for each run's outcomes and log")
    c.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        res = run_suite(args.backend, args.world_size, args.patterns, args.start, args.verbosity)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
        counts = {
            o: sum(1 for v in res["outcomes"].values() if v == o) for o in ("pass", "fail", "skip")
        }
        print(f"torch_suite: {args.backend} np={args.world_size}: {counts} in {res['wall_s']} s")
        return run_status(res["outcomes"])
    keep = args.keep or tempfile.mkdtemp(prefix="unison-torch-suite-")
    os.makedirs(keep, exist_ok=True)
    bad = False

    def one(backend: str, ws: int) -> dict[str, Any]:
        out = os.path.join(keep, f"{backend}-np{ws}.json")
        res = _run_child(backend, ws, args.patterns, args.start, out, args.timeout)
        with open(os.path.join(keep, f"{backend}-np{ws}.log"), "w") as f:
            f.write(res["log"])
        return res

    # the runs are independent processes (each its own ports and stores): --jobs of them
    # at a time, the results reported in order
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        started = {
            (b, ws): pool.submit(one, b, ws) for ws in args.world_sizes for b in ("gloo", "unison")
        }
    for ws in args.world_sizes:
        runs = {b: started[(b, ws)].result() for b in ("gloo", "unison")}
        g, u = runs["gloo"]["outcomes"], runs["unison"]["outcomes"]
        gaps, expected = compare(g, u)
        gp = sum(1 for o in g.values() if o == "pass")
        up = sum(1 for t, o in g.items() if o == "pass" and u.get(t) == "pass")
        print(
            f"torch_suite np={ws}: unison passes {up} of the {gp} tests passing on Gloo "
            f"(gloo {runs['gloo']['wall_s']} s, unison {runs['unison']['wall_s']} s); "
            f"expected differences: {expected or 'none'}",
            flush=True,
        )
        if gp == 0:  # nothing ran: a comparison of nothing proves nothing
            bad = True
            print(
                f"torch_suite np={ws}: no test passed on Gloo, so the suite did not run here "
                f"(see {keep}/gloo-np{ws}.log)",
                flush=True,
            )
        for t in gaps:
            bad = True
            print(
                f"torch_suite np={ws}: {t} passes on Gloo, not on unison:\n"
                f"{_failure_text(runs['unison']['log'], t)}",
                flush=True,
            )
    print(f"torch_suite: outcomes and logs in {keep}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
