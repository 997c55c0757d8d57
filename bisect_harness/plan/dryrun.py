"""``harness run --dry-run``: the plan, printed, with nothing booted."""

from __future__ import annotations

import shlex
from pathlib import Path

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
    config's argv would be refused) and ``flags_unchecked`` (commits whose help
    could not be read, each entry's ``error`` says why)."""
    spec, d = plan.spec, plan.spec.defaults
    repo = plan.repo  # None for an attached server or a preset without a repository
    resolvable = repo is not None and Path(repo).exists()
    lines = [f"plan for {spec.path.name}: {len(plan.hypotheses)} hypotheses, {len(plan.configs)} configs",
             f"boots per config: {d.boots_per_arm} to {d.max_boots_per_arm} (sequential), "
             f"{d.samples_per_boot} samples per boot, alpha {d.alpha}"]
    lines.append(f"engine: preset {get_preset(spec.engine.preset).describe()}")
    if repo is not None and not resolvable:
        lines.append(f"note: engine.repo {repo} does not exist here; revisions are shown as written")
    if plan.per_commit_env:
        lines.append(f"python: each commit's own environment ({{python}} in argv), a venv over {plan.base_python}")
    else:
        lines.append(f"python: {plan.base_python}" + (" (shared by every commit's build)"
                                                      if spec.engine.build and plan.repo is not None else ""))
    if spec.engine.metrics:  # each declared source says what it reads (sources.MetricSource.describe)
        lines.append("metric sources:")
        lines.extend(f"  {m.describe()}" for m in spec.engine.metrics)
    configs = []
    for i, c in enumerate(plan.configs, 1):
        argv = redact_argv(plan.argv(c, port="{port}", worktree=Path("{worktree}") if c.arm.commit else None))
        env, flags = redact_env(c.arm.env), redact_env(c.arm.flags)  # secrets masked (secrets.py)
        users = [h.id for h in plan.hypotheses if c.key in (h.baseline.key, h.treatment.key)]
        profiler = get_preset(spec.engine.preset).profiler if plan.profiles(c) else None
        configs.append({"key": c.key, "commit": c.arm.commit, **({"release": c.arm.release} if c.arm.release else {}),
                        "env": env, "flags": flags,
                        "argv": argv, "boots": {"min": d.boots_per_arm, "max": d.max_boots_per_arm},
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
        lines.append("  argv:   " + shlex.join(argv))
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
                                   for m in h.spec.mechanism]})
        lines.append(f"hypothesis {h.id}: config {b} vs config {t}, {h.metric.name} {h.spec.expect.value} "
                     f">= {h.spec.min_effect:.1%}" + (", bisect if confirmed" if h.spec.bisect else "")
                     + (", explain if confirmed" if h.spec.explain else "")
                     + "".join(f", mechanism {m.metric} {m.expect.value} >= {m.min_effect:.1%}"
                               for m in h.spec.mechanism))
    flag_check = None
    if check_flags:
        flag_check = _check_flags(plan, lines, say)
    obj = {"spec": str(spec.path), "configs": configs, "hypotheses": hyps,
           "environment": {"mode": "venv" if plan.per_commit_env else "shared", "base_python": plan.base_python},
           "preset": get_preset(spec.engine.preset).describe(),
           "metric_sources": [m.describe() for m in spec.engine.metrics],
           "defaults": {"boots_per_arm": d.boots_per_arm, "max_boots_per_arm": d.max_boots_per_arm,
                        "samples_per_boot": d.samples_per_boot, "alpha": d.alpha}}
    if flag_check is not None:
        obj["flag_check"] = [c.to_dict() for c in flag_check]
        obj["flags_refused"] = any(c.refused for c in flag_check)
        obj["flags_unchecked"] = [c.commit for c in flag_check if c.error]
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
            continue
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
