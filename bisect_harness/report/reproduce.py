"""What a journal gives a reader to do it again: commands and the commits in a range.

The commands are built from ledger rows only: the run's kind, spec path and
nightly summary; each boot's argv as it ran and, where the backend recorded
them, its working folder and the env it laid over the host's
(``BootEvidence.launch``). A figure the ledger lacks is said to be
"not recorded", never guessed.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from pathlib import Path

__all__ = ["experiment_name", "file_part", "run_command", "boot_command", "commit_log"]

#: Spec file stems too generic to name an experiment; their folder names it instead.
_GENERIC_STEMS = {"hypotheses", "spec", "experiment", "nightly", "config"}


def file_part(text: str, limit: int = 80) -> str:
    """``text`` made safe as part of one file name: characters other than letters,
    digits, ``_ . = , [ ] -`` become ``-`` (so no ``/``, no ``..`` can climb out of the folder),
    and a name that had to change or is over ``limit`` characters ends in a short hash
    of the original, so two ids never share a file."""
    slug = re.sub(r"[^A-Za-z0-9_.=,\[\]-]+", "-", text).strip("-.")
    slug = re.sub(r"\.{2,}", ".", slug)
    if slug == text and len(slug) <= limit:
        return slug
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{slug[:limit]}-{digest}" if slug else digest


def experiment_name(spec_path: str) -> str:
    """The experiment's name for file names: the spec file's stem, or its folder's name
    when the stem is generic (``experiments/sglang-eagle3/hypotheses.yaml`` -> ``sglang-eagle3``)."""
    p = Path(spec_path)
    name = p.stem
    if name.lower() in _GENERIC_STEMS and p.parent.name not in ("", ".", "/"):
        name = p.parent.name
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.")[:80]
    return slug or "experiment"


def run_command(run, bisections=()) -> str:
    """The ``harness`` command line that runs this experiment again (from the ledger's run row)."""
    spec = shlex.quote(run.spec_path)
    if run.kind == "nightly" and run.summary:
        s = run.summary
        return (f"harness nightly {spec} --rev {shlex.quote(str(s.get('commit', 'HEAD')))} "
                f"--metric {shlex.quote(str(s.get('metric', 'tok_s')))}")
    if run.kind == "bisect" and bisections:
        b = bisections[0]
        return f"harness bisect {spec} --good {b.good} --bad {b.bad} --metric {shlex.quote(b.metric)}"
    if run.kind == "explain" and isinstance(run.summary, dict):
        recs = list(run.summary.get("explain") or []) + [run.summary.get("explaining") or {}]
        e = next((r for r in recs if r.get("fast") and r.get("slow")), None)
        if e is not None:
            effect = f" --min-effect {e['min_effect']:.10g}" if e.get("min_effect") is not None else ""
            alpha = e.get("alpha_per_test")
            return (f"harness explain {spec} --fast {shlex.quote(e['fast'])} --slow {shlex.quote(e['slow'])}{effect}"
                    + (f" --alpha {alpha:.10g}" if alpha is not None else ""))
    # a run of some of the file's hypotheses (--only): its verdicts record the file's family size
    family = max((int(v.figures.family_size or 0) for h in run.hypotheses for v in h.verdicts),
                 default=0)
    only = sorted({h.hid.split("[", 1)[0] for h in run.hypotheses})
    if run.hypotheses and family > len(run.hypotheses):
        return f"harness run {spec} " + " ".join(f"--only {shlex.quote(i)}" for i in only)
    return f"harness run {spec}"


def resume_command(run) -> str | None:
    """The command that continues ``run`` in its own row, where the run stopped short and
    can be continued (``harness run FILE --resume RUN``); else None."""
    if run.kind != "run" or run.status not in ("interrupted", "failed"):
        return None
    return f"harness run {shlex.quote(run.spec_path)} --resume {run.id}"


def boot_command(boot) -> str:
    """``cd CWD && env K=V ... ARGV`` as the boot ran; the parts the ledger lacks say so."""
    if not boot.argv:
        return "not recorded (the boot did not reach its launch)"
    launch = boot.evidence.launch or {}
    argv = " ".join(shlex.quote(str(a)) for a in boot.argv)
    env = launch.get("env")
    env_part = ("env " + " ".join(f"{k}={shlex.quote(str(v))}" for k, v in sorted(env.items())) + " "
                if env else "")
    cwd = launch.get("cwd")
    head = f"cd {shlex.quote(cwd)} && " if cwd else ""
    text = head + env_part + argv
    if not cwd:
        text += "  # working folder not recorded"
    return text


def commit_log(spec_text: str, spec_path: str, good: str | None, bad: str | None, *,
               limit: int = 40, releases: tuple[str | None, str | None] = (None, None)) -> tuple[list[str], str]:
    """``git log --oneline good..bad`` from the cache's mirror of the engine (or the
    engine's own repository when no mirror exists yet): (lines, note). The note says
    why there are no lines (same commit, no repository, a commit not found). Two
    released builds (``releases``, no commits) are compared through their tags
    (``engine.releases.tag``) where the file maps them to the repository."""
    if (not good or not bad) and all(releases):
        good, bad, why = _release_tags(spec_text, spec_path, *releases)
        if why:
            return [], why
    if not good or not bad:
        return [], "no commits to compare (an installed or attached server)"
    if good == bad:
        return [], f"both sides ran commit {good[:12]}"
    repo = _engine_repo(spec_text, spec_path)
    if repo is None:
        return [], "the engine repository is not available here, so the commits between the sides are not listed"
    import git

    from bisect_harness.engines.checkout import Workspace
    from bisect_harness.errors import HarnessError

    try:
        ws = Workspace(repo)
        where = git.Repo(ws.mirror_path) if (ws.mirror_path / "HEAD").exists() else ws.user
        lines = where.git.log("--oneline", "--no-decorate", f"{good}..{bad}").splitlines()
    except (HarnessError, git.GitCommandError, git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        return [], f"git log {good[:12]}..{bad[:12]} failed: {str(exc).splitlines()[0][:200]}"
    if not lines:
        return [], f"no commits in {good[:12]}..{bad[:12]} (the treatment's commit is not after the baseline's)"
    note = f"{len(lines)} commit(s) in {good[:12]}..{bad[:12]}, newest first"
    if len(lines) > limit:
        note += f" (the first {limit} shown)"
    return lines[:limit], note


def _release_tags(spec_text: str, spec_path: str, old: str, new: str) -> tuple[str | None, str | None, str]:
    """The tags of releases ``old`` and ``new`` (``engine.releases.tag``), or why the
    commits between them cannot be listed."""
    from bisect_harness.errors import HarnessError
    from bisect_harness.spec import parse_spec

    try:
        rel = parse_spec(spec_text, Path(spec_path)).engine.releases
    except HarnessError:
        rel = None
    if rel is None or rel.tag is None:
        return None, None, (f"releases {old} and {new} are not mapped to commits (set engine.releases.tag, e.g. "
                            "'v{version}', and engine.repo to list the commits between them)")
    return rel.tag.format(version=old), rel.tag.format(version=new), ""


def _engine_repo(spec_text: str, spec_path: str) -> Path | None:
    """The engine's repository named by the run's spec, if it exists on this machine.
    The demo's generated repository is looked up in the cache, never created."""
    from bisect_harness.errors import HarnessError
    from bisect_harness.spec import parse_spec

    try:
        spec = parse_spec(spec_text, Path(spec_path))
    except HarnessError:
        return None
    if spec.engine.base_url is not None:
        return None
    if spec.engine.repo is not None:
        return spec.engine.repo if Path(spec.engine.repo).exists() else None
    if spec.engine.preset == "demo":
        from bisect_harness.demo.repo import GENERATOR_VERSION, _MARKER
        from bisect_harness.places import default_cache_dir

        path = default_cache_dir() / f"demo-engine-v{GENERATOR_VERSION}"
        return path if (path / ".git" / _MARKER).is_file() else None
    return None
