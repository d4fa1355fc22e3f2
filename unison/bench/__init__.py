"""``unison bench``: nccl-tests-style collective benchmarks, with the peers measured alongside.

:mod:`.spec` parses sizes and knows each operation's bus-bandwidth factor;
:mod:`.backends` runs one operation on unison, torch.distributed (Gloo) or
mpi4py (OpenMPI); :mod:`.worker` is what every launched rank runs;
:mod:`.report` prints the table and draws the plot; :mod:`.cli` ties them up.
"""

from .spec import OPS, BenchSpec, bus_factor, parse_sizes

__all__ = ["OPS", "BenchSpec", "bus_factor", "parse_sizes"]
