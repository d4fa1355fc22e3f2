import atexit
import os
import shutil
import tempfile

import pytest

# Tests must not inherit a job environment from the shell that runs them.
for _k in [k for k in os.environ if k.startswith(("UNISON_", "HOROVOD_"))]:
    del os.environ[_k]
# ...except the transport under test: `UNISON_TEST_TRANSPORT=tcp pytest` runs every
# spawned rank with UNISON_TRANSPORT=tcp (the suite must pass on shm and on tcp).
if os.environ.get("UNISON_TEST_TRANSPORT"):
    os.environ["UNISON_TRANSPORT"] = os.environ["UNISON_TEST_TRANSPORT"]
# OpenMPI's shared-memory backing files (/dev/shm/sm_segment.*) outlive the ranks of a job
# that a test kills or aborts: the suite's own go to a directory removed when it ends.
if "OMPI_MCA_btl_sm_backing_directory" not in os.environ:
    _OMPI_DIR = tempfile.mkdtemp(prefix="unison-tests-ompi-")
    os.environ["OMPI_MCA_btl_sm_backing_directory"] = _OMPI_DIR
    atexit.register(shutil.rmtree, _OMPI_DIR, True)


@pytest.fixture
def small_segments() -> dict[str, str]:
    """Environment forcing several pipeline segments for modest messages."""
    return {"UNISON_SEGMENT_BYTES": "1K", "UNISON_TIMEOUT": "30"}


from hypothesis import settings  # noqa: E402

# `make fuzz` selects this profile: many more examples, no per-example deadline.
settings.register_profile("fuzz", max_examples=20000, deadline=None)
settings.register_profile("default", deadline=None)
settings.load_profile("default")


#: test files that build network namespaces besides tests/hosts/ (a bridged set of hosts
#: puts an address on the root namespace, in a subnet chosen per process: two sets at
#: once could pick the same one)
NETNS_FILES = {"tests/faults/test_netns.py", "tests/launch/test_hosts.py"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make test``: ``-n 2 --dist loadgroup``) the tests that build
    network namespaces run in one worker, one after another."""
    for item in items:
        path = item.nodeid.split("::")[0]
        if path.startswith("tests/hosts/") or path in NETNS_FILES:
            item.add_marker(pytest.mark.xdist_group("netns"))
