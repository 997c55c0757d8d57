"""The :class:`Preset` type and the registry of presets by name (:data:`PRESETS`).

What a preset is (its fields, checked when it is made) and how one is found
(:func:`get_preset`: an unknown name is a UserError that lists the known ones).
The presets themselves are defined one engine a module beside this one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Mapping, Sequence

from bisect_harness.engines.profilers import PROFILERS
from bisect_harness.errors import UserError
from bisect_harness.kinds import Registry

__all__ = ["COMPARE_MODES", "FALSE_STYLES", "PRESETS", "Preset", "get_preset", "register_preset"]


#: How a requested flag value is compared with the value the server reports:
#: ``equal`` (type-tolerant equality), ``dtype`` (``torch.bfloat16`` == ``bfloat16``
#: == ``bf16``), ``subset`` (a requested mapping's keys must be reported with equal
#: values; the server may report more keys, as vLLM's speculative config does),
#: ``float32`` (equal as C floats: llama.cpp reports ``--temp 0.8`` as
#: ``0.800000011920929``), ``one_of`` (one of the requested names is reported:
#: llama.cpp's ``--alias b,a`` as ``a``), ``slot_context`` (the context of one slot,
#: reported beside the slot count, against the asked total: llama.cpp's ``--ctx-size``;
#: :mod:`bisect_harness.observe.provenance.slot_context`).
COMPARE_MODES = ("equal", "dtype", "subset", "float32", "one_of", "slot_context")

#: How a YAML ``false`` becomes argv: ``"omit"`` (store_true engines) or
#: ``"no-prefix"`` (``--no-KEY``, argparse.BooleanOptionalAction engines).
FALSE_STYLES = ("omit", "no-prefix")


@dataclass(frozen=True)
class Preset:
    """What the harness knows about one kind of engine.

    ``launch`` and ``build`` are argv templates (placeholders ``{python}``,
    ``{port}``, ``{host}``, ``{worktree}``, ``{spec_dir}``); an empty ``launch``
    means the hypotheses file must give ``engine.launch``.
    ``positional_flags`` name flags whose value is passed as a bare argument, first
    among the flags (vLLM's model); with ``positional_after``, right after that
    element of the launch template instead (vLLM 0.33 refuses ``--served-model-name``
    unless the model comes right after ``serve``); otherwise the launch template must
    end with an option that takes exactly one value (``--port {port}``).
    ``aliases`` maps alternative YAML spellings to the canonical flag name.
    ``info_keys`` maps a canonical flag to its dotted path in the server-info
    JSON; flags not listed map by ``info_key_rule``: ``"underscore"`` (dashes
    become underscores, the argparse dest) or ``None`` (not checkable).
    ``info_compare`` maps a canonical flag to how its value is compared with the
    reported one (:data:`COMPARE_MODES`; default ``equal``).
    ``help_args`` are appended to the launch argv to make the engine print every
    option it accepts (``harness run --dry-run --check-flags``).
    ``flag_notes`` maps a canonical flag to what changed about it across versions
    (shown when a commit refuses it).
    ``env`` is a base environment the preset needs (under the file's own env).
    ``health_request_timeout_s`` bounds one readiness probe (SGLang's probe runs a
    generation); ``settle_s`` is a pause after the probe first passes and before
    the first request, for warmup the server does on its own after a launch (an
    attached server, ``engine.base_url``, is already running: no pause).
    ``mechanisms`` are the mechanisms well-known flags claim to engage (and those the
    engine runs by default, with the flags that turn them off), each with the
    evidence this engine gives (:mod:`bisect_harness.observe.mechanisms`): what moves
    over the measured window (counters per mode, gauges, log lines) and what start-up
    says was set up. A boot they apply to is judged on the window around its samples:
    engaged, not engaged (marked ``mechanism_not_engaged``), set up at start and not
    seen (marked ``mechanism_not_seen``), or not observable.
    ``source_notes`` say what a metric source's miss means on this engine (keys
    ``metrics``: ``/metrics`` did not answer; ``last_chunk``: a field missing from a
    stream's last chunk), so a boot's source problems give this engine's advice.
    ``profiler`` names how the engine is profiled (a kind of
    :mod:`bisect_harness.engines.profilers`: ``sglang``, ``vllm``, ``demo``, or ``none``,
    which answers a profiled sample with "no profiler endpoint").
    ``optional_flags`` are bare options of the preset's own ``launch`` that older builds
    of the engine may not have (llama.cpp's ``--metrics``): where the file keeps the
    preset's launch, each boot reads the build's help first and launches without those it
    does not name, saying so (:mod:`bisect_harness.engines.preset_flags`).
    ``sources`` are metric sources every boot of the engine collects besides the file's
    ``engine.metrics`` (vLLM's prefix-cache counters, read around each sample); a file's
    source of the same name takes the place of the preset's (:meth:`metric_sources`). They
    read what ran and change nothing of it, so they are no part of a config's key.
    ``description`` is the one line :meth:`describe` shows (the dry-run, the
    unknown-preset error).
    """

    name: str
    launch: tuple[str, ...] = ()
    build: tuple[str, ...] | None = None
    health_path: str = "/health"
    ready_timeout_s: float = 300.0
    health_request_timeout_s: float = 5.0
    settle_s: float = 0.0
    server_info_paths: tuple[str, ...] = ()
    metrics_path: str = "/metrics"
    false_style: str = "omit"
    underscores_to_dashes: bool = False
    aliases: Mapping[str, str] = field(default_factory=dict)
    positional_flags: tuple[str, ...] = ()
    positional_after: str | None = None
    info_keys: Mapping[str, str] = field(default_factory=dict)
    info_key_rule: str | None = "underscore"
    info_compare: Mapping[str, str] = field(default_factory=dict)
    help_args: tuple[str, ...] = ("--help",)
    optional_flags: tuple[str, ...] = ()
    flag_notes: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    mechanisms: tuple = ()
    source_notes: Mapping[str, str] = field(default_factory=dict)
    profiler: str = "none"
    sources: tuple = ()  # measure.sources.MetricSource each
    description: str = ""

    #: True when :meth:`default_repo` can make the engine's repository, so a file
    #: may leave ``engine.repo`` out and still name commits.
    has_default_repo: ClassVar[bool] = False

    def __post_init__(self):
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"a preset needs a name, got {self.name!r}")
        if self.false_style not in FALSE_STYLES:
            raise ValueError(f"false_style must be one of {FALSE_STYLES}, got {self.false_style!r}")
        bad = {k: v for k, v in self.info_compare.items() if v not in COMPARE_MODES}
        if bad:
            raise ValueError(f"info_compare modes must be one of {COMPARE_MODES}, got {bad}")
        stray = [f for f in self.optional_flags if f not in self.launch]
        if stray:
            raise ValueError(f"optional_flags must be options of the preset's launch, got {stray}")
        if self.profiler not in PROFILERS:
            raise ValueError(f"profiler must be one of {sorted(PROFILERS)}, got {self.profiler!r}")

    def metric_sources(self, declared: Sequence) -> tuple:
        """The sources a boot collects: ``declared`` (the file's ``engine.metrics``), then this
        preset's own whose names ``declared`` does not use."""
        names = {s.name for s in declared}
        return tuple(declared) + tuple(s for s in self.sources if s.name not in names)

    def describe(self) -> str:
        """One line: the preset's name and what it launches and probes."""
        repo = "; makes its own repository when engine.repo is left out" if self.has_default_repo else ""
        return f"{self.name} ({self.description or 'no description'}{repo})"

    def default_repo(self, cache_dir: Path) -> Path | None:
        """The engine's repository when the file names none (``engine.repo``), made
        in ``cache_dir`` if needed; None when this preset has no repository of its own."""
        return None



#: The known presets, by name: a read-only registry, filled by :func:`register_preset`
#: as each preset is defined.
PRESETS: Registry[Preset] = Registry("engine preset")


def register_preset(preset: Preset) -> Preset:
    """Make ``preset`` known by its name (``engine.preset``); a second preset under
    one name is an error."""
    if not isinstance(preset, Preset):
        raise TypeError(f"register_preset takes a Preset, got {type(preset).__name__}")
    return PRESETS.add(preset)



def get_preset(name: str) -> Preset:
    """The preset called ``name``; a UserError naming the known ones otherwise."""
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise UserError(f"unknown engine preset {name!r}; known presets: {', '.join(sorted(PRESETS))}. "
                        "Use 'openai' with engine.launch for any other OpenAI-compatible server") from None
