"""``python -m unison``: the ``unison`` command (``run``, ``info``, ``bench``, ...), for
hosts where another ``unison`` (the file synchroniser) is first on PATH."""

import sys

from unison.launch.cli import main

if __name__ == "__main__":
    sys.exit(main())
