"""The commands that look after the host and the tools: ``demo init``, ``cache list``
and ``prune``, ``doctor`` and ``schema``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from bisect_harness.cli.outputs import KINDS, emit, output_schema
from bisect_harness.errors import UserError

__all__ = ["cache_list", "cache_prune", "demo_init", "doctor", "schema"]


def demo_init(directory: Path = typer.Argument(..., help="Where to create the demo engine's git repository.")) -> None:
    """Lay down the demo engine: a real git history of a small torch inference server."""
    from bisect_harness.demo import create_demo_repo

    if directory.exists() and any(directory.iterdir()):
        raise UserError(f"{directory} exists and is not empty; pick a new folder")
    history = create_demo_repo(directory)
    Console().print(f"demo engine: {directory} ({len(history.shas)} commits, HEAD {history.shas[-1][:12]})", markup=False)


CACHE_DIR_OPT = typer.Option(None, "--cache-dir", help="The cache folder (default: BISECT_HARNESS_CACHE or "
                             "the user cache folder).")


def _cache_lines(entries) -> list[str]:
    """One plain line per entry (commit, kind, size, last use, repository): never wrapped or cut."""
    from bisect_harness.plan.cache import human_age, human_size

    lines = [f"  {'commit':<12}  {'kind':<11}  {'size':>10}  {'last used':>10}  repository"]
    for e in entries:
        lines.append(f"  {e.commit[:12]:<12}  {e.kind:<11}  {human_size(e.size_bytes):>10}  "
                     f"{human_age(e.age_s()) + ' ago':>10}  {e.repo}")
    return lines


def cache_list(cache_dir: Optional[Path] = CACHE_DIR_OPT,
               json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line.")) -> None:
    """Every worktree and environment in the cache, least recently used first."""
    from bisect_harness.plan.cache import human_size, list_cache
    from bisect_harness.places import default_cache_dir

    root = cache_dir or default_cache_dir()
    entries = list_cache(root)
    total = sum(e.size_bytes for e in entries)
    if json_out:
        emit("cache-list", {"cache_dir": str(root), "total_bytes": total, "entries": [e.to_dict() for e in entries]})
        return
    if not entries:
        typer.echo(f"{root}: no worktrees or environments")
        return
    typer.echo(f"{root}, least recently used first:")
    typer.echo("\n".join(_cache_lines(entries)))
    typer.echo(f"{len(entries)} entries, {human_size(total)} in all (`harness cache prune` reclaims them)")


def cache_prune(
    older_than: Optional[str] = typer.Option(None, "--older-than", help="Remove what was not used for this long "
                                             "(30m, 12h, 7d, 2w)."),
    max_size: Optional[str] = typer.Option(None, "--max-size", help="Then remove the least recently used until "
                                           "the rest fits (500M, 20G)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would be removed; remove nothing."),
    cache_dir: Optional[Path] = CACHE_DIR_OPT,
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Reclaim worktrees and environments by age and/or total size (the user's repository is never touched;
    a removed commit is checked out and built again when next used)."""
    from bisect_harness.plan.cache import human_size, list_cache, parse_age, parse_size, prune, select_for_prune
    from bisect_harness.places import default_cache_dir

    age = parse_age(older_than) if older_than is not None else None
    size = parse_size(max_size) if max_size is not None else None
    root = cache_dir or default_cache_dir()
    entries = list_cache(root)
    chosen = select_for_prune(entries, older_than_s=age, max_bytes=size)
    removed = chosen if dry_run else prune(chosen)
    freed = sum(e.size_bytes for e in removed)
    kept = sum(e.size_bytes for e in entries) - freed
    if json_out:
        emit("cache-prune", {"cache_dir": str(root), "dry_run": dry_run, "removed": [e.to_dict() for e in removed],
                             "freed_bytes": freed, "kept_bytes": kept, "kept_entries": len(entries) - len(removed)})
        return
    if removed:
        typer.echo("would remove:" if dry_run else "removed:")
        typer.echo("\n".join(_cache_lines(removed)))
    verb = "would free" if dry_run else "freed"
    typer.echo(f"{len(removed)} of {len(entries)} entries, {verb} {human_size(freed)}; "
               f"{human_size(kept)} kept in {root}")


def doctor(json_out: bool = typer.Option(False, "--json"),
           seconds: float = typer.Option(3.0, "--seconds", help="Budget of the calibration probe.")) -> None:
    """This host's provenance and a calibration probe, now."""
    from bisect_harness.observe import doctor as _doctor

    report = _doctor.doctor_report(seconds_budget=seconds)
    if json_out:
        emit("doctor", report.to_dict(), default=str)
    else:
        Console().print(_doctor.render_doctor_text(report), markup=False)

def schema(output: Optional[str] = typer.Option(None, "--output", metavar="KIND",
                                               help="The JSON Schema of a command's --json output instead: "
                                               + ", ".join(KINDS) + ".")) -> None:
    """The JSON Schema of hypotheses.yaml (for editors: completion and checks as you type), or of
    a command's --json output (--output KIND)."""
    if output is not None:
        typer.echo(json.dumps(output_schema(output), indent=2))
        return
    from bisect_harness.spec.schema import hypotheses_schema

    typer.echo(json.dumps(hypotheses_schema(), indent=2))
