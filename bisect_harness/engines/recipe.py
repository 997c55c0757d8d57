"""What a boot request's recipe becomes on the host that runs it.

A :class:`~bisect_harness.boot.BootRequest` leaves ``{port}``,
``{worktree}`` and ``{python}`` open; here they are filled: the commit's
worktree and environment (made and built once, cached), the placeholder
values, the working folder and the process env.
:func:`bisect_harness.backends.procedure.run_boot` and the dry run's flag check (``input.engine_flags.check_plan_flags``) both use
these functions, so ``--check-flags`` runs each commit's ``--help`` exactly
where and how its boots will run.
"""

from __future__ import annotations

import os
from pathlib import Path

from bisect_harness.engines.checkout import Workspace
from bisect_harness.engines.envs import CommitEnv
from bisect_harness.engines.presets import placeholder_values, render_argv
from bisect_harness.boot import BootRequest

__all__ = ["checkout", "placeholders", "working_dir", "process_env"]


def checkout(req: BootRequest, notes: list[str] | None = None) -> tuple[Path | None, CommitEnv]:
    """The checkout of ``req``'s commit (``engine.checkout``: a worktree, an exported tree
    or a clone; None without a commit) and the environment it runs in;
    the commit's own environment made and its build run (cached) first, each verified
    against its record; what the checks made again is said in ``notes``. Raises BuildFailed."""
    worktree, cenv = None, CommitEnv(python=req.base_python, venv=None, base_python=req.base_python)
    if req.release is not None:  # a released build: its own environment, installed once (no checkout)
        from bisect_harness.engines.releases import image_record, install

        if req.release.image is not None:  # an image, run through the runtime: known by its digest
            return None, CommitEnv(python=req.base_python, base_python=req.base_python,
                                   installed=image_record(req.release))
        cenv, _ = install(req.release, Path(req.cache_dir), req.base_python)
        return None, cenv
    if req.commit is not None and req.repo is not None:
        ws = Workspace(Path(req.repo), Path(req.cache_dir))
        ws.notes = notes if notes is not None else ws.notes
        worktree = ws.checkout(req.commit, req.checkout)
        if req.per_commit_env:  # the commit's own interpreter: its build cannot reach another's
            cenv = ws.environment(req.commit, req.base_python)
        if req.build_steps:
            places = placeholders(req, port="", worktree=worktree, python=cenv.python)
            ws.build(req.commit, [render_argv(list(step), **places) for step in req.build_steps],
                     process_env(req, cenv), python=cenv.python, mode=req.checkout, build_env=req.build_env)
    return worktree, cenv


def placeholders(req: BootRequest, *, port, worktree: Path | None, python: str) -> dict[str, str]:
    """The values of ``{port}``, ``{host}``, ``{python}``, ``{worktree}`` and ``{spec_dir}``."""
    return placeholder_values(port=port, worktree=worktree, python=python, spec_dir=req.spec_dir)


def working_dir(req: BootRequest, worktree: Path | None, python: str) -> Path:
    """Where the server (and its build, help and bench tool) runs: ``engine.cwd``
    rendered, else the worktree, else the spec's folder."""
    if req.cwd:
        return Path(render_argv([req.cwd], **placeholders(req, port="", worktree=worktree, python=python))[0])
    return worktree if worktree is not None else Path(req.spec_dir)


def process_env(req: BootRequest, cenv: CommitEnv | None) -> dict[str, str]:
    """The process env of a boot: this host's, then the config's (preset env, then the
    arm's), with the commit's environment first on PATH."""
    env = dict(os.environ)
    env.update(req.env)
    return cenv.apply(env) if cenv is not None else env
