"""The test harness's ranks (unison.testing.spawn) leave no temporary files behind: a
forked rank ends without the interpreter's exit handlers, which is when TensorFlow's
autograph (and other libraries) remove theirs."""

from __future__ import annotations

import os
import tempfile

from unison.testing import spawn


def _leave_a_file() -> tuple[str, str]:
    """A temporary file meant to be removed at exit, as autograph's modules are."""
    f = tempfile.NamedTemporaryFile(prefix="left-", suffix=".py", delete=False)
    f.close()
    return f.name, os.path.realpath(tempfile.gettempdir())


def test_ranks_temporary_files_are_removed_when_the_job_ends() -> None:
    outs = spawn(_leave_a_file, 2)
    here = os.path.realpath(tempfile.gettempdir())
    dirs = {d for _, d in outs}
    assert len(dirs) == 1 and here not in dirs, (here, dirs)  # the job's own directory
    for path, _ in outs:
        assert not os.path.exists(path), path
