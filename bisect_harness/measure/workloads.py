"""A sample's jobs for a workload other than the harness's own unique prompts
(``benchmark.workload``, ``workload.Workload``): a dataset file, shared-prefix groups, or
multi-turn sessions. ``client`` asks :func:`workload_jobs` for the jobs of each sample and of
each warm-up, and runs them as it runs any (``jobs.Job``).

=================  ==========================================================================
workload           a sample of ``n`` requests
=================  ==========================================================================
``Dataset``        ``first_turn``: ``n`` conversations drawn from the file, each its first user
                   turn as the prompt and its reply's length as the output; ``conversation``:
                   whole conversations, each a session of its turns (``sessions``), until they
                   make ``n`` requests (``datasets.draw``)
``SharedPrefix``   ``n`` requests, request ``i`` of group ``(i // suffixes) % groups``: its
                   group's prefix of ``prefix_tokens``, then a suffix of its own of
                   ``prompt_tokens``; a group's requests one after another
``MultiTurn``      ``ceil(n / turns)`` sessions of ``turns`` turns (whole sessions: ``n``
                   rounded up), each turn a new user prompt of ``prompt_tokens`` after the
                   conversation so far, ``think_s`` after each reply
=================  ==========================================================================

What is reused, and what is not. Prompts, suffixes and user turns are drawn like the
harness's own (``prompts``): each its own in every sample and boot. A shared prefix is fresh
per boot and the same in every sample of it (the warm-up's included), so reuse happens only
inside a boot, where it is the point; a session reuses its own earlier turns. So a cache
effect is measured, never an accident: the engine's own figures per sample say how much of
the prompts it took from its cache (``cached_prompt_tokens``, ``prefix_cache_hit_share``, and
vLLM's ``prefix_cache_hit_rate``).

Lengths. A prompt of ``prompt_tokens`` has the words the boot's prompts were fitted to
(``prompt_size``: ``words`` per ``prompt_tokens`` tokens, where the server counts them), and
a prefix as many in proportion. A dataset's lengths are counted by the server's tokenizer
where it has one (``prompt_size.token_counter``, once per text and boot), else in words.

Draws are fixed by the benchmark's seed and the sample's :class:`Place`: a dataset's
conversations by the round (the boot's number in its config), so both arms of a round send
the same conversations, and the lengths that come with them; texts of the harness's own (a
shared prefix, a suffix, a user turn) by the boot, as ``prompts`` draws them. (Two arms that
share one attached server would find a round's conversations in its cache the second time:
the engine's cache figures say so.)
"""

from __future__ import annotations

import functools
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import httpx

from bisect_harness.measure.apis import get_api
from bisect_harness.measure.datasets import Lengths, draw
from bisect_harness.measure.deadline import deadline_client
from bisect_harness.measure.jobs import Job, RequestJob
from bisect_harness.measure.prompt_size import token_counter
from bisect_harness.measure.prompts import draw_number, numbered_prompt, request_prompt
from bisect_harness.measure.sessions import SessionJob, Turn
from bisect_harness.model import BenchmarkSpec
from bisect_harness.workload import Dataset, MultiTurn, SharedPrefix

__all__ = ["Place", "dataset_lengths", "shared_prefix_prompts", "workload_jobs"]


@dataclass(frozen=True)
class Place:
    """Where a sample sits: its ``boot`` (the ledger's number: what is fresh per boot, a shared
    prefix, a prompt's text), its ``round`` (the boot's number in its config, ``BootRequest.seq``:
    what both arms of a round share, a dataset's draws) and its number in the boot, ``sample``
    (0 or below: a warm-up)."""

    boot: int = 0
    round: int = 0
    sample: int = 1


def workload_jobs(bench: BenchmarkSpec, base_url: str, model: str | None, n: int, words: int | None = None, *,
                  boot: int = 0, sample: int = 1, boot_seq: int | None = None) -> list[Job]:
    """The jobs of sample ``sample`` (0 or below: a warm-up) of boot ``boot``, the ``boot_seq``-th
    of its config (None: as many as ``boot``), for ``bench.workload``, ``n`` requests (module
    docstring); ``words``: the words of a ``prompt_tokens`` prompt (``prompt_size.PromptSize.words``;
    None: ``prompt_tokens``)."""
    place = Place(boot, boot_seq if boot_seq is not None else boot, sample)
    return _jobs(bench.workload, bench, base_url, model, n, words, place)


@functools.singledispatch
def _jobs(workload, bench: BenchmarkSpec, base_url: str, model: str | None, n: int, words: int | None,
          place: Place) -> list[Job]:
    raise TypeError(f"benchmark.workload {workload!r} is not a workload the client knows: "
                    "a dataset, shared_prefix or multi_turn")


@_jobs.register
def _(workload: Dataset, bench, base_url, model, n, words, place) -> list[Job]:
    api = get_api(bench.api)
    url = base_url.rstrip("/") + api.path
    # drawn by the round: both arms of a round send the same conversations
    drawn = draw(workload, n, dataset_lengths(base_url, model, place.boot), seed=bench.seed, boot=place.round,
                 sample=place.sample)
    if workload.mode == "first_turn":
        out: list[Job] = []
        for d in drawn:
            (prompt, most), = d.turns
            body = api.payload(prompt=prompt, max_tokens=most, temperature=bench.temperature,
                               ignore_eos=bench.ignore_eos, model=model, seed=bench.seed)
            out.append(RequestJob(url, body, api, bench.request_timeout_s, most, bench.limits.stream_line_bytes))
        return out
    return [SessionJob(url, api, tuple(Turn(u, most) for u, most in d.turns), bench.request_timeout_s,
                       temperature=bench.temperature, ignore_eos=bench.ignore_eos, model=model, seed=bench.seed,
                       system=d.system, max_line=bench.limits.stream_line_bytes) for d in drawn]


@_jobs.register
def _(workload: SharedPrefix, bench, base_url, model, n, words, place) -> list[Job]:
    api = get_api(bench.api)
    url = base_url.rstrip("/") + api.path
    out: list[Job] = []
    for prompt in shared_prefix_prompts(workload, bench, n, words, boot=place.boot, sample=place.sample):
        body = api.payload(prompt=prompt, max_tokens=bench.output_tokens, temperature=bench.temperature,
                           ignore_eos=bench.ignore_eos, model=model, seed=bench.seed)
        out.append(RequestJob(url, body, api, bench.request_timeout_s, bench.output_tokens,
                              bench.limits.stream_line_bytes))
    return out


@_jobs.register
def _(workload: MultiTurn, bench, base_url, model, n, words, place) -> list[Job]:
    api = get_api(bench.api)
    url = base_url.rstrip("/") + api.path
    turns = max(1, workload.turns)
    return [SessionJob(url, api, tuple(Turn(request_prompt(bench, s * turns + t, words, boot=place.boot,
                                                           sample=place.sample),
                                            bench.output_tokens) for t in range(turns)),
                       bench.request_timeout_s, temperature=bench.temperature, ignore_eos=bench.ignore_eos,
                       model=model, seed=bench.seed, think_s=workload.think_s, max_line=bench.limits.stream_line_bytes)
            for s in range(math.ceil(max(1, n) / turns))]


def shared_prefix_prompts(workload: SharedPrefix, bench: BenchmarkSpec, n: int, words: int | None = None, *,
                          boot: int = 0, sample: int = 1) -> list[str]:
    """The ``n`` prompts of a shared-prefix sample: request ``i`` is group
    ``g = (i // suffixes) % groups``'s prefix, a space, and a suffix of its own.

    A prefix is fixed by ``(seed, boot, g)``: the same in every sample of a boot, fresh in the
    next boot. Its tag spells a per-boot number plus ``g`` (``prompts.numbered_prompt``), so
    the groups' prefixes differ from their first word (up to 32 groups; from their first two
    up to 1024). A suffix's tag spells a per-sample number plus ``i``, so the suffixes of one
    group differ from their first word too: two prompts of a group share exactly their prefix
    (up to 32 suffixes a group)."""
    groups, per = max(1, workload.groups), max(1, workload.suffixes)
    suffix_words = words if words is not None else bench.prompt_tokens
    ratio = suffix_words / bench.prompt_tokens if bench.prompt_tokens > 0 else 1.0
    prefix_words = max(1, round(workload.prefix_tokens * ratio))
    seed = bench.seed
    base = draw_number(f"{seed}:{boot}:prefix")
    prefixes = [numbered_prompt(prefix_words, base + g, seed, g, f"{seed}:{boot}:prefix:{g}") for g in range(groups)]
    out = []
    for i in range(n):
        g = (i // per) % groups
        key = f"{seed}:{boot}:{sample}:suffix:{g}"
        suffix = numbered_prompt(suffix_words, draw_number(key) + i, seed, i, f"{key}:{i}")
        out.append(prefixes[g] + " " + suffix)
    return out


# --------------------------------------------------------------------------- lengths

#: The lengths of the latest boots, a boot's own (its server on its port), newest last: as
#: many as boots that may run at once in one process, and more, so none in use is let go.
_LENGTHS: "OrderedDict[tuple[str, str | None, int], tuple[Lengths, httpx.Client | None]]" = OrderedDict()
_LENGTHS_KEPT = 16
_LENGTHS_LOCK = threading.Lock()


def dataset_lengths(base_url: str, model: str | None, boot: int) -> Lengths:
    """How boot ``boot``'s server at ``base_url`` measures a dataset's texts: its tokenizer
    where it has one (each text counted once), else words. Kept per boot: a later boot may be
    another server on the same port."""
    key = (base_url, model, boot)
    with _LENGTHS_LOCK:
        kept = _LENGTHS.get(key)
        if kept is not None:
            _LENGTHS.move_to_end(key)
            return kept[0]
    http: httpx.Client | None = deadline_client(headers={"Accept-Encoding": "identity"})
    count, via = token_counter(http, base_url, model, "the river and the city")  # asked outside the lock
    if count is None:
        http.close()
        lengths, http = Lengths.words(), None
    else:
        lengths = Lengths(_once(count), "tokens", via)
    with _LENGTHS_LOCK:
        if key in _LENGTHS:  # another thread of the boot asked first: its lengths stand
            if http is not None:
                http.close()
            return _LENGTHS[key][0]
        while len(_LENGTHS) >= _LENGTHS_KEPT:  # the oldest boot's: long over
            _, (_, old) = _LENGTHS.popitem(last=False)
            if old is not None:
                old.close()
        _LENGTHS[key] = (lengths, http)
        return lengths


def _once(count: Callable[[str], int | None]) -> Callable[[str], int]:
    """``count`` asked once per text; a text the tokenizer did not count (an error on that one
    text) is measured in words, as a server without a tokenizer would be."""
    seen: dict[str, int] = {}
    lock = threading.Lock()

    def counted(text: str) -> int:
        with lock:
            if text in seen:
                return seen[text]
        n = count(text)
        n = n if n is not None else len(text.split())
        with lock:
            seen[text] = n
        return n

    return counted
