"""Did the mechanism a flag claims really run while the samples were measured?

An engine accepts a flag and can still leave its mechanism off: llama.cpp's
``llama-server -md DRAFT`` loads a draft model and, in builds that want
``--spec-type draft-simple`` as well, never drafts a token; SGLang captures its
CUDA graphs at start and can still run every EAGLE verify pass eagerly. The flag
check (``provenance.flags``) sees the value echoed back; this module asks for the
engine's own evidence that the mechanism *ran*, read over the window the samples
were measured in (:class:`Window`: ``/metrics`` scraped just before the first
measured sample, after the warm-up, and just after the last; the log lines
printed between them), and for what it says at start-up.

Each preset declares, once, the mechanisms its flags claim (:class:`Mechanism`;
one on by default, as CUDA graphs are in SGLang, is checked on every boot unless
an off-flag turns it off), each with its evidence in order of trust:

* window evidence, which can say the mechanism ran: :class:`Counter` (a counter's
  change over the window, per label: graph passes against eager passes),
  :class:`Gauge` (a gauge read at the window's end), :class:`LogLine` (lines
  printed during the window);
* start-up evidence, which can only say the mechanism was set up (or was not):
  :class:`InfoField` (a server-info field), :class:`StartupLine` (a boot log line
  printed before the window).

:func:`check` answers each claimed mechanism with one of :data:`STATES`:

* ``engaged``: engaged in the window (the window evidence saw it run);
* ``not_engaged``: not engaged in the window (the window evidence saw the work
  run without it; or it was never set up at start, so it could not run); mark
  :data:`NOT_ENGAGED`;
* ``set_up_not_seen``: set up at start, not seen in the window (graphs captured
  and never replayed); mark :data:`NOT_SEEN`;
* ``not_observable``: no window evidence could be read; the start-up evidence, if
  any, is quoted. No mark, and never a passed check.

Start-up evidence alone never reads ``engaged``: a capture is not a replay::

    results = check(preset.mechanisms, flags, Window(before=..., after=..., log=..., startup_log=...,
                                                     server_info=...))
    [r.state for r in results]      # ['set_up_not_seen']
    results[0].evidence             # 'sglang:cuda_graph_passes_total over the window: decode_cuda_graph +0, ...'
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from bisect_harness.measure.values import lookup

__all__ = ["Counter", "Gauge", "LogLine", "InfoField", "StartupLine", "Mechanism", "MechanismResult", "Window",
           "check", "marks", "NOT_ENGAGED", "NOT_SEEN", "STATES", "ANSWERED", "WORDS", "summary",
           "truthy", "as_bool", "positive", "true_means_off", "unless_text", "unless_none"]

#: The mark of a boot where a claimed mechanism did not run in the window.
NOT_ENGAGED = "mechanism_not_engaged"
#: The mark of a boot where a mechanism was set up at start and not seen running in the window.
NOT_SEEN = "mechanism_not_seen"

STATES = ("engaged", "not_engaged", "set_up_not_seen", "not_observable")
#: The states that answer the check (the window was read); ``not_observable`` does not.
ANSWERED = ("engaged", "not_engaged", "set_up_not_seen")
#: Each state in words, as the journal says it.
WORDS = MappingProxyType({
    "engaged": "engaged in the window",
    "not_engaged": "not engaged in the window",
    "set_up_not_seen": "set up at start, not seen in the window",
    "not_observable": "not observable",
})


@dataclass(frozen=True)
class Window:
    """What a boot gives as evidence about its measured samples.

    ``before`` and ``after`` are ``/metrics`` parsed (``sources.prometheus.parse_prometheus``)
    just before the first measured sample and just after the last (None when the
    server served none); ``log`` the lines of the boot log printed between the two,
    ``startup_log`` the log before the first (launch, warm-up);
    ``server_info`` the server-info JSON."""

    before: Sequence | None = None
    after: Sequence | None = None
    log: str = ""
    startup_log: str = ""
    server_info: Mapping | None = None


class _Reading(NamedTuple):
    """One probe's answer: ``yes`` (ran, or set up) or not, and what it saw."""

    yes: bool
    text: str


def _names(series: str) -> tuple[str, ...]:
    """The sample names a counter is exposed under: ``x`` and ``x_total`` (prometheus_client
    writes a counter ``x`` as ``x_total``; some servers write the family as ``x_total``)."""
    base = series[:-len("_total")] if series.endswith("_total") else series
    return base, base + "_total"


def _matching(samples: Sequence, series: str, labels: Mapping[str, str]) -> list[tuple[dict, float]]:
    names = _names(series)
    return [(lab, v) for n, lab, v in samples
            if n in names and all(lab.get(k) == want for k, want in labels.items())]


def _by(samples: Sequence, series: str, labels: Mapping[str, str], key: str) -> dict[str, float] | None:
    """The series summed per value of label ``key`` ('' for one sum); None when it has no sample."""
    found = _matching(samples, series, labels)
    if not found:
        return None
    out: dict[str, float] = {}
    for lab, v in found:
        k = lab.get(key, "") if key else ""
        out[k] = out.get(k, 0.0) + v
    return out


def _fmt(x: float) -> str:
    return f"{x:g}" if abs(x) < 1e6 else f"{x:.4g}"


@dataclass(frozen=True)
class Counter:
    """Window evidence: a Prometheus counter's change over the window, summed over
    every label set that carries ``labels``.

    Plain (no ``by``): the counter moves only when the mechanism runs (draft tokens):
    ran when it moved, not when it stayed. Split ``by`` a label (SGLang's ``mode``):
    the counter counts every pass of the work, labelled by whether it went through
    the mechanism (``ran``: ``decode_cuda_graph``) or around it (``skipped``:
    ``decode_none``); ran when a ``ran`` value moved, not when only ``skipped`` ones
    did, no answer when neither moved. ``accepted`` names a second counter whose
    change is stated beside (accepted draft tokens: the acceptance)."""

    series: str
    by: str = ""
    ran: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    accepted: str = ""

    def read(self, w: Window) -> _Reading | None:
        if w.before is None or w.after is None:
            return None
        after = _by(w.after, self.series, self.labels, self.by)
        if after is None:
            return None
        before = _by(w.before, self.series, self.labels, self.by) or {}  # a labelled series born in the window
        delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
        if any(d < 0 for d in delta.values()):  # the server restarted under the window: no delta to read
            return None
        if not self.by:
            moved = delta.get("", 0.0)
            text = f"{self.series} +{_fmt(moved)} over the window"
            if self.accepted and moved > 0:
                acc = self._accepted(w)
                if acc is not None:
                    text += f", {self.accepted} +{_fmt(acc)} (acceptance {acc / moved:.0%})"
            return _Reading(moved > 0, text)
        ran = math.fsum(delta.get(k, 0.0) for k in self.ran)
        skipped = math.fsum(delta.get(k, 0.0) for k in self.skipped)
        # the first of each always (SGLang exports no decode_cuda_graph until one replays),
        # the others as the server exports them
        shown = [k for k in (*self.ran, *self.skipped) if k in delta or k in (self.ran[:1] + self.skipped[:1])]
        shown += sorted(k for k in delta if k not in shown)
        parts = ", ".join(f"{k} +{_fmt(delta.get(k, 0.0))}" for k in shown)
        if ran + skipped <= 0:
            return None
        share = f"{_fmt(ran)} of {_fmt(ran + skipped)} passes through it ({ran / (ran + skipped):.0%})"
        return _Reading(ran > 0, f"{self.series} over the window: {parts}; {share}")

    def _accepted(self, w: Window) -> float | None:
        after = _by(w.after, self.accepted, self.labels, "")
        if after is None:
            return None
        before = _by(w.before, self.accepted, self.labels, "") or {}
        return after[""] - before.get("", 0.0)

    def describe(self) -> str:
        return f"/metrics {self.series}" + (f" by {self.by}" if self.by else "") + " over the window"


@dataclass(frozen=True)
class Gauge:
    """Window evidence: a Prometheus gauge read at the window's end (the scrape just
    after the last sample; summed over the label sets that carry ``labels``);
    ``engaged(value)`` says whether it shows the mechanism running (True/False), or
    None when the value says nothing (a preset names a reader of this module's:
    :func:`positive`)."""

    series: str
    engaged: Callable[[float], bool | None]
    labels: Mapping[str, str] = field(default_factory=dict)

    def read(self, w: Window) -> _Reading | None:
        if w.after is None:
            return None
        found = [v for n, lab, v in w.after
                 if n == self.series and all(lab.get(k) == want for k, want in self.labels.items())]
        if not found:
            return None
        value = math.fsum(found)
        verdict = self.engaged(value)
        if verdict is None:
            return None
        return _Reading(bool(verdict), f"{self.series} = {_fmt(value)} at the window's end")

    def describe(self) -> str:
        return f"/metrics {self.series} at the window's end"


def _last_lines(pattern: str, text: str) -> tuple[int, str]:
    """How many lines of ``text`` match ``pattern``, and the last of them (trimmed)."""
    n, last = 0, ""
    for m in re.finditer(pattern, text, re.MULTILINE):
        n += 1
        start = text.rfind("\n", 0, m.start()) + 1
        end = text.find("\n", m.end())
        last = text[start:end if end >= 0 else len(text)].strip()[:160]
    return n, last


@dataclass(frozen=True)
class LogLine:
    """Window evidence: lines of the boot log printed during the window. ``engaged``
    matches a line that says the mechanism ran (``cuda graph: True``), ``disengaged``
    one that says the work ran without it (``cuda graph: False``): ran when any line
    said so, not when only disengaged lines were printed."""

    engaged: str = ""
    disengaged: str = ""

    def read(self, w: Window) -> _Reading | None:
        yes = _last_lines(self.engaged, w.log) if self.engaged else (0, "")
        no = _last_lines(self.disengaged, w.log) if self.disengaged else (0, "")
        if not yes[0] and not no[0]:
            return None
        counts = ", ".join(f"{n} line(s) saying it {what}" for n, what in ((yes[0], "ran"), (no[0], "did not"))
                           if n or what == "ran")
        last = yes[1] if yes[0] else no[1]
        return _Reading(yes[0] > 0, f"log in the window: {counts}; e.g. {last!r}")

    def describe(self) -> str:
        return "log lines in the window"


# --------------------------------------------------------------------------- what a value says
# The readers a preset names for :class:`InfoField` (``set_up``) and :class:`Gauge`
# (``engaged``): each takes the value read and says True (set up, or running), False
# (not) or None (the value says nothing). They live here, beside the evidence that
# calls them, so the check calls no code of the layer above it (an engine's preset).


def truthy(value: Any) -> bool:
    """Set up when the field holds a value at all, not when it is empty, zero or null
    (SGLang's ``speculative_algorithm``, vLLM's ``speculative_config``)."""
    return bool(value)


def as_bool(value: Any) -> bool | None:
    """A true/false value says so; any other value says nothing."""
    return value if isinstance(value, bool) else None


def positive(value: Any) -> bool | None:
    """A number above 0 says yes, one at or below 0 no; a value that is no number says
    nothing (a number of speculative steps; an acceptance-length gauge)."""
    try:
        return float(value) > 0
    except (TypeError, ValueError):
        return None


def true_means_off(value: Any) -> bool | None:
    """``True`` says the mechanism was turned off (``disable_cuda_graph``); any other value
    says nothing."""
    return False if value is True else None


def unless_text(word: str) -> Callable[[Any], bool | None]:
    """A reader: a text value says set up unless it is ``word`` (``disabled``: SGLang's
    ``cuda_graph_config.decode.backend``); a value that is not text says nothing."""
    def read(value: Any) -> bool | None:
        return value != word if isinstance(value, str) else None

    return read


def unless_none(value: Any) -> bool | None:
    """An enum as server info writes it (``"NONE"``, ``"CUDAGraphMode.NONE"``, ``0``,
    ``[2, 0]``: vLLM's ``cudagraph_mode``): set up unless it names NONE or is zero; no
    value says nothing."""
    if value is None:
        return None
    text = str(value).upper()
    return not (text.endswith("NONE") or text in ("0", "[0, 0]"))


@dataclass(frozen=True)
class InfoField:
    """Start-up evidence: a field of the server-info JSON (a dotted path);
    ``set_up(value)`` says whether the mechanism was set up (True/False), or None
    when the value says nothing: a preset names one of this module's readers
    (:func:`truthy`, :func:`as_bool`, :func:`positive`, :func:`true_means_off`,
    :func:`unless_text`, :func:`unless_none`). ``says`` is added to the evidence text."""

    path: str
    set_up: Callable[[Any], bool | None]
    says: str = ""

    def read(self, w: Window) -> _Reading | None:
        if not isinstance(w.server_info, Mapping):
            return None
        try:
            value = lookup(w.server_info, self.path)
        except (KeyError, IndexError, TypeError, ValueError):
            return None
        verdict = self.set_up(value)
        if verdict is None:
            return None
        return _Reading(bool(verdict), f"server info {self.path} = {value!r}{self.says}")

    def describe(self) -> str:
        return f"server info {self.path}"


@dataclass(frozen=True)
class StartupLine:
    """Start-up evidence: a line of the boot log printed before the window. ``set_up``
    matches a line that says the mechanism was prepared (``Capture ... graph end``),
    ``not_set_up`` one that says it was turned off; the last match wins."""

    set_up: str = ""
    not_set_up: str = ""

    def read(self, w: Window) -> _Reading | None:
        last: tuple[int, bool, str] | None = None
        for pattern, yes in ((self.set_up, True), (self.not_set_up, False)):
            if not pattern:
                continue
            for m in re.finditer(pattern, w.startup_log, re.MULTILINE):
                if last is None or m.start() > last[0]:
                    start = w.startup_log.rfind("\n", 0, m.start()) + 1
                    line = w.startup_log[start:].split("\n", 1)[0]
                    last = (m.start(), yes, line.strip()[:160])
        if last is None:
            return None
        return _Reading(last[1], f"log at start: {last[2]!r}")

    def describe(self) -> str:
        return "log lines at start"


def _truthy(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value.strip().lower() not in ("", "false", "off", "no", "none", "0", "disabled")
    return value is not None


@dataclass(frozen=True)
class Mechanism:
    """A mechanism that setting one of ``flags`` (canonical names) claims to engage.

    ``claims(value)`` says whether a flag's value claims it (default: any value but
    false/off/none/disabled); ``evidence`` is the window evidence, read in order
    (the first that answers decides); ``startup`` the start-up evidence, likewise;
    ``source`` cites where the evidence comes from (the engine's code at a release,
    or a real server's output). ``default_on``: the engine runs it unless told not
    to, so every boot is checked unless one of ``off_flags`` is set (truthy) or a
    claiming flag has a value that does not claim it (``--cuda-graph-backend-decode
    disabled``)."""

    name: str
    flags: tuple[str, ...]
    evidence: tuple[Any, ...]
    source: str
    startup: tuple[Any, ...] = ()
    claims: Callable[[Any], bool] = field(default=lambda v: _truthy(v))
    default_on: bool = False
    off_flags: tuple[str, ...] = ()

    def claimed_by(self, flags: Mapping[str, Any]) -> tuple[str, ...]:
        """The flags whose values claim the mechanism."""
        return tuple(f for f in self.flags if f in flags and flags[f] is not None and self.claims(flags[f]))

    def applies(self, flags: Mapping[str, Any]) -> bool:
        """Is a boot with these canonical ``flags`` checked for this mechanism? Not when
        an off-flag is set; one on by default, unless a claiming flag's value turns it
        off; any other, when a flag claims it."""
        if any(f in flags and _truthy(flags[f]) for f in self.off_flags):
            return False
        if self.default_on:
            return not any(f in flags and flags[f] is not None and not self.claims(flags[f]) for f in self.flags)
        return bool(self.claimed_by(flags))


@dataclass(frozen=True)
class MechanismResult:
    """One mechanism's answer for one boot (:data:`STATES`). ``flags`` are the flags
    that claimed it (empty when it was checked because it is on by default);
    ``evidence`` one sentence, made of ``window`` (what the window showed) and
    ``startup`` (what start-up showed), each None when that kind gave nothing;
    ``set_up`` what the start-up evidence said (None: it said nothing)."""

    name: str
    flags: tuple[str, ...]
    state: str
    evidence: str
    source: str
    on_by_default: bool = False
    window: str | None = None
    startup: str | None = None
    set_up: bool | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "flags": list(self.flags), "on_by_default": self.on_by_default,
                "state": self.state, "evidence": self.evidence, "window": self.window, "startup": self.startup,
                "set_up": self.set_up, "source": self.source}


def _first(probes: Sequence, w: Window) -> _Reading | None:
    for probe in probes:
        answer = probe.read(w)
        if answer is not None:
            return answer
    return None


def _judge(m: Mechanism, w: Window) -> tuple[str, str, _Reading | None, _Reading | None]:
    ran, start = _first(m.evidence, w), _first(m.startup, w)
    if ran is not None and ran.yes:
        return "engaged", ran.text + (f"; {start.text}" if start else ""), ran, start
    if ran is not None:
        if start is not None and start.yes:
            return "set_up_not_seen", f"{ran.text}; set up at start ({start.text})", ran, start
        tail = f"; not set up at start ({start.text})" if start is not None else ""
        return "not_engaged", ran.text + tail, ran, start
    tried = f" (tried: {', '.join(p.describe() for p in m.evidence)})" if m.evidence else ""
    if start is not None and not start.yes:  # never set up: there was nothing to run
        return "not_engaged", (f"not set up at start ({start.text}), so it could not run; the engine gave no "
                               f"evidence over the window{tried}"), None, start
    if start is not None:
        return "not_observable", (f"set up at start ({start.text}); the engine gives no evidence over the "
                                  f"window{tried}"), None, start
    every = ", ".join(p.describe() for p in (*m.evidence, *m.startup)) or "none declared"
    return "not_observable", f"no evidence could be read (tried: {every})", None, None


def check(mechanisms: Sequence[Mechanism], flags: Mapping[str, Any], window: Window) -> list[MechanismResult]:
    """Each mechanism the canonical ``flags`` claim (or that is on by default and not
    turned off), judged by its window evidence and its start-up evidence."""
    out = []
    for m in mechanisms:
        if not m.applies(flags):
            continue
        by = m.claimed_by(flags)
        state, evidence, ran, start = _judge(m, window)
        out.append(MechanismResult(m.name, by, state, evidence, m.source, on_by_default=not by,
                                   window=ran.text if ran else None, startup=start.text if start else None,
                                   set_up=start.yes if start else None))
    return out


def marks(results: Sequence[MechanismResult]) -> list[str]:
    """The boot's marks from its results: :data:`NOT_SEEN` for a mechanism set up and
    not seen running; :data:`NOT_ENGAGED` for one that did not run, unless it was
    only on by default and the engine said at start that it did not set it up (a
    CPU run has no CUDA graphs to miss: nothing was asked and nothing prepared)."""
    out = []
    for r in results:
        if r.state == "set_up_not_seen" and NOT_SEEN not in out:
            out.append(NOT_SEEN)
        elif r.state == "not_engaged" and NOT_ENGAGED not in out:
            if r.on_by_default and r.set_up is False:
                continue
            out.append(NOT_ENGAGED)
    return out


def summary(results: Sequence[Mapping]) -> str:
    """One line per boot: ``CUDA graphs (on by default): not engaged in the window (...)``;
    "" when nothing was checked. Reads the stored dicts (``MechanismResult.to_dict``),
    older records' ``unknown`` as not observable."""
    parts = []
    for r in results:
        state = r.get("state")
        word = {**WORDS, "not_engaged": "**not engaged in the window**",
                "set_up_not_seen": "**set up at start, not seen in the window**"}.get(state, WORDS["not_observable"])
        why = ", ".join(r.get("flags") or []) or ("on by default" if r.get("on_by_default") else "")
        parts.append(f"{r['name']}" + (f" ({why})" if why else "") + f": {word} ({r['evidence']})")
    return "; ".join(parts)
