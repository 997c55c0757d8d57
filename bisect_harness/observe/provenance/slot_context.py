"""Did llama-server take the context size it was given? ``--ctx-size`` is the total
context of the server, over all its slots; ``GET /props`` reports the context of one
slot (``default_generation_settings.n_ctx``) beside the slot count (``total_slots``).
:func:`slot_context_matches` says whether a reported slot is what the asked total
makes of it.

The rule, read from llama.cpp as vendored in llama-cpp-python 0.3.36 and checked on the
llama-server built from it (``tests/fixtures/engines/llamacpp-0.3.36-props-*.json``):

* ``src/llama-context.cpp``: the total is padded up to a multiple of 256; with a
  unified KV cache a slot holds the whole total, otherwise the total is split over the
  slots (``n_parallel``) and a slot's share is padded up to 256 again
  (``-c 1000 -np 3``: a slot of 512, the total 1536);
* ``tools/server/server.cpp``: ``--parallel`` left out (auto) means 4 slots and a
  unified cache;
* ``tools/server/server-context.cpp`` ``n_ctx_slot()``: a slot is capped by
  ``--kv-unified-per-slot`` and by the model's training context (``-c 1024`` on a model
  trained at 512: a slot of 512, said in the log as "the slot context (1024) exceeds
  the training context of the model (512) - capping").

Earlier builds padded the total to 32 or 256 and split it over the slots unpadded
(``n_ctx / n_parallel``); the unified cache and its default came later. ``/props`` does
not say whether the cache is unified, and that default has changed across versions,
so a slot is believed when it fits either layout: the whole padded total
(``C <= n_ctx <= pad256(C)``), or the total's share of one slot
(``C // slots <= n_ctx <= pad256(pad256(C) // slots)``), each capped by
``--kv-unified-per-slot`` where the flags set it. The bounds hold for every one of
these rules. The model's training context is not in ``/props``: a slot the model
capped is read as not what was asked, which it is (the server cannot hold more in a
slot than the cap, whatever the flag said).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from bisect_harness.measure.values import _as_number

#: llama.cpp pads a context to a multiple of this (``src/llama-context.cpp`` ``GGML_PAD(n_ctx, 256)``)
CONTEXT_PAD = 256
#: where ``/props`` says how many slots the server has
SLOTS_KEY = "total_slots"
#: the flag that caps a slot (normalised), llama.cpp's ``--kv-unified-per-slot``
PER_SLOT_FLAG = "kv_unified_per_slot"


def _pad(n: int) -> int:
    return -(-n // CONTEXT_PAD) * CONTEXT_PAD


def _count(value: Any) -> int | None:
    """A whole number of tokens or slots from a reported or requested value, or None."""
    n = _as_number(value)
    return int(n) if n is not None and math.isfinite(n) and n == int(n) else None


def slot_bounds(total: int, slots: int, per_slot: int | None = None) -> tuple[tuple[int, int], tuple[int, int]]:
    """The ``(lowest, highest)`` context of one slot that a total of ``total`` tokens
    gives, for a unified cache and for a split one, over ``slots`` slots, each capped at
    ``per_slot`` when it is set.

    >>> slot_bounds(1000, 3)
    ((1000, 1024), (333, 512))
    """
    unified, split = (total, _pad(total)), (total // slots, _pad(_pad(total) // slots))
    if per_slot is not None and per_slot > 0:
        unified, split = ((min(lo, per_slot), min(hi, per_slot)) for lo, hi in (unified, split))
    return unified, split


def slot_context_matches(requested: Any, slot_ctx: Any, server_info: Mapping[str, Any],
                         flags: Mapping[str, Any]) -> tuple[bool | None, Any]:
    """Whether ``slot_ctx``, the context of one slot the server reports, is what a
    ``--ctx-size`` of ``requested`` tokens gives, with the server's ``total_slots`` and
    ``flags`` (the requested flags, read for ``--kv-unified-per-slot``); and the
    reported figures, ``{"n_ctx": ..., "total_slots": ...}``, to show beside the verdict.

    True or False; None where it cannot be told: a ``requested`` of 0 (the model's own
    context, which ``/props`` does not report) or not a whole number, a slot that is not
    one, or a slot below the asked total where the server reports no slot count.
    """
    want, have = _count(requested), _count(slot_ctx)
    slots = _count(server_info.get(SLOTS_KEY)) if isinstance(server_info, Mapping) else None
    shown = {"n_ctx": slot_ctx, SLOTS_KEY: server_info.get(SLOTS_KEY) if isinstance(server_info, Mapping) else None}
    if want is None or want <= 0 or have is None:
        return None, shown
    per_slot = next((_count(v) for f, v in flags.items()
                     if str(f).strip().lstrip("-").replace("-", "_") == PER_SLOT_FLAG), None)
    (u_lo, u_hi), (s_lo, s_hi) = slot_bounds(want, slots if slots and slots > 0 else 1, per_slot)
    if u_lo <= have <= u_hi:
        return True, shown  # the whole total in one slot: taken, however many slots there are
    if slots is None or slots <= 0:
        return None, shown  # a share of the total, but of how many slots the server does not say
    return s_lo <= have <= s_hi, shown


__all__ = ["CONTEXT_PAD", "PER_SLOT_FLAG", "SLOTS_KEY", "slot_bounds", "slot_context_matches"]
