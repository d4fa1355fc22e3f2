import os

import pytest

# Tests must not inherit a job environment from the shell that runs them.
for _k in [k for k in os.environ if k.startswith(("UNISON_", "HOROVOD_"))]:
    del os.environ[_k]
# ...except the transport under test: `UNISON_TEST_TRANSPORT=tcp pytest` runs every
# spawned rank with UNISON_TRANSPORT=tcp (the suite must pass on shm and on tcp).
if os.environ.get("UNISON_TEST_TRANSPORT"):
    os.environ["UNISON_TRANSPORT"] = os.environ["UNISON_TEST_TRANSPORT"]


@pytest.fixture
def small_segments() -> dict[str, str]:
    """Environment forcing several pipeline segments for modest messages."""
    return {"UNISON_SEGMENT_BYTES": "1K", "UNISON_TIMEOUT": "30"}


from hypothesis import settings  # noqa: E402

# `make fuzz` selects this profile: many more examples, no per-example deadline.
settings.register_profile("fuzz", max_examples=20000, deadline=None)
settings.register_profile("default", deadline=None)
settings.load_profile("default")
