"""Secrets never leave the process.

An environment variable or launch flag whose name looks secret (it contains
TOKEN, KEY, SECRET, PASSWORD or CREDENTIAL, or the spec lists it under
``defaults.secret_names``) has its value replaced, wherever the harness stores
or prints it, by a marker and a short hash::

    >>> mask("hf_abc123")
    '<secret sha256:...>'

The hash keeps two configs that differ only in a secret apart (in the ledger,
the journal, a dry-run) without showing either value. The engine process still
receives the real value: redaction is applied to copies, at the places where
data leaves the process (ledger flushes, the journal, ``--dry-run``, ``doctor``,
error messages).

Loading a spec registers its secret values and extra names here
(:func:`register`), so the ledger and the error boundary can redact text that
mentions a value without knowing where it came from (a server's cmdline in an
env report, an error naming its argv). Values shorter than
:data:`MIN_TEXT_LEN` characters are masked where their name is known (env and
flag mappings, argv) but not searched for in free text, where they would match
unrelated words and numbers.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["WORDS", "MIN_TEXT_LEN", "is_secret", "mask", "redact_env", "redact_argv", "redact_text",
           "redact_obj", "redact_yaml", "register", "known_values", "known_names", "spec_secret_values",
           "argv_secret_values", "url_secret_values"]

#: a name containing one of these (case-insensitive) is secret
WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
# plural forms that still name a secret; TOKENS and KEYS do not (max_num_batched_tokens, sort_keys)
_PLURAL = ("SECRET", "PASSWORD", "CREDENTIAL")
#: free text is searched only for secret values at least this long
MIN_TEXT_LEN = 4

_values: set[str] = set()
_names: set[str] = set()


def _norm(name: str) -> str:
    return str(name).lstrip("-").upper().replace("-", "_")


def is_secret(name: str, extra: Iterable[str] = ()) -> bool:
    """Does this env or flag name look secret? ``extra``: more names (exact, any case).

    The name is split at ``_``, ``-`` and other punctuation; it is secret when a
    part ends with one of :data:`WORDS` (``HF_TOKEN``, ``--api-key``, ``APIKEY``)
    or is a plural of SECRET, PASSWORD or CREDENTIAL. ``max_tokens`` is not.
    """
    n = _norm(name)
    parts = [p for p in re.split(r"[^A-Z0-9]+", n) if p]
    if any(p.endswith(WORDS) or p.rstrip("S") in _PLURAL for p in parts):
        return True
    return n in {_norm(e) for e in (*extra, *_names)}


_MARKER = re.compile(r"<secret sha256:[0-9a-f]{8}>")


def _is_marker(v: Any) -> bool:
    return isinstance(v, str) and _MARKER.fullmatch(v) is not None


def mask(value: Any) -> str:
    """The marker that stands for ``value``: the same value, the same marker."""
    digest = hashlib.sha256(str(value).encode()).hexdigest()[:8]
    return f"<secret sha256:{digest}>"


def redact_env(mapping: Mapping[str, Any], extra: Iterable[str] = ()) -> dict[str, Any]:
    """A copy of ``mapping`` with every secret-named entry's value masked."""
    extra = tuple(extra)
    return {k: (mask(v) if is_secret(k, extra) and _maskable(v) else v) for k, v in mapping.items()}


def _maskable(v: Any) -> bool:
    """A value worth hiding: not None, not a switch (``api-key: true`` hides nothing), not a marker."""
    return v is not None and not isinstance(v, bool) and not _is_marker(v)


def redact_argv(argv: Sequence[str], flag_names: Iterable[str] = (), extra: Iterable[str] = ()) -> list[str]:
    """A copy of ``argv`` with the value after each secret flag masked (``--x V`` and ``--x=V``).

    A flag is secret when its name looks secret or is in ``flag_names``.
    """
    named = {_norm(f) for f in flag_names}
    extra = tuple(extra)

    def secret(flag: str) -> bool:
        return flag.startswith("-") and (is_secret(flag, extra) or _norm(flag) in named)

    out: list[str] = []
    hide_next = False
    for a in argv:
        a = str(a)
        if hide_next:
            out.append(a if _is_marker(a) else mask(a))
            hide_next = False
            continue
        if a.startswith("-") and "=" in a and secret(a.split("=", 1)[0]):
            flag, value = a.split("=", 1)
            out.append(a if _is_marker(value) else f"{flag}={mask(value)}")
            continue
        out.append(a)
        hide_next = secret(a) and "=" not in a
    return out


def redact_text(text: str, values: Iterable[str] | None = None) -> str:
    """``text`` with every occurrence of each secret value replaced by its marker.

    ``values`` default to the registered ones (:func:`register`); values shorter
    than :data:`MIN_TEXT_LEN` are left alone in free text.
    """
    vals = _values if values is None else {str(v) for v in values}
    for v in sorted((v for v in vals if len(v) >= MIN_TEXT_LEN), key=len, reverse=True):
        if v in text:
            text = text.replace(v, mask(v))
    return text


def redact_obj(obj: Any, values: Iterable[str] | None = None) -> Any:
    """A JSON-like value (dicts, lists, strings) with registered secret values
    masked inside every string. Returns a copy when something changed, ``obj``
    itself otherwise. (Keys are not judged by name here: stored dicts hold keys
    like ``max_tokens``; env and flag mappings go through :func:`redact_env`.)"""
    vals = _values if values is None else {str(v) for v in values}
    if isinstance(obj, str):
        return redact_text(obj, vals)
    if isinstance(obj, Mapping):
        out = {k: redact_obj(v, vals) for k, v in obj.items()}
        return out if out != obj else obj
    if isinstance(obj, (list, tuple)):
        out_l = [redact_obj(v, vals) for v in obj]
        return (type(obj)(out_l) if isinstance(obj, tuple) else out_l) if out_l != list(obj) else obj
    return obj


def register(values: Iterable[str] = (), names: Iterable[str] = ()) -> None:
    """Remember secret values and extra secret names for the rest of this process."""
    _values.update(str(v) for v in values if v is not None and str(v) != "")
    _names.update(_norm(n) for n in names)


def known_values() -> frozenset[str]:
    return frozenset(_values)


def known_names() -> frozenset[str]:
    return frozenset(_names)


def spec_secret_values(env_maps: Iterable[Mapping[str, Any]], flag_maps: Iterable[Mapping[str, Any]],
                       extra: Iterable[str] = ()) -> set[str]:
    """The values of every secret-named entry of these env and flag mappings."""
    extra = tuple(extra)
    out: set[str] = set()
    for m in (*env_maps, *flag_maps):
        for k, v in m.items():
            if is_secret(k, extra) and v is not None and not isinstance(v, bool):
                out.add(str(v))
    return out


def argv_secret_values(argv: Sequence[str], extra: Iterable[str] = ()) -> set[str]:
    """The values that follow secret-named flags in an argv (``--api-key V``,
    ``--api-key=V``): a literal key written into ``engine.launch`` or ``build``."""
    masked = redact_argv(argv, extra=extra)
    out: set[str] = set()
    for raw, shown in zip(argv, masked):
        raw = str(raw)
        if raw != shown:
            out.add(raw.split("=", 1)[1] if raw.startswith("-") and "=" in raw and "=" in shown else raw)
    return out


def url_secret_values(url: str | None) -> set[str]:
    """A URL's credentials (``http://user:pw@host``): the password, and ``user:pw``
    as it appears in the URL, so neither is stored or shown."""
    if not url:
        return set()
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return set()
    out: set[str] = set()
    if parts.password:
        out.add(parts.password)
        userinfo = parts.netloc.rsplit("@", 1)[0]
        out.add(userinfo)
    return out


# spec keys whose names look secret but whose values are names, not secrets
_SPEC_KEYS = {"API_KEY_ENV", "SECRET_NAMES"}
_YAML_LINE = re.compile(r"^(\s*(?:-\s+)?[\"']?)([A-Za-z0-9_.\-]+)([\"']?\s*:[ \t]+)(\S.*?)([ \t]+#.*)?$")


def redact_yaml(text: str, extra: Iterable[str] = (), values: Iterable[str] | None = None) -> str:
    """A hypotheses file's text with the value of each secret-named key masked
    (``HF_TOKEN: hf_x`` -> ``HF_TOKEN: <secret sha256:...>``, whatever its length),
    then every registered value (:func:`redact_text`)."""
    extra = tuple(extra)
    lines = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        m = _YAML_LINE.match(body)
        if m:
            name = m.group(2).rsplit(".", 1)[-1]
            if is_secret(name, extra) and _norm(name) not in _SPEC_KEYS and m.group(4) not in ("|", ">"):
                value = m.group(4).strip().strip("\"'")
                if _is_marker(value):
                    lines.append(line)
                    continue
                line = f"{m.group(1)}{m.group(2)}{m.group(3)}{mask(value)}{m.group(5) or ''}" + line[len(body):]
        lines.append(line)
    return redact_text("".join(lines), values)


def redact_row(obj: Any) -> None:
    """Mask secrets in an ORM row's columns in place (the row, never the caller's
    objects: changed values are new lists and dicts). ``env`` and ``flags``
    mappings by name, ``argv`` lists by flag name, ``spec_text`` by key name, and
    every registered value in any string, list or dict column."""
    from sqlalchemy import inspect as sa_inspect

    try:
        attrs = sa_inspect(obj).mapper.column_attrs
    except Exception:  # not a mapped row
        return
    for attr in attrs:
        name = attr.key
        value = getattr(obj, name, None)
        if value is None or isinstance(value, (int, float, bool)):
            continue
        new = value
        if name in ("env", "flags") and isinstance(value, Mapping):
            new = redact_env(value)
        elif name == "argv" and isinstance(value, (list, tuple)):
            new = redact_argv(value)
        elif name == "spec_text" and isinstance(value, str):
            new = redact_yaml(value)
        if not _values and new is value:
            continue
        new = redact_obj(new)
        if new is not value and new != value:
            setattr(obj, name, new)
