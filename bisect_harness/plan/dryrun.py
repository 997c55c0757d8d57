"""``harness run --dry-run``: the plan, printed, with nothing booted.

Besides the configs and their argv, it says what every boot will ask of the server:
the load points it measures (each in words: the loop, the arrivals, the lengths, how
long a sample lasts, where the prompts come from) and the requests each point needs
a boot (samples x requests), the SLO and the capacity search, and each curve with its
points.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from bisect_harness.decide.design import ANALYSES
from bisect_harness.model import BenchmarkSpec
from bisect_harness.workload import Dataset, LoadPoint, MultiTurn, SharedPrefix
from bisect_harness.engines.checkout import CHECKOUT_MODES
from bisect_harness.engines.presets import get_preset, notes_for
from bisect_harness.plan.flag_check import check_plan_flags
from bisect_harness.spec import Spec
from bisect_harness.places import default_cache_dir
from bisect_harness.secrets import redact_argv, redact_env
from bisect_harness.plan.build import Plan, make_plan


def describe_plan(spec: Spec, *, cache_dir: Path | None = None, check_flags: bool = False,
                  say=lambda text: None) -> tuple[str, dict]:
    """The plan of ``spec`` made as a dry run makes it (revisions resolved where the
    repository is here), then :func:`describe`."""
    plan = make_plan(spec, cache_dir=cache_dir or default_cache_dir(), resolve_if_present=True)
    return describe(plan, check_flags=check_flags, say=say)


def describe(plan: Plan, *, check_flags: bool = False, say=lambda text: None) -> tuple[str, dict]:
    """Text for people and a JSON-ready object: configs, their argv and env, boots planned.

    With ``check_flags``, every commit's launch argv is run with the preset's help
    arguments (after its worktree, environment and build, as a boot would) and each
    planned option is checked against the options that commit names; the JSON gets
    ``flag_check`` (one entry per commit), ``flags_refused`` (true when any
    config's argv would be refused), ``flags_unchecked`` (commits whose help
    could not be read, each entry's ``error`` says why) and ``builds_failed`` (commits
    whose build failed: the failure, the build log's path and its last error lines).
    Each config shows its checkout, its build's steps and the launch argv a boot runs."""
    spec, d = plan.spec, plan.spec.defaults
    repo = plan.repo  # None for an attached server or a preset without a repository
    resolvable = repo is not None and Path(repo).exists()
    lines = [f"plan for {spec.path.name}: {len(plan.hypotheses)} hypotheses, {len(plan.configs)} configs",
             f"boots per config: {d.boots_per_arm} to {d.max_boots_per_arm} (sequential), "
             f"{_samples_text(d)}, alpha {d.alpha}"]
    if d.noise_prior and ANALYSES[d.analysis].takes_prior:
        lines.append("noise prior: a hypothesis whose two configs an earlier run in the ledger compared on this host "
                     "pools the spread it saw" + (", and its first look comes at 2 rounds" if d.boots_per_arm > 2
                                                  else "") + " (defaults.noise_prior)")
    lines.append(f"engine: preset {get_preset(spec.engine.preset).describe()}")
    if repo is not None and not resolvable:
        lines.append(f"note: engine.repo {repo} does not exist here; revisions are shown as written")
    if plan.per_commit_env:
        lines.append(f"python: each commit's own environment ({{python}} in argv), a venv over {plan.base_python}")
    else:
        lines.append(f"python: {plan.base_python}" + (" (shared by every commit's build)"
                                                      if spec.engine.build and plan.repo is not None else ""))
    if repo is not None and any(c.arm.commit is not None and c.arm.release is None for c in plan.configs):
        mode = CHECKOUT_MODES[spec.engine.checkout]
        lines.append(f"checkout: {mode.name} ({mode.summary}), one per commit in the cache")
    if spec.engine.sources:  # each source (the file's, the preset's) says what it reads (MetricSource.describe)
        lines.append("metric sources:")
        lines.extend(f"  {m.describe()}" for m in spec.engine.sources)
    points = _points(spec.benchmark, spec.points, d)
    lines.extend(_points_text(spec.benchmark, points))
    configs = []
    for i, c in enumerate(plan.configs, 1):
        argv = redact_argv(plan.argv(c, port="{port}", worktree=Path("{worktree}") if c.arm.commit else None))
        req = plan.recipe(c).request
        build = [redact_argv(plan.build_argv(c, step)) for step in req.build_steps or ()]
        env, flags = redact_env(c.arm.env), redact_env(c.arm.flags)  # secrets masked (secrets.py)
        users = [h.id for h in plan.hypotheses if c.key in (h.baseline.key, h.treatment.key)]
        profiler = get_preset(spec.engine.preset).profiler if plan.profiles(c) else None
        configs.append({"key": c.key, "commit": c.arm.commit, **({"release": c.arm.release} if c.arm.release else {}),
                        "env": env, "flags": flags,
                        "argv": argv, "build": build, "preset_flags": list(req.preset_flags),
                        **({"checkout": req.checkout} if req.commit is not None and req.repo is not None else {}),
                        "boots": {"min": d.boots_per_arm, "max": d.max_boots_per_arm},
                        "hypotheses": users, "profile": profiler})
        lines.append(f"\nconfig {i} [{c.key[:10]}] used by {', '.join(users)}")
        if c.arm.release is not None:
            rel = spec.engine.releases
            lines.append(f"  release: {rel.package} {c.arm.release} ("
                         + (f"the image {rel.image.format(version=c.arm.release)}" if rel.image
                            else f"installed from {rel.index} into its own environment") + ")")
        else:
            lines.append(f"  commit: {c.arm.commit or c.arm.endpoint or '(installed server)'}")
        if c.arm.env:
            lines.append("  env:    " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())))
        if req.commit is not None and req.repo is not None:
            lines.append(f"  checkout: {req.checkout} of the commit, {{worktree}} below")
        for n, step in enumerate(build, 1):
            lines.append(f"  build{f' {n}/{len(build)}' if len(build) > 1 else ''}: " + shlex.join(step)
                         + ("  (once per commit, cached)" if n == len(build) else ""))
        lines.append("  argv:   " + shlex.join(argv))
        if req.preset_flags:
            lines.append(f"  preset flags: {' '.join(req.preset_flags)} (the preset's own: each boot reads the "
                         "build's --help first and leaves out those it does not name)")
        if profiler is not None:
            lines.append(f"  profile: one extra sample after the measured ones of a boot, profiler {profiler}"
                         + (" (no profiler endpoint: the sample is not taken)" if profiler == "none" else ""))
    hyps = []
    lines.append("")
    for h in plan.hypotheses:
        b = plan.configs.index(h.baseline) + 1
        t = plan.configs.index(h.treatment) + 1
        hyps.append({"id": h.id, "metric": h.metric.name, "expect": h.spec.expect.value,
                     "min_effect": h.spec.min_effect, "baseline": h.baseline.key, "treatment": h.treatment.key,
                     "bisect": h.spec.bisect, "explain": h.spec.explain,
                     "profile": h.spec.profile or plan.profile_all,
                     "mechanism": [{"metric": m.metric, "expect": m.expect.value, "min_effect": m.min_effect}
                                   for m in h.spec.mechanism],
                     "point": h.spec.point_label, "curve": h.spec.curve})
        lines.append(f"hypothesis {h.id}: config {b} vs config {t}, {h.metric.name} {h.spec.expect.value} "
                     f">= {h.spec.min_effect:.1%}" + (", bisect if confirmed" if h.spec.bisect else "")
                     + (", explain if confirmed" if h.spec.explain else "")
                     + "".join(f", mechanism {m.metric} {m.expect.value} >= {m.min_effect:.1%}"
                               for m in h.spec.mechanism))
    curves = _curves(plan)
    if curves:
        lines.append("curves (a verdict per point, one answer per curve):")
        lines.extend(f"  {c['curve']}: {', '.join(c['points'])}" for c in curves)
    flag_check = None
    if check_flags:
        flag_check = _check_flags(plan, lines, say)
    obj = {"spec": str(spec.path), "configs": configs, "hypotheses": hyps, "points": points, "curves": curves,
           "slo": [{"metric": t.metric, "limit": t.limit} for t in spec.benchmark.slo],
           "capacity": _capacity_json(spec.benchmark),
           "environment": {"mode": "venv" if plan.per_commit_env else "shared", "base_python": plan.base_python},
           "preset": get_preset(spec.engine.preset).describe(),
           "metric_sources": [m.describe() for m in spec.engine.sources],
           "defaults": {"boots_per_arm": d.boots_per_arm, "max_boots_per_arm": d.max_boots_per_arm,
                        "samples_per_boot": d.samples_per_boot, "max_samples_per_boot": d.max_samples_per_boot,
                        "boot_cost_s": d.boot_cost_s, "sample_cost_s": d.sample_cost_s, "alpha": d.alpha}}
    if flag_check is not None:
        obj["flag_check"] = [c.to_dict() for c in flag_check]
        obj["flags_refused"] = any(c.refused for c in flag_check)
        obj["flags_unchecked"] = [c.commit for c in flag_check if c.error]
        obj["builds_failed"] = [{"commit": c.commit, "error": c.error, "log": c.build_log,
                                 "last_errors": list(c.build_errors)} for c in flag_check if c.build_log is not None]
        obj["flags_help_failed"] = [{"commit": c.commit, "help_argv": list(c.help_argv), "error": c.error}
                                    for c in flag_check if c.help_failed]
    return "\n".join(lines), obj


def _check_flags(plan, lines: list[str], say) -> list:
    """Run each commit's help, check every planned argv against it, and add the report to ``lines``."""
    if plan.repo is not None and not Path(plan.repo).exists():
        lines.append("\nflags not checked: the engine repository is not on this machine")
        return []
    number = {c.key: i for i, c in enumerate(plan.configs, 1)}
    report = check_plan_flags(plan, say=say)
    lines.append("\nflags checked against each commit's help:")
    for c in report:
        where = c.commit[:12] if c.commit else "installed server"
        if c.error:
            lines.append(f"  {where}: not checked: {c.error}")
            if c.build_log is not None:
                lines.append(f"  {where}: build log: {c.build_log}; its last error lines:")
                lines.extend(f"    | {line}" for line in c.build_errors)
            continue
        if c.dropped:
            lines.append(f"  {where}: the preset's {' '.join(c.dropped)} not in this build's --help: its boots "
                         "launch without it")
        bad = {k: ps for k, ps in c.problems.items() if ps}
        if not bad:
            lines.append(f"  {where}: every planned flag accepted ({c.options} options in `{shlex.join(c.help_argv)}`)")
            continue
        for key, problems in bad.items():
            for p in problems:
                verdict = "NOT ACCEPTED" if p.refused else "warning"
                note = "".join(f" ({n})" for n in notes_for(p.option, plan.preset))
                lines.append(f"  {where}: config {number[key]}: {verdict}: {p}{note}")
    return report


def _samples_text(d) -> str:
    """How many samples a boot takes: fixed, or from the first count up to the most as
    node time is best spent (decide.allocation), priced as the file states or as measured."""
    if d.max_samples_per_boot <= d.samples_per_boot:
        return f"{d.samples_per_boot} samples per boot"
    priced = (f"a boot costing {d.boot_cost_s:g} s and a sample {d.sample_cost_s:g} s as stated"
              if d.boot_cost_s is not None else "costs measured from the run's boots")
    return (f"{d.samples_per_boot} to {d.max_samples_per_boot} samples per boot (later rounds as node time is "
            f"best spent: {priced})")


def _points(bench: BenchmarkSpec, points: tuple[LoadPoint, ...], d) -> list[dict]:
    """Each point every boot measures (the benchmark's one point where there is no sweep):
    its label (None for the one point), its words, and what it costs a boot."""
    out = []
    for point in points or (None,):
        at = point.apply(bench) if point is not None else bench
        item = {"label": point.label if point is not None else None, "words": point_words(at),
                "open_loop": at.open_loop, "warmup_requests": at.warmup_requests,
                "samples_per_boot": {"min": d.samples_per_boot, "max": max(d.samples_per_boot, d.max_samples_per_boot)}}
        if at.sample_seconds is None:
            item["requests_per_sample"] = at.requests_per_sample
        else:
            item["sample_seconds"] = at.sample_seconds
            if at.open_loop:  # the arrivals are drawn at the rate: the count is about rate x seconds
                item["requests_per_sample"] = round(at.request_rate * at.sample_seconds, 3)
        if "requests_per_sample" in item:
            n = item["requests_per_sample"]
            item["requests_per_boot"] = {k: round(v * n, 3) for k, v in item["samples_per_boot"].items()}
        else:  # closed loop for a time: as many requests as the server finishes
            item["seconds_per_boot"] = {k: v * at.sample_seconds for k, v in item["samples_per_boot"].items()}
        out.append(item)
    return out


def _points_text(bench: BenchmarkSpec, points: list[dict]) -> list[str]:
    lines = []
    if len(points) == 1 and points[0]["label"] is None:
        lines.append(f"load point: {points[0]['words']}")
        lines.append(f"  per boot: {_per_boot(points[0])}")
    else:
        lines.append(f"load points: every boot measures these {len(points)}, in an order drawn per boot, a warm-up "
                     "at each:")
        for p in points:
            lines.append(f"  {p['label']}: {p['words']}")
            lines.append(f"    per boot: {_per_boot(p)}")
    if bench.slo:
        lines.append("SLO: " + ", ".join(t.describe() for t in bench.slo) + " (goodput_rps: requests a second that "
                     "meet every limit)")
    if bench.capacity is not None:
        c = bench.capacity
        lines.append(f"capacity: the highest rate whose SLO holds, searched in each boot from {c.start_rps:g} req/s "
                     f"to within {c.tolerance:.0%}, trials of {c.trial_requests} requests, at most {c.max_trials} "
                     "trials")
    return lines


def _per_boot(p: dict) -> str:
    s = p["samples_per_boot"]
    samples = f"{s['min']}" if s["min"] == s["max"] else f"{s['min']} to {s['max']}"
    warm = f" (and {p['warmup_requests']} warm-up requests)" if p["warmup_requests"] else ""
    if "requests_per_boot" in p:
        r = p["requests_per_boot"]
        total = f"{r['min']:,g}" if r["min"] == r["max"] else f"{r['min']:,g} to {r['max']:,g}"
        about = "about " if "sample_seconds" in p else ""
        return (f"{samples} samples x {about}{p['requests_per_sample']:,g} requests = {about}{total} "
                f"requests{warm}")
    t = p["seconds_per_boot"]
    total = f"{t['min']:,g}" if t["min"] == t["max"] else f"{t['min']:,g} to {t['max']:,g}"
    return f"{samples} samples x {p['sample_seconds']:g} s = {total} s of requests{warm}"


def point_words(at: BenchmarkSpec) -> str:
    """One load point in words: the loop, the lengths, how long a sample lasts, where the
    prompts come from (``at``: the benchmark at that point, ``LoadPoint.apply``)."""
    if at.open_loop:
        arrival = at.arrival + (f" (burstiness {at.burstiness:g})" if at.arrival == "gamma" else "")
        loop = f"open loop at {at.request_rate:g} req/s, {arrival} arrivals"
    else:
        loop = f"closed loop at concurrency {at.concurrency}"
    source = at.workload
    if isinstance(source, Dataset):
        lengths = "lengths from the dataset"
    else:
        lengths = (f"prompts of {_span(at.prompt_tokens, at.prompt_tokens_max)} tokens, outputs of "
                   f"{_span(at.output_tokens, at.output_tokens_max)} tokens")
    if at.sample_seconds is None:
        sample = f"{at.requests_per_sample:,} requests a sample"
    else:
        sample = f"{at.sample_seconds:g} s a sample"
    return f"{loop}, {lengths}, {sample}, {_source_words(at, source)}"


def _span(low: int, high: int | None) -> str:
    return f"{low}" if high is None or high == low else f"{low} to {high} (seeded)"


def _source_words(at: BenchmarkSpec, source) -> str:
    if isinstance(source, Dataset):
        filters = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in (
            ("min_prompt_tokens", source.min_prompt_tokens), ("max_prompt_tokens", source.max_prompt_tokens),
            ("max_output_tokens", source.max_output_tokens)) if v is not None)
        mode = "first user turns" if source.mode == "first_turn" else "whole conversations, turn by turn"
        return f"prompts from the dataset {source.path} ({mode}; {filters})"
    if isinstance(source, SharedPrefix):
        return (f"shared prefixes: {source.groups} groups of {source.prefix_tokens} tokens, each with "
                f"{source.suffixes} suffixes")
    if isinstance(source, MultiTurn):
        think = f", {source.think_s:g} s between a reply and the next turn" if source.think_s else ""
        return f"multi-turn sessions of {source.turns} turns{think}"
    return "the same prompts every sample" if at.prompt_reuse else "the harness's own prompts, each its own"


def _curves(plan: Plan) -> list[dict]:
    """Each curve of the plan's hypotheses: its id and its points, in the sweep's order."""
    out: dict[str, dict] = {}
    for h in plan.hypotheses:
        if h.spec.curve is not None:
            c = out.setdefault(h.spec.curve, {"curve": h.spec.curve, "points": [], "hypotheses": []})
            c["points"].append(h.spec.point_label)
            c["hypotheses"].append(h.id)
    return list(out.values())


def _capacity_json(bench: BenchmarkSpec) -> dict | None:
    c = bench.capacity
    if c is None:
        return None
    return {"start_rps": c.start_rps, "tolerance": c.tolerance, "trial_requests": c.trial_requests,
            "max_trials": c.max_trials}
