"""``unison.run(fn, args, np=...)``: run a Python function as the ranks of a job and get
each rank's return value, as ``horovod.run`` does.

The caller pickles ``fn``, its arguments and what the ranks need to find ``fn`` again
(its ``sys.path``, working directory and main script, as :mod:`multiprocessing`'s spawn
start method does), serves them from a store of its own, and starts the job with
``unison run``'s machinery: each rank runs ``python -m unison.launch.call``, which
fetches the function, calls it and leaves its result (or its exception) in that store.
The caller returns the results in rank order, or raises the exception of the rank that
failed first, noting the rank and its traceback.
"""

from __future__ import annotations

import multiprocessing.spawn
import os
import pickle
import secrets
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, BinaryIO, cast

from .. import config as C
from ..errors import InvalidArgumentError, LaunchError, UnsupportedError
from ..store import TCPStore, TCPStoreServer

__all__ = ["FUNCTION_KEY", "RESULT_KEY", "run"]

FUNCTION_KEY = "unison.run/function"
RESULT_KEY = "unison.run/result/{rank}"
_MPI_INSTEAD = (
    "unison.run starts the native and torch engines' ranks; for unison's MPI engine start "
    "the script with mpirun -np N -x UNISON_BACKEND=mpi python SCRIPT"
)


def _pickler() -> Any:
    """cloudpickle where installed (lambdas and closures travel too), else pickle."""
    try:
        import cloudpickle  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError:
        return pickle
    return cloudpickle


class _TextSink:
    """Bytes in, text out: the ranks' output into a text stream that has no binary buffer
    underneath (a notebook's ``sys.stdout``)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, data: bytes) -> int:
        self.stream.write(data.decode(errors="replace"))
        return len(data)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False


def _binary(stream: Any) -> BinaryIO:
    buffer = getattr(stream, "buffer", None)
    return cast(BinaryIO, buffer if buffer is not None else _TextSink(stream))


def run(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    num_proc: int | None = None,
    min_num_proc: int | None = None,
    max_num_proc: int | None = None,
    slots: int | None = None,
    reset_limit: int | None = None,
    cooldown_range: tuple[float, float] | None = None,
    hosts: str | None = None,
    hostfile: str | None = None,
    start_timeout: float | None = None,
    ssh_port: int | None = None,
    ssh_identity_file: str | None = None,
    disable_cache: bool | None = None,
    output_filename: str | None = None,
    verbose: bool | int | None = None,
    use_gloo: bool | None = None,
    use_mpi: bool | None = None,
    mpi_args: str | None = None,
    network_interface: str | None = None,
    executable: str | None = None,
    np: int | None = None,
    min_np: int | None = None,
    max_np: int | None = None,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    job_timeout: float | None = None,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``np`` (or ``num_proc``) ranks and return the list
    of their return values, index = rank (``horovod.run``'s contract).

    ``fn`` must be picklable (a function defined at module level; with cloudpickle
    installed, also a lambda or closure). Each rank calls ``unison.init()`` itself, as
    under ``unison run``. ``hosts`` (``"host1:2,host2:4"``) or ``hostfile`` spread the
    ranks as ``unison run -H`` does; ``executable`` is the interpreter of the ranks
    (default: this one). ``env`` (default ``os.environ``) is the ranks' environment;
    ``timeout`` is their ``UNISON_TIMEOUT``, ``job_timeout`` the whole job's limit.

    A rank that raises fails the job (the others are ended, as under ``unison run``),
    and its exception is raised here with a note naming the rank and carrying its
    traceback; a rank that exits without one raises :class:`~unison.errors.LaunchError`.
    Elastic jobs (``min_num_proc``...) start with ``unison run --min-np`` instead.
    """
    from .hosts import DEFAULT_RSH, host_list, is_local, ssh_template, store_endpoint
    from .launcher import run_job

    if any(v is not None for v in (min_num_proc, max_num_proc, min_np, max_np, reset_limit,
                                   cooldown_range, slots)):  # fmt: skip
        raise UnsupportedError(
            "unison.run does not start elastic jobs: start the script with unison run "
            "--min-np N --max-np M (see docs/elastic.md)"
        )
    if use_mpi:
        raise UnsupportedError(f"use_mpi=True: {_MPI_INSTEAD}")
    if hosts is not None and hostfile is not None:
        raise InvalidArgumentError("give hosts or hostfile, not both")
    count = np if np is not None else num_proc if num_proc is not None else 1
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise InvalidArgumentError(f"np must be an integer >= 1, got {count!r}")
    kwargs = dict(kwargs or {})
    try:
        payload = _pickler().dumps((fn, tuple(args), kwargs))
    except Exception as exc:
        raise InvalidArgumentError(
            f"unison.run: cannot pickle the function and its arguments ({exc}); define the "
            "function at module level"
        ) from exc
    prep = multiprocessing.spawn.get_preparation_data("unison-run")
    prep.pop("authkey", None)  # the ranks start no multiprocessing of this process
    host_slots = host_list(hosts, hostfile)
    base = dict(os.environ if env is None else env)
    secret = secrets.token_bytes(32)
    remote = [h for h, _ in host_slots or () if not is_local(h)]
    bind = "0.0.0.0" if remote else "127.0.0.1"  # the secret guards it
    with TCPStoreServer(bind, 0, secret, max_connections=max(1024, 4 * count)) as server:
        server.start()
        port = server.address[1]
        reach = store_endpoint(None, network_interface, remote[0])[0] if remote else "127.0.0.1"
        with TCPStore("127.0.0.1", port, secret, timeout=30.0) as store:
            store.set(FUNCTION_KEY, pickle.dumps((prep, payload)))
        base[C.ENV_RUN_FUNCTION] = f"{reach}:{port}:{secret.hex()}"
        command = [executable or sys.executable, "-m", "unison.launch.call"]
        status = run_job(
            command,
            count,
            timeout=timeout,
            job_timeout=job_timeout,
            env=base,
            hosts=host_slots,
            rsh=ssh_template(DEFAULT_RSH, ssh_port, ssh_identity_file),
            network_interface=network_interface,
            output_dir=output_filename,
            verbose=bool(verbose),
            start_timeout=start_timeout,
            stdout=_binary(sys.stdout),
            stderr=_binary(sys.stderr),
        )
        records = [server.get_local(RESULT_KEY.format(rank=r)) for r in range(count)]
    return _results(records, status)


def _results(records: Sequence[bytes | None], status: int) -> list[Any]:
    """The ranks' values in rank order, or the first failure raised."""
    values: list[Any] = []
    failures: list[tuple[float, int, dict[str, Any]]] = []
    missing: list[int] = []
    for rank, raw in enumerate(records):
        if raw is None:
            missing.append(rank)
            values.append(None)
            continue
        record = pickle.loads(raw)
        if record["ok"]:
            values.append(record["value"])
        else:
            failures.append((record["when"], rank, record))
            values.append(None)
    if failures:
        _, rank, record = min(failures, key=lambda f: (f[0], f[1]))
        _raise(rank, record)
    if missing or status != 0:
        which = ", ".join(map(str, missing)) or "none"
        raise LaunchError(
            f"unison.run: the job ended with exit status {status}; ranks without a result: "
            f"{which} (their output above says why)"
        )
    return values


def _raise(rank: int, record: dict[str, Any]) -> None:
    note = f"raised on rank {rank} of unison.run; its traceback:\n{record['traceback']}"
    exc: BaseException | None = None
    if record["error"] is not None:
        try:
            exc = pickle.loads(record["error"])
        except Exception:
            exc = None
    if not isinstance(exc, BaseException):
        raise LaunchError(f"rank {rank} raised {record['type']}: {record['message']}\n{note}")
    exc.add_note(note)
    raise exc
