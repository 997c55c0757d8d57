"""hypotheses.yaml: the one reader of the file.

``load_spec(path)`` parses, validates and freezes the file into dataclasses; every
error names the key path and the line it came from, and says what to do. Nothing
else in the harness reads the YAML again. The format is documented in
``docs/hypotheses-format.md``.

The YAML and its lines are read by ``spec.reader``, each section by
``spec.sections``, into the types of ``spec.types``; here the sections are put
together, checked against each other, and the file's secrets registered.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bisect_harness.errors import SpecError
from bisect_harness.model import CLIENT_METRICS
from bisect_harness.spec.reader import _Doc, _Reader
from bisect_harness.spec.sections import (_TOP, FileBench, _backend, _benchmark, _defaults, _engine, _hypotheses, _limits,
                                          _sweep, _tool_fits)
from bisect_harness.spec.types import Defaults, EngineSpec, Spec

__all__ = ["SPEC_VERSION", "load_spec", "parse_spec"]

SPEC_VERSION = 1


def load_spec(path: str | Path) -> Spec:
    """Read, validate and freeze a hypotheses file. Raises ``SpecError`` naming key and line."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(f"no such file: {path}. Pass the path of a hypotheses.yaml "
                        "(see docs/hypotheses-format.md)") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read {path}: {exc}") from None
    return parse_spec(text, path)


def parse_spec(text: str, path: Path) -> Spec:
    doc = _Doc(text, str(path))
    r = _Reader(doc)
    top = r.mapping(doc.data, "", _TOP, required=("engine", "hypotheses"))
    version = top.get("version", SPEC_VERSION)
    if type(version) is not int or version != SPEC_VERSION:  # true and 1.0 equal 1 in Python: not here
        raise doc.error("version", f"this harness reads version {SPEC_VERSION} files, got {version!r}; "
                        "upgrade bisect-harness or rewrite the file")
    engine = _engine(r, top["engine"], path.parent)
    bench = _benchmark(r, top.get("benchmark"), path.parent)
    if top.get("limits") is not None:
        bench = replace(bench, limits=_limits(r, top["limits"]))
    defaults = _defaults(r, top.get("defaults"))
    metrics = dict(CLIENT_METRICS)
    for s in engine.sources:  # the file's and the preset's own
        metrics[s.metric.name] = s.metric
    _tool_fits(r, bench, engine)
    from bisect_harness.engines import presets

    has_repo = engine.base_url is None and (
        engine.repo is not None or presets.get_preset(engine.preset).has_default_repo)
    written = tuple(top.get("benchmark") or ())
    hyps = _hypotheses(r, top["hypotheses"], metrics, has_repo=has_repo, attached=engine.base_url is not None,
                       has_releases=engine.releases is not None,
                       file_bench=FileBench(bench, _sweep(r, top.get("benchmark"), bench), written))
    _check_when(engine, hyps, str(path))
    _register_secrets(engine, defaults, hyps)
    backend = _backend(r, top.get("backend"))
    return Spec(path=path.resolve(), text=text, engine=engine, benchmark=bench, defaults=defaults,
                hypotheses=hyps, family_size=len(hyps), backend=backend)



def _register_secrets(engine: EngineSpec, defaults: Defaults, hyps) -> None:
    """Tell secrets.py this file's secret values, so nothing stored or shown carries them."""
    from bisect_harness import secrets

    arms = [a for h in hyps for a in (h.baseline, h.treatment)]
    values = secrets.spec_secret_values([engine.env, *(a.env for a in arms)],
                                        [engine.flags, *(a.flags for a in arms)], defaults.secret_names)
    for argv in (engine.launch, *(engine.build or ())):  # a literal --api-key written into a command
        values |= secrets.argv_secret_values(argv or (), defaults.secret_names)
    for url in (engine.base_url, *(a.base_url for a in arms)):  # http://user:password@host
        values |= secrets.url_secret_values(url)
    secrets.register(values, defaults.secret_names)



def _check_when(engine: EngineSpec, hyps, file: str) -> None:
    """A hypothesis on a metric whose source's ``when`` excludes one of its arms could never be
    judged; nor one on a derived metric where one of its inputs is not collected."""
    from bisect_harness.engines import presets
    from bisect_harness.measure import sources

    preset = presets.get_preset(engine.preset)
    by_name = {s.name: s for s in engine.metrics}
    canonical = lambda f: presets.canonical_flag(f, preset)  # noqa: E731
    for h in hyps:
        source = by_name.get(h.metric)
        if source is None:
            continue
        for side, arm in (("baseline", h.baseline), ("treatment", h.treatment)):
            flags = {**engine.flags, **arm.flags}
            collected, _ = sources.applicable(engine.metrics, flags, canonical)
            if source in collected:
                continue
            where = [f"when: {dict(source.when)} holds"] if source.when and not source.applies(flags, canonical) else []
            where += [f"its input {n!r} is" for n in getattr(source, "inputs", ()) if by_name[n] not in collected]
            raise SpecError(f"hypothesis {h.id}: metric {h.metric!r} is collected only where "
                            f"{' and '.join(where)}, and the {side} arm does not match it; compare "
                            "two arms that both match, or pick another metric", key="metric", line=h.line,
                            file=file)
