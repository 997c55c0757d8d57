"""Lay down the demo engine's git repository, deterministically, and cache it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from bisect_harness.places import default_cache_dir
from bisect_harness.errors import InfrastructureError
from bisect_harness.demo.history import STEPS, apply_step, base_files

#: Bump whenever the history or the engine files change: it names the cache folder.
GENERATOR_VERSION = 15

_MARKER = "bisect-harness-demo.json"  # inside .git: not part of any commit
_EPOCH = 1_700_000_000  # 2023-11-14T22:13:20Z; each commit is one hour later
_IDENTITY = {"GIT_AUTHOR_NAME": "Demo Engine Dev", "GIT_AUTHOR_EMAIL": "dev@demo-engine.invalid",
             "GIT_COMMITTER_NAME": "Demo Engine Dev", "GIT_COMMITTER_EMAIL": "dev@demo-engine.invalid"}


@dataclass(frozen=True)
class DemoHistory:
    """A generated demo repository.

    ``shas`` runs oldest to newest. ``events`` maps ``"regression"``,
    ``"build_failure"`` and ``"env_scrub"`` to the commit that introduced each:
    it is for tests and benchmarks only; the harness must find these itself.
    """

    path: Path
    shas: tuple[str, ...]
    messages: tuple[str, ...]
    events: Mapping[str, str] = field(default_factory=dict)

    @property
    def head(self) -> str:
        return self.shas[-1]

    def index(self, sha: str) -> int:
        return self.shas.index(sha)


def _git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(_IDENTITY)
    env.update({"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
                "LC_ALL": "C", "TZ": "UTC"})
    return env


def _git(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    argv = ["git", "-c", "core.autocrlf=false", "-c", "commit.gpgsign=false",
            "-c", "core.fileMode=true", "-c", "init.defaultBranch=main", *args]
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise InfrastructureError("git is not installed or not on PATH; the demo engine needs it") from exc
    if proc.returncode != 0:
        raise InfrastructureError(f"git {' '.join(args[:2])} failed in {cwd} "
                                  f"(exit {proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout.strip()


def create_demo_repo(path: Path | str) -> DemoHistory:
    """Create the demo engine repository at ``path`` (which must not exist or be empty).

    The commits' SHAs are the same on every machine: content, author, committer
    and dates are all fixed.

    >>> hist = create_demo_repo(tmp_path / "engine")   # doctest: +SKIP
    >>> len(hist.shas), hist.events["regression"] in hist.shas   # doctest: +SKIP
    (32, True)
    """
    path = Path(path)
    if path.exists() and any(path.iterdir()):
        raise InfrastructureError(f"cannot create the demo repository in {path}: the folder is not empty")
    path.mkdir(parents=True, exist_ok=True)
    env = _git_env()
    _git(["init", "-q", "-b", "main"], path, env)
    files: dict[str, str] = {}
    shas, messages, events = [], [], {}
    for i, step in enumerate(STEPS):
        files = base_files() if i == 0 else apply_step(files, step)
        for rel, text in files.items():
            target = path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8", newline="\n")
        stamp = f"@{_EPOCH + 3600 * i} +0000"
        step_env = {**env, "GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp}
        _git(["add", "-A"], path, step_env)
        _git(["commit", "-q", "--no-verify", "-m", step.message], path, step_env)
        sha = _git(["rev-parse", "HEAD"], path, step_env)
        shas.append(sha)
        messages.append(step.message)
        if step.event:
            events[step.event] = sha
    hist = DemoHistory(path=path, shas=tuple(shas), messages=tuple(messages), events=dict(events))
    marker = {"generator_version": GENERATOR_VERSION, "shas": shas, "messages": messages, "events": events}
    (path / ".git" / _MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return hist


def read_demo_history(path: Path | str) -> DemoHistory:
    """The :class:`DemoHistory` of a repository made by :func:`create_demo_repo`."""
    path = Path(path)
    try:
        marker = json.loads((path / ".git" / _MARKER).read_text())
    except (OSError, ValueError) as exc:
        raise InfrastructureError(f"{path} is not a demo repository made by bisect-harness "
                                  f"({exc}); delete it and let it be created again") from exc
    return DemoHistory(path=path, shas=tuple(marker["shas"]), messages=tuple(marker["messages"]),
                       events=dict(marker["events"]))


def ensure_demo_repo(cache_dir: Path | None = None) -> Path:
    """Path of the demo repository in the cache, creating it on first use.

    Safe when several processes race: each builds in a private temporary folder
    and renames it into place; the loser discards its copy.
    """
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = cache_dir / f"demo-engine-v{GENERATOR_VERSION}"
    if (final / ".git" / _MARKER).is_file():
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".demo-engine-tmp-", dir=cache_dir))
    try:
        create_demo_repo(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process won the race (or a broken leftover is in the way).
            if not (final / ".git" / _MARKER).is_file():
                raise InfrastructureError(
                    f"{final} exists but is not a complete demo repository; delete it and retry")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
