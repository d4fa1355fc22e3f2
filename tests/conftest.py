import os

import pytest

# Tests must not inherit a job environment from the shell that runs them.
for _k in [k for k in os.environ if k.startswith(("UNISON_", "HOROVOD_"))]:
    del os.environ[_k]


@pytest.fixture
def small_segments() -> dict[str, str]:
    """Environment forcing several pipeline segments for modest messages."""
    return {"UNISON_SEGMENT_BYTES": "1K", "UNISON_TIMEOUT": "30"}
