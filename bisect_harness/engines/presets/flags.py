"""How a preset's YAML flags become argv, and how a flag is read back from server info.

The spellings (aliases, dashes or underscores, ``--no-KEY`` for false), positional
flags, ``{placeholder}`` substitution in argv templates, the dotted path under
which server info reports a flag and how its value is compared, the tensor
parallel degree a boot's flags ask for, and what a preset notes about a flag
across versions.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Mapping, Sequence

from bisect_harness.engines.presets.base import Preset
from bisect_harness.errors import UserError



def canonical_flag(name: str, preset: Preset) -> str:
    """The name a flag is rendered under: leading dashes dropped, underscores made
    dashes where the engine's parser expects dashes, aliases resolved.

    >>> canonical_flag("--tp", get_preset("vllm"))
    'tensor-parallel-size'
    """
    if not isinstance(name, str) or not name.strip("-").strip():
        raise UserError(f"flag name {name!r} is not a name; write flags as 'tp-size: 8'")
    key = name.lstrip("-")
    if preset.underscores_to_dashes:
        key = key.replace("_", "-")
    return preset.aliases.get(key, key)


def _scalar(flag: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise UserError(f"flag '{flag}': a list item must be a string or a number, got {type(value).__name__} "
                    f"{value!r}")


def launch_argv(template: Sequence[Any], flags: Mapping[str, Any], preset: Preset) -> list[Any]:
    """The launch template with the flags' argv: after the template, except that
    positional flags go right after the template element ``preset.positional_after``
    where the template has it.

    >>> launch_argv(["vllm", "serve", "--port", "{port}"], {"model": "/m", "served-model-name": "k"},
    ...             get_preset("vllm"))
    ['vllm', 'serve', '/m', '--port', '{port}', '--served-model-name', 'k']
    """
    argv = flags_to_argv(flags, preset)
    template = list(template)
    if preset.positional_after is None or preset.positional_after not in template:
        return template + argv
    positional = [] if not preset.positional_flags else argv[:_n_positional(flags, preset)]
    at = template.index(preset.positional_after) + 1
    return template[:at] + positional + template[at:] + argv[len(positional):]


def _n_positional(flags: Mapping[str, Any], preset: Preset) -> int:
    return sum(1 for raw, v in flags.items() if v is not None and canonical_flag(raw, preset) in preset.positional_flags)


def flags_to_argv(flags: Mapping[str, Any], preset: Preset) -> list[str]:
    """Turn YAML flags into argv elements by the preset's conventions.

    ``key: value`` -> ``--key value``; ``true`` -> ``--key``; ``false`` -> omitted,
    or ``--no-key`` for engines whose booleans are BooleanOptionalAction (vLLM);
    a list -> ``--key a b``; a mapping -> ``--key <compact json>`` as one element;
    ``None`` -> omitted. Flags named in ``preset.positional_flags`` come first, as
    bare arguments. Two spellings of one flag (``tp`` and ``tp-size``) are an error.
    Order otherwise follows the mapping, so argv is stable for equal configs.
    """
    if not isinstance(flags, Mapping):
        raise UserError(f"flags must be a mapping of name to value, got {type(flags).__name__}")
    seen: dict[str, str] = {}
    positional: list[str] = []
    argv: list[str] = []
    for raw, value in flags.items():
        key = canonical_flag(raw, preset)
        if key in seen:
            raise UserError(f"flags '{seen[key]}' and '{raw}' both set --{key}; keep one")
        seen[key] = str(raw)
        if value is None:
            continue
        if key in preset.positional_flags:
            if isinstance(value, (bool, list, tuple, Mapping)):
                raise UserError(f"flag '{raw}' is passed to {preset.name} as a positional argument "
                                f"and needs a single value, got {value!r}")
            positional.append(_scalar(key, value))
            continue
        opt = f"--{key}"
        if isinstance(value, bool):
            if value:
                argv.append(opt)
            elif preset.false_style == "no-prefix":
                argv.append(f"--no-{key}")
        elif isinstance(value, Mapping):
            argv += [opt, json.dumps(value, separators=(",", ":"), default=str)]
        elif isinstance(value, (list, tuple)):
            if not value:
                raise UserError(f"flag '{raw}' is an empty list; give at least one value or remove it")
            argv += [opt] + [_scalar(key, v) for v in value]
        elif isinstance(value, (str, int, float)):
            argv += [opt, str(value)]
        else:
            raise UserError(f"flag '{raw}' has a value of type {type(value).__name__} ({value!r}); "
                            "use a string, number, boolean, list or mapping")
    return positional + argv


# ``{name}`` is a placeholder; ``{{name}}`` is the literal text ``{name}``. Braces
# in other shapes (JSON such as ``{"k": {"a": 1}}``) are left alone, so a
# mapping flag's JSON passes through untouched.
_PLACEHOLDER = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


LOOPBACK = "127.0.0.1"


def placeholder_values(*, port, worktree, python: str, spec_dir) -> dict[str, str]:
    """The values of ``{port}``, ``{host}``, ``{python}``, ``{worktree}`` and ``{spec_dir}``
    for :func:`render_argv`: a boot's, or the plan's for a dry run. Without a worktree
    (no repository) ``{worktree}`` is the spec's folder."""
    return {"port": str(port), "host": LOOPBACK, "python": python,
            "worktree": str(worktree if worktree is not None else spec_dir), "spec_dir": str(spec_dir)}


def render_argv(template: Iterable[Any], **values: Any) -> list[str]:
    """Substitute ``{name}`` placeholders in each argv element; never a shell.

    An element stays one argv element whatever the value contains. A placeholder
    with no value is a UserError naming it and the known ones.

    >>> render_argv(["serve", "--port", "{port}", '{"a": {"b": 1}}'], port=8000)
    ['serve', '--port', '8000', '{"a": {"b": 1}}']
    """
    if isinstance(template, (str, bytes)):
        raise UserError(f"an argv template must be a list of strings, got the string {template!r}")
    out = []
    for element in template:
        if not isinstance(element, (str, int, float)) or isinstance(element, bool):
            raise UserError(f"argv element {element!r} must be a string or a number")
        text = str(element)

        def sub(m: re.Match) -> str:
            if m.group(1) is not None:
                return "{" + m.group(1) + "}"
            name = m.group(2)
            if name not in values:
                known = ", ".join("{" + k + "}" for k in sorted(values)) or "none"
                raise UserError(f"unknown placeholder {{{name}}} in argv element {text!r}; known: {known}. "
                                f"Write {{{{{name}}}}} for the literal text {{{name}}}")
            return str(values[name])

        out.append(_PLACEHOLDER.sub(sub, text))
    return out


def server_info_candidates(preset: Preset, override: str | Sequence[str] | None = None) -> tuple[str, ...]:
    """The server-info paths to try, in order: ``override`` (one path or a list;
    an empty list turns server info off) or else the preset's."""
    paths = preset.server_info_paths if override is None else (
        (override,) if isinstance(override, str) else tuple(override))
    for p in paths:
        if not isinstance(p, str) or not p.startswith("/"):
            raise UserError(f"server-info path {p!r} must be a string starting with '/', e.g. /server_info")
    return tuple(paths)


#: canonical spellings of the tensor parallel degree
TP_FLAGS = ("tp", "tp-size", "tensor-parallel-size")


def devices_needed(flags: Mapping[str, object], preset: Preset) -> int:
    """GPUs one boot with ``flags`` takes: its tensor parallel degree (``tp`` in any of
    the preset's spellings), else 1."""
    for flag, value in flags.items():
        if canonical_flag(flag, preset) in TP_FLAGS:
            try:
                return max(1, int(value))
            except (TypeError, ValueError):
                return 1
    return 1


def info_key(flag: str, preset: Preset) -> str | None:
    """The dotted path under which the server-info JSON reports ``flag``, or None
    when this preset cannot tell (the flag is then not checked).

    >>> info_key("tp", get_preset("sglang"))
    'tp_size'
    >>> info_key("-tp", get_preset("vllm"))
    'vllm_config.parallel_config.tensor_parallel_size'
    """
    key = canonical_flag(flag, preset)
    if key in preset.info_keys:
        return preset.info_keys[key]
    if preset.info_key_rule == "underscore":
        return key.replace("-", "_")
    return None


def compare_mode(flag: str, preset: Preset) -> str:
    """How ``flag``'s requested value is compared with the reported one (:data:`COMPARE_MODES`).

    >>> compare_mode("dtype", get_preset("vllm")), compare_mode("tp", get_preset("vllm"))
    ('dtype', 'equal')
    """
    return preset.info_compare.get(canonical_flag(flag, preset), "equal")


def flag_note(option: str, preset: Preset) -> str:
    """What the preset knows about ``option`` (``--name`` or ``name``) changing across versions, or ""."""
    return preset.flag_notes.get(canonical_flag(option, preset), "")


#: ``--name`` in a message or a help text: starts a word, letters/digits/dashes/underscores/dots after
OPTION_NAME = re.compile(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9_.\-]*)")


def notes_for(text: str, preset) -> list[str]:
    """The preset's notes (``Preset.flag_notes``) on every ``--option`` named in ``text``."""
    notes = []
    for opt in OPTION_NAME.findall(text or ""):
        note = flag_note(opt.rstrip(".,:;'\""), preset)
        if note and note not in notes:
            notes.append(note)
    return notes
