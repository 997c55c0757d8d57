"""``harness run --dry-run``: the plan, printed, with nothing booted."""

from __future__ import annotations

import shlex
from pathlib import Path

from bisect_harness.decide.design import ANALYSES
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
    if spec.engine.metrics:  # each declared source says what it reads (sources.MetricSource.describe)
        lines.append("metric sources:")
        lines.extend(f"  {m.describe()}" for m in spec.engine.metrics)
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
