"""``unison run``, the ``unison`` console script, and launcher environment conventions.

Importing this package is cheap: only :mod:`.env` is loaded. The launcher itself is
:mod:`unison.launch.launcher`; the console script is :func:`unison.launch.cli.main`.
"""

from ..jobenv import FAILURE_KEY, JobInfo, detect_job, failure_record, parse_failure_record

__all__ = ["FAILURE_KEY", "JobInfo", "detect_job", "failure_record", "parse_failure_record"]
