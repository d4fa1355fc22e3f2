"""One conformance suite run against every Store: TCP, file, and prefixed views of both."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from unison.errors import InvalidArgumentError, StoreError, StoreTimeoutError
from unison.store import FileStore, PrefixStore, Store, TCPStore, TCPStoreServer

pytestmark = pytest.mark.timeout(30)

SECRET = b"conformance-secret"

Factory = Callable[[], Store]


@pytest.fixture(params=["tcp", "file", "prefix-tcp", "prefix-file"])
def make_store(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[Factory]:
    """A factory of independent handles (clients) on one shared store."""
    kind: str = request.param
    made: list[Store] = []
    server: TCPStoreServer | None = None
    if "tcp" in kind:
        server = TCPStoreServer(secret=SECRET).start()
        host, port = server.address

        def base() -> Store:
            return TCPStore(host, port, SECRET, timeout=10.0)
    else:
        path = str(tmp_path)

        def base() -> Store:
            return FileStore(path, timeout=10.0)

    def factory() -> Store:
        store = base()
        made.append(store)
        return PrefixStore("job/7", store) if kind.startswith("prefix") else store

    yield factory
    for store in made:
        store.close()
    if server is not None:
        server.close()


def test_set_get_roundtrip_and_overwrite(make_store: Factory) -> None:
    s = make_store()
    s.set("a", b"1")
    assert s.get("a") == b"1"
    s.set("a", b"two")
    assert s.get("a") == b"two"
    s.set("empty", b"")
    assert s.get("empty") == b""
    s.set("ключ/🙂", bytearray(b"\x00\xff"))  # type: ignore[arg-type]
    assert s.get("ключ/🙂") == b"\x00\xff"


def test_large_value(make_store: Factory) -> None:
    s = make_store()
    blob = bytes(range(256)) * 4096  # 1 MiB
    s.set("blob", blob)
    assert make_store().get("blob") == blob


def test_get_timeout_names_key_within_deadline(make_store: Factory) -> None:
    s = make_store()
    t0 = time.monotonic()
    with pytest.raises(StoreTimeoutError, match=r"'(job/7/)?nope'") as info:
        s.get("nope", timeout=0.3)
    elapsed = time.monotonic() - t0
    assert 0.25 <= elapsed < 2.0
    assert isinstance(info.value, TimeoutError)
    with pytest.raises(StoreTimeoutError):
        s.get("nope", timeout=0)


def test_default_timeout_attribute(make_store: Factory) -> None:
    s = make_store()
    s.timeout = 0.2
    t0 = time.monotonic()
    with pytest.raises(StoreTimeoutError):
        s.get("never")
    assert time.monotonic() - t0 < 2.0


def test_blocking_get_released_by_other_client(make_store: Factory) -> None:
    waiter, setter = make_store(), make_store()
    result: list[bytes] = []
    t = threading.Thread(target=lambda: result.append(waiter.get("late", timeout=10)))
    t.start()
    time.sleep(0.2)
    assert t.is_alive()
    setter.set("late", b"here")
    t.join(5)
    assert result == [b"here"]


def test_add_counts(make_store: Factory) -> None:
    s = make_store()
    assert s.add("n", 5) == 5
    assert s.add("n", -2) == 3
    assert s.get("n") == b"3"
    assert s.add("fresh", 0) == 0
    s.set("text", b"abc")
    with pytest.raises(StoreError, match="not an integer"):
        s.add("text", 1)
    with pytest.raises(InvalidArgumentError):
        s.add("n", 1.5)  # type: ignore[arg-type]


def test_concurrent_add_exact_total(make_store: Factory) -> None:
    clients = [make_store() for _ in range(4)]
    per = 50

    def work(c: Store) -> None:
        for _ in range(per):
            c.add("counter", 1)

    threads = [threading.Thread(target=work, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert clients[0].add("counter", 0) == 4 * per


def test_compare_set_semantics(make_store: Factory) -> None:
    s = make_store()
    # missing key + expected b"" -> stored
    assert s.compare_set("k", b"", b"v1") == b"v1"
    assert s.get("k") == b"v1"
    # match -> replaced
    assert s.compare_set("k", b"v1", b"v2") == b"v2"
    # mismatch -> unchanged, returns current
    assert s.compare_set("k", b"zzz", b"v3") == b"v2"
    assert s.get("k") == b"v2"
    # missing key + non-empty expected -> nothing stored, expected returned (torch)
    assert s.compare_set("absent", b"x", b"y") == b"x"
    assert not s.check(["absent"])


def test_wait_and_check(make_store: Factory) -> None:
    s, other = make_store(), make_store()
    assert s.check([])
    s.wait([], timeout=0.1)
    s.set("a", b"")
    assert s.check(["a"])
    assert not s.check(["a", "b"])
    with pytest.raises(StoreTimeoutError) as info:
        s.wait(["a", "b", "c"], timeout=0.2)
    msg = str(info.value)
    assert re.search(r"'(job/7/)?b'", msg) and re.search(r"'(job/7/)?c'", msg)
    assert not re.search(r"'(job/7/)?a'", msg)
    timer = threading.Timer(0.2, lambda: (other.set("b", b"1"), other.set("c", b"2")))
    timer.start()
    s.wait(["a", "b", "c"], timeout=10)
    timer.join()
    with pytest.raises(InvalidArgumentError):
        s.wait("abc")
    with pytest.raises(InvalidArgumentError):
        s.check("abc")


def test_delete(make_store: Factory) -> None:
    s = make_store()
    assert s.delete("x") is False
    s.set("x", b"1")
    assert s.delete("x") is True
    assert not s.check(["x"])
    with pytest.raises(StoreTimeoutError):
        s.get("x", timeout=0.05)


def test_bad_arguments(make_store: Factory) -> None:
    s = make_store()
    with pytest.raises(InvalidArgumentError):
        s.set(1, b"x")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        s.set("k", "text")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        s.get("k", timeout=-1)


def test_close_and_context_manager(make_store: Factory) -> None:
    s = make_store()
    s.set("k", b"v")
    with s as same:
        assert same.get("k") == b"v"
    if not isinstance(s, PrefixStore):
        with pytest.raises(StoreError):
            s.get("k")


def test_prefix_isolation(tmp_path: object) -> None:
    server = TCPStoreServer(secret=SECRET).start()
    try:
        with TCPStore(*server.address, SECRET, timeout=5) as base:
            a, b = PrefixStore("a", base), PrefixStore("b", base)
            a.set("k", b"A")
            b.set("k", b"B")
            assert a.get("k") == b"A" and b.get("k") == b"B"
            assert base.get("a/k") == b"A"
            assert server.get_local("b/k") == b"B"
            nested = PrefixStore("inner", a)
            nested.set("x", b"1")
            assert base.get("a/inner/x") == b"1"
            a.timeout = 1.5
            assert base.timeout == 1.5
            with pytest.raises(StoreTimeoutError, match="'a/missing'"):
                a.get("missing", timeout=0.05)
    finally:
        server.close()
    with pytest.raises(InvalidArgumentError):
        PrefixStore("", FileStore(str(tmp_path)))


def test_file_store_refuses_a_directory_others_can_write(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(StoreError, match="refusing to trust"):
        FileStore(str(shared))
    shared.chmod(0o700)
    with FileStore(str(shared), timeout=1) as store:
        store.set("k", b"v")
        assert store.get("k") == b"v"
