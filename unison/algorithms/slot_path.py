"""What a call on the small-message slots costs, in the link model's terms.

A collective of the world of a one-host job whose payload fits a slot
(``UNISON_SMALL_BYTES``, 1 MiB by default) runs on the shared slots
(:mod:`unison.transport.seqslot`, :mod:`unison.backends.native.slot_collectives`), not on
an algorithm the selector picks: the size alone decides, so the selector never
prices it. ``unison simulate`` does, with this module, from what the slots do in one
call: every rank copies its contribution into its slot, all meet at one slot barrier,
then each reads its peers' slots, one round of a direct algorithm
(:func:`.shm_arena.round_fixed`: the barrier, :func:`unison.link.sync_at`, and one end's
Python work):

* all-reduce: copy n in, reduce the ``p`` slots into the output (``(p−1)·n`` reduced);
* broadcast: the root copies n in, every other rank copies n out; the root's call ends
  at the barrier, so in a run of calls its next copy in overlaps the readers' copies out
  and a call costs one copy (a lone call: two, which this does not price);
* all-gather (n: the gathered output): copy n/p in, copy the ``p`` blocks out (n);
* reduce-scatter (n: the whole input): copy n in, reduce its n/p slice of ``p`` slots.

The per-byte terms are the link's copy and reduction rates (measured between
processes, as the slots move data), scaled by ranks per core when ranks outnumber the
cores (:func:`unison.link.crowding`); the per-call overhead is the link's, as for the
algorithms.
"""

from __future__ import annotations

import math

from ..link import Link, SharedLink, crowding
from .shm_arena import round_fixed

__all__ = ["COLLECTIVES", "cost", "uses_slots"]

#: the collectives the slots carry, as ``unison simulate --validate`` names them
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")


def uses_slots(collective: str, p: int, n: int, small: int) -> bool:
    """Whether a world call of ``n`` bytes (all-gather: the gathered output;
    reduce-scatter: the whole input) runs on slots of ``small`` bytes: what each rank
    puts in its slot must fit (all-gather: its block, n/p)."""
    if collective not in COLLECTIVES or p < 2 or small <= 0:
        return False
    payload = n // p if collective == "all_gather" else n
    return payload <= small


def cost(collective: str, p: int, n: int, link: Link) -> float:
    """Seconds of one slot call of ``collective`` by ``p`` ranks on ``n`` bytes, the
    per-call overhead excluded (inf where the link is not one host's)."""
    if not isinstance(link, SharedLink) or p < 2 or collective not in COLLECTIVES:
        return math.inf
    c, g, r = link.copy, link.gamma, crowding(p, link)
    if collective == "all_reduce":
        work = r * n * (c + (p - 1) * g)
    elif collective == "broadcast":
        work = r * n * c  # the readers' copies out (the root's next copy in overlaps them)
    elif collective == "all_gather":
        work = r * (n / p + n) * c
    else:
        work = r * (n * c + (p - 1) / p * n * g)
    return round_fixed(p, link) + work
