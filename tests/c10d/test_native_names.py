"""unison's own API with torch.distributed's names; `import unison.torch` registers "unison"."""

from __future__ import annotations

import subprocess
import sys

from . import _native
from ._util import run, values


def test_native_api_takes_torch_distributed_keyword_names() -> None:
    outs = values(run(_native.native_names, 3, init=True))
    assert [o["checks"] for o in outs] == [17, 17, 17], outs


def test_import_unison_torch_registers_the_backend() -> None:
    code = (
        "import torch.distributed as dist\n"
        "assert 'unison' not in dist.Backend.backend_list\n"
        "import unison.torch\n"
        "assert 'unison' in dist.Backend.backend_list, dist.Backend.backend_list\n"
        "assert dist.Backend('unison') == 'unison'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, r.stderr
