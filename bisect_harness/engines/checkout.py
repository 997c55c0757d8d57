"""Commits into checkouts, without ever touching the user's checkout.

The user's repository is only *read* (``rev-parse``, ``rev-list``). Commits are
fetched into a bare mirror in the cache folder (a local clone: objects are
hard-linked, not copied), and each commit gets its own checkout of that mirror,
in one of three modes (``engine.checkout``):

- ``worktree`` (the default): a detached ``git worktree``. Cheap; its ``.git`` is
  a *file*, which some build scripts do not expect (llama.cpp's CMake of 2023
  makes ``build-info.h`` depend on ``.git/index`` and stops with "No rule to make
  target '.../.git/worktrees/.../index'").
- ``tree``: the commit's files exported (``git archive``: no ``.git`` at all, as
  a release tarball; ``export-ignore`` and ``export-subst`` attributes apply). For
  build scripts that must not see a repository.
- ``clone``: a full clone of the mirror (objects hard-linked), detached at the
  commit, with its tags: for build scripts that run git (``git describe``,
  ``.git/index`` as a dependency).

The user's HEAD, index, files and even ``.git/worktrees`` stay as they were, on
success and on failure. A ``tree`` or ``clone`` checkout is made in a temporary
folder and renamed into place when whole, so a half-made one is never used.

A build runs once per (commit, checkout, interpreter, build argv, the build's
variables); its outcome and log are cached beside the checkouts, so a commit that
failed to build is a recorded skip and is not rebuilt on every boot. The build's
variables are the compiler's usual ones (:data:`BUILD_ENV`) and those the spec
names in ``engine.build_env``; the rest of the environment (an arm's tuning
variable, say) does not rebuild a commit. Each commit may have its own Python
environment (``envs``), made over a base interpreter; the build cache is keyed on
the interpreter, so a commit's build is never taken for another's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")  # a missing git is reported when used, not at import
import git  # noqa: E402
from filelock import FileLock, Timeout  # noqa: E402

from bisect_harness.process import supervised
from bisect_harness.engines import integrity
from bisect_harness.engines.envs import CommitEnv, create_venv, installed, is_complete
from bisect_harness.errors import BuildFailed, CommitError, InfrastructureError
from bisect_harness.kinds import Registry
from bisect_harness.secrets import redact_argv
from bisect_harness.places import default_cache_dir


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def read_tail(path: Path | str, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file, or "" when it cannot be read."""
    try:
        return tail(Path(path).read_text(errors="replace"), lines)
    except OSError:
        return ""


@dataclass(frozen=True)
class BuildResult:
    ok: bool
    log_path: Path
    seconds: float
    cached: bool


class Workspace:
    """One engine repository, its mirror and its worktrees under ``cache_dir``."""

    def __init__(self, repo: Path, cache_dir: Path | None = None):
        self.repo_path = Path(repo).resolve()
        if shutil.which("git") is None and not os.environ.get("GIT_PYTHON_GIT_EXECUTABLE"):
            raise InfrastructureError("git is not installed or not on PATH; install git to check out engine commits")
        try:
            self.user = git.Repo(self.repo_path)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            raise CommitError(f"engine.repo {self.repo_path} is not a git repository; "
                              "point engine.repo at the engine's checkout") from None
        ident = hashlib.sha256(str(self.repo_path).encode()).hexdigest()[:12]
        self.root = (cache_dir or default_cache_dir()) / "repos" / f"{self.repo_path.name}-{ident}"
        self.mirror_path = self.root / "mirror.git"
        self.trees = self.root / CHECKOUT_MODES["worktree"].folder
        self.envs = self.root / "envs"
        self._mirror: git.Repo | None = None
        #: What the checks of checkouts and environments found and did (each made again), in words.
        self.notes: list[str] = []

    # ------------------------------------------------------------------ revisions (read-only on the user's repo)

    def resolve(self, rev: str, *, where: str = "") -> str:
        """A full sha for ``rev`` as the user's repository sees it now."""
        try:
            return self.user.git.rev_parse("--verify", "--quiet", f"{rev}^{{commit}}").strip()
        except git.GitCommandError:
            place = f" ({where})" if where else ""
            raise CommitError(
                f"commit {rev!r}{place} does not exist in {self.repo_path}; use a sha, branch or tag "
                "that `git log --oneline` shows there") from None

    def commits_between(self, good: str, bad: str, *, first_parent: bool = False) -> list[str]:
        """``good`` then every commit after it up to ``bad``, oldest first."""
        args = ["--reverse", "--topo-order"]
        if first_parent:
            args.append("--first-parent")
        if not self.is_ancestor(good, bad):
            raise CommitError(f"good commit {good[:12]} is not an ancestor of bad commit {bad[:12]}; "
                              "swap --good and --bad or pick commits on one line of history")
        out = self.user.git.rev_list(*args, f"{good}..{bad}").split()
        return [good] + out

    def is_ancestor(self, old: str, new: str) -> bool:
        """Is ``old`` an ancestor of ``new`` (or the same commit)?"""
        try:
            self.user.git.merge_base("--is-ancestor", old, new)
        except git.GitCommandError:
            return False
        return True

    def subject(self, sha: str) -> str:
        try:
            return self.user.commit(sha).summary
        except (ValueError, git.BadName):
            return ""

    # ------------------------------------------------------------------ mirror and worktrees (cache only)

    def _lock(self) -> FileLock:
        """The cache's lock for this repository: the mirror, its fetches and its worktrees
        are changed by one process at a time (several runs may share one cache)."""
        self.root.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.root / ".lock"), timeout=LOCK_TIMEOUT_S)

    def mirror(self) -> git.Repo:
        if self._mirror is None:
            with _locked(self._lock()):
                self._make_mirror()
            self._mirror = git.Repo(self.mirror_path)
        return self._mirror

    def _make_mirror(self) -> None:
        if not (self.mirror_path / "HEAD").exists():
            tmp = self.root / f"mirror.tmp-{os.getpid()}"
            try:
                git.Repo.clone_from(str(self.repo_path), str(tmp), bare=True)
                os.replace(tmp, self.mirror_path)
            except (git.GitCommandError, OSError) as exc:
                raise InfrastructureError(f"cannot mirror {self.repo_path} into the cache: {exc}") from None
            finally:
                if tmp.exists():
                    _rmtree(tmp)

    def _ensure_object(self, sha: str) -> None:
        mirror = self.mirror()
        try:
            mirror.git.cat_file("-e", f"{sha}^{{commit}}")
            return
        except git.GitCommandError:
            pass
        try:
            mirror.git.fetch("--no-tags", str(self.repo_path), "+refs/heads/*:refs/heads/*",
                             "+refs/tags/*:refs/tags/*", "+HEAD:refs/harness/user-head")
            mirror.git.cat_file("-e", f"{sha}^{{commit}}")
        except git.GitCommandError:
            try:  # an unreachable commit (detached work): fetch it by id
                mirror.git.fetch("--no-tags", str(self.repo_path), sha)
                mirror.git.cat_file("-e", f"{sha}^{{commit}}")
            except git.GitCommandError as exc:
                raise CommitError(f"commit {sha[:12]} could not be fetched from {self.repo_path}: "
                                  f"{exc.stderr.strip()}") from None

    def checkout(self, sha: str, mode: str = "worktree") -> Path:
        """The folder of ``sha``'s checkout in ``mode`` (:data:`CHECKOUT_MODES`), made on first
        use and verified against its record on every later one (``engines.integrity``): one
        that is not what it was made from is made again (said in :attr:`notes`), and the
        commit's builds are run again in it."""
        if mode not in CHECKOUT_MODES:
            raise ValueError(f"unknown checkout mode {mode!r}")
        with _locked(self._commit_lock(sha)):
            path = self._made(sha, mode)
            why = self._differs(path, {"commit": sha, "mode": mode})
            if why is None:
                return path
            self.notes.append(f"the {mode} checkout of {sha[:12]} is not what it was made from ({why}); "
                              "made it again")
            self.mirror()  # made (under the lock below) before the lock is taken here
            with _locked(self._lock()):
                self._discard(path, mode)
            return self._made(sha, mode)

    def worktree(self, sha: str) -> Path:
        """A clean detached checkout of ``sha`` in the cache (created on first use, verified on each)."""
        return self.checkout(sha, "worktree")

    def _made(self, sha: str, mode: str) -> Path:
        """The checkout as it stands, or made (with its record) when there is none that can be used."""
        if mode == "worktree":
            return self._worktree(sha)
        path = self.root / CHECKOUT_MODES[mode].folder / sha
        if self._reusable(path, sha, mode):  # only ever renamed into place whole
            _touch(path)
            return path
        mirror = self.mirror()
        with _locked(self._lock()):
            if self._reusable(path, sha, mode):  # another run made it while we waited
                _touch(path)
                return path
            self._discard(path, mode)
            self._ensure_object(sha)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{sha}.tmp-{os.getpid()}")
            _rmtree(tmp)
            try:
                if mode == "tree":
                    _export(self.mirror_path, sha, tmp)
                else:
                    git.Repo.clone_from(str(self.mirror_path), str(tmp), no_checkout=True, local=True)
                    git.Repo(tmp).git.checkout("--detach", "--force", sha)
                os.replace(tmp, path)
                self._record(path, sha, mode)
            except (git.GitCommandError, OSError, tarfile.TarError) as exc:
                detail = exc.stderr.strip() if isinstance(exc, git.GitCommandError) else str(exc)
                raise InfrastructureError(f"cannot make the {mode} checkout of {sha[:12]} in the cache: "
                                          f"{detail}") from None
            finally:
                _rmtree(tmp)
        return path

    def _worktree(self, sha: str) -> Path:
        path = self.trees / sha
        if self._reusable(path, sha, "worktree"):
            _touch(path)
            return path
        mirror = self.mirror()
        with _locked(self._lock()):
            if self._reusable(path, sha, "worktree"):  # another run made it while we waited
                _touch(path)
                return path
            self._discard(path, "worktree")
            self._ensure_object(sha)
            self.trees.mkdir(parents=True, exist_ok=True)
            try:
                mirror.git.worktree("prune")
                mirror.git.worktree("add", "--detach", "--force", str(path), sha)
                self._record(path, sha, "worktree")
            except (git.GitCommandError, OSError) as exc:
                detail = exc.stderr.strip() if isinstance(exc, git.GitCommandError) else str(exc)
                raise InfrastructureError(f"git worktree add failed for {sha[:12]}: {detail}") from None
        return path

    def _reusable(self, path: Path, sha: str, mode: str) -> bool:
        """Is the cached checkout at ``path`` what it claims to be? A real folder (not a
        link to somewhere else), and for a worktree or clone, a repository whose HEAD is
        ``sha`` (a checkout moved by hand, or by a build script that ran ``git checkout``,
        is made again rather than measured as the wrong commit)."""
        if path.is_symlink() or not path.is_dir():
            return False
        if mode == "tree":
            return True
        dot_git = path / ".git"
        if not (dot_git.is_file() if mode == "worktree" else dot_git.is_dir()) or dot_git.is_symlink():
            return False
        try:
            return git.Repo(path).git.rev_parse("HEAD").strip() == sha
        except (git.GitCommandError, git.InvalidGitRepositoryError, git.NoSuchPathError, ValueError):
            return False

    def _discard(self, path: Path, mode: str) -> None:
        """Remove what is at ``path`` (a link itself, never what it points to), so the
        checkout is made again; a worktree is also dropped from the mirror's list."""
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            _rmtree(path)
        integrity.record_path(path).unlink(missing_ok=True)
        self._drop_builds(sha_of(path), path)
        if mode == "worktree" and (self.mirror_path / "HEAD").exists():
            with contextlib.suppress(git.GitCommandError):
                self.mirror().git.worktree("prune")

    # ------------------------------------------------------------------ records (engines.integrity)

    def _commit_lock(self, sha: str) -> FileLock:
        """One commit's checkouts, environments and builds are checked, made again and
        built by one process at a time: a check never reads a build half-written. Waited
        for as long as a build with the default timeout may take, and then some."""
        (self.root / "locks").mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.root / "locks" / f"{sha}.lock"), timeout=LOCK_TIMEOUT_S + BUILD_TIMEOUT_S)

    def _record(self, path: Path, sha: str, mode: str) -> None:
        """Write the record of a checkout just made: the commit, its tree id, its files."""
        tree = self.mirror().git.rev_parse(f"{sha}^{{tree}}").strip()
        integrity.save(path, integrity.make(path, {"commit": sha, "tree": tree, "mode": mode},
                                            skip=(".git",) if mode != "tree" else ()))

    def _differs(self, path: Path, about: Mapping) -> str | None:
        """None when ``path`` is what its record says (stat first, content where a stat
        changed), else what differs, in words."""
        rec = integrity.load(path)
        if rec is None:
            return "no record of what it was made from"
        wrong = [k for k, v in about.items() if rec.about.get(k) != v]
        if wrong:
            return f"its record names another {wrong[0]}: {rec.about.get(wrong[0])}"
        check = integrity.verify(path, rec)
        if check.refreshed and check.ok:
            with contextlib.suppress(OSError):
                integrity.save(path, rec)
        return integrity.describe(check.changes) if check.changes else None

    def _foreign(self, venv: Path, sha: str) -> str | None:
        """A distribution the environment's record says was installed from another
        commit's checkout in this cache (its ``direct_url.json``), in words; else None."""
        rec = integrity.load(venv)
        folders = {m.folder for m in CHECKOUT_MODES.values()}
        for dist in (rec.about.get("installed") or []) if rec is not None else []:
            url = str(dist.get("url") or "")
            if not url.startswith("file://"):
                continue
            where = Path(urllib.parse.unquote(url[len("file://"):]))
            if not where.is_relative_to(self.root):
                continue
            parts = where.relative_to(self.root).parts
            if len(parts) >= 2 and parts[0] in folders and parts[1] != sha:
                return f"{dist.get('name')} was installed from the checkout of {parts[1][:12]}"
        return None

    def _drop_builds(self, sha: str, where: Path) -> None:
        """The build markers (and logs) of ``sha`` whose build ran in ``where`` or with its
        interpreter: once that is made again, its builds are run again in the new one."""
        for marker in (self.root / "builds").glob(f"{sha}-*.json"):
            try:
                info = json.loads(marker.read_text())
                ran = [str(info.get("checkout") or ""), str(info.get("python") or "")]
            except (OSError, ValueError, AttributeError):
                ran = [str(where)]
            if any(r == str(where) or r.startswith(str(where) + os.sep) for r in ran):
                marker.unlink(missing_ok=True)
                marker.with_suffix(".log").unlink(missing_ok=True)

    def _record_built(self, sha: str, mode: str, python: str) -> None:
        """After a build ran: the records of the checkout and of the commit's environment
        it installed into take what the build wrote (only new or changed files are read)."""
        tree = self.root / CHECKOUT_MODES[mode].folder / sha
        places = [tree]
        if Path(python).parent.parent.parent == self.envs:  # {python} is the commit's own environment
            places.append(Path(python).parent.parent)
        for place in places:
            rec = integrity.load(place)
            if rec is not None and place.is_dir():
                about = {**rec.about, "installed": installed(place)} if place != tree else None
                integrity.save(place, integrity.update(place, rec, about))

    # ------------------------------------------------------------------ environments (cache only)

    def environment(self, sha: str, base_python: str) -> CommitEnv:
        """The commit's own virtual environment over ``base_python`` (created on first use);
        one per (commit, base interpreter). Raises ``BuildFailed`` when it cannot be made."""
        ident = hashlib.sha256(base_python.encode()).hexdigest()[:8]
        venv = self.envs / f"{sha}-{ident}"
        self.envs.mkdir(parents=True, exist_ok=True)
        with _locked(self._commit_lock(sha)), \
                _locked(FileLock(str(venv.with_name(venv.name + ".lock")), timeout=LOCK_TIMEOUT_S)):
            if is_complete(venv):  # made before: is it what it was made (and built) as?
                why = self._differs(venv, {"commit": sha, "base_python": base_python}) or self._foreign(venv, sha)
                if why is not None:
                    self.notes.append(f"the environment of {sha[:12]} is not what it was made and built as "
                                      f"({why}); made it again")
                    _rmtree(venv)
                    integrity.record_path(venv).unlink(missing_ok=True)
                    self._drop_builds(sha, venv)
            env = create_venv(base_python, venv)
            if integrity.load(venv) is None:  # just made: its record
                integrity.save(venv, integrity.make(venv, {"commit": sha, "base_python": base_python,
                                                           "installed": installed(venv)}))
        _touch(venv)
        return env

    # ------------------------------------------------------------------ build

    def build(self, sha: str, steps: Sequence[Sequence[str]] | Sequence[str] | None, env: Mapping[str, str], *,
              timeout_s: float = 3600.0, python: str | None = None, mode: str = "worktree",
              build_env: Sequence[str] = ()) -> BuildResult:
        """Run the build in the commit's checkout once per interpreter (``python``,
        the one ``{python}`` named and the build installs into) and per value of the
        build's variables (:func:`build_key`); raise ``BuildFailed`` naming the step that
        failed, its exit and the log. ``steps`` is one argv or a list of argvs, run in
        order (``engine.build``), each in the checkout with no shell; ``timeout_s``
        bounds the whole build."""
        tree = self.checkout(sha, mode)
        steps = build_steps(steps)
        if not steps:
            return BuildResult(True, tree / ".harness-build.log", 0.0, True)
        python = python or sys.executable
        ident = build_key(python, steps, env, mode=mode, build_env=build_env)
        marker = self.root / "builds" / f"{sha}-{ident}.json"
        log_path = marker.with_suffix(".log")
        marker.parent.mkdir(parents=True, exist_ok=True)
        # One build of a (commit, interpreter, argv, env) at a time, across threads (parallel
        # slots) and processes (two harnesses on one cache); the second finds the marker.
        with _locked(FileLock(str(marker.with_suffix(".lock")), timeout=LOCK_TIMEOUT_S + timeout_s)):
            env = ccache_env(env, tree)
            if marker.exists():
                return self._build_once(sha, steps, env, tree, marker, log_path, python, timeout_s)
            with _locked(self._commit_lock(sha)):  # no check reads the checkout while it builds
                try:
                    return self._build_once(sha, steps, env, tree, marker, log_path, python, timeout_s)
                finally:  # what the build wrote is part of the checkout (and environment) from now on
                    self._record_built(sha, mode, python)

    def _build_once(self, sha, steps, env, tree, marker, log_path, python, timeout_s) -> BuildResult:
        """One build (or its cached outcome): its steps in order, each logged under a header
        line when there are several, stopping at the first that fails. It runs with the
        whole ``env``; the marker records the checkout it ran in and each step's exit."""
        if marker.exists():
            info = json.loads(marker.read_text())
            if not info["ok"]:
                failed = info.get("failed_step", len(steps))
                raise BuildFailed(_failure(sha, steps, failed, info["code"], log_path, cached=True),
                                  log_tail=read_tail(log_path), log_path=str(log_path))
            return BuildResult(True, log_path, info["seconds"], True)
        start = time.monotonic()
        ran: list[dict] = []
        code = 0
        with open(log_path, "wb") as log:
            for i, argv in enumerate(steps, 1):
                if len(steps) > 1:
                    log.write(f"== build step {i} of {len(steps)}: {shlex.join(redact_argv(argv))}\n".encode())
                    log.flush()
                left = timeout_s - (time.monotonic() - start)
                code = _run_step(argv, env, tree, log, left, timeout_s)
                ran.append({"argv": redact_argv(argv), "code": code})
                if code != 0:
                    break
        seconds = time.monotonic() - start
        tmp = marker.with_suffix(f".{os.getpid()}.tmp")  # written whole, then renamed: never half a marker
        shown = ran[0]["argv"] if len(steps) == 1 else [r["argv"] for r in ran]
        tmp.write_text(json.dumps({"ok": code == 0, "code": code, "seconds": seconds, "argv": shown, "steps": ran,
                                   "failed_step": len(ran) if code != 0 else None,
                                   "python": python, "checkout": str(tree)}))
        os.replace(tmp, marker)
        if code != 0:
            raise BuildFailed(_failure(sha, steps, len(ran), code, log_path),
                              log_tail=read_tail(log_path), log_path=str(log_path))
        return BuildResult(True, log_path, seconds, False)


def build_steps(value: Sequence[Sequence[str]] | Sequence[str] | None) -> tuple[tuple[str, ...], ...]:
    """A build as its steps: one argv (a list of strings) is one step; a list of argvs is
    several, run in order; None or empty is none."""
    if not value:
        return ()
    if all(isinstance(a, str) for a in value):
        return (tuple(value),)
    return tuple(tuple(step) for step in value if step)


def ccache_env(env: Mapping[str, str], tree: Path) -> dict[str, str]:
    """``env`` with ``CCACHE_BASEDIR`` set to the checkout's folder unless it is set
    already: ccache then hashes the paths under the checkout as relative ones, so two
    commits' checkouts (each its own folder) share the compiler cache. Harmless where
    no ccache runs; the user's own value wins."""
    out = dict(env)
    out.setdefault("CCACHE_BASEDIR", str(tree))
    return out


def _run_step(argv, env, tree: Path, log, left_s: float, timeout_s: float) -> int:
    """One build step under a supervisor (a build's daemons and background jobs, ``cmd &``
    or a compiler server, are killed with it, at the build's deadline, and if the harness
    dies); its exit code, 127 where it cannot start, -1 past the deadline."""
    if left_s <= 0:
        code = None
    else:
        try:
            code = supervised.run(list(argv), env=env, cwd=tree, stdout=log, timeout_s=left_s)
        except supervised.LaunchError as exc:
            log.write(f"build command not found or not runnable: {argv[0]} ({exc})\n".encode())
            return 127
    if code is None:
        log.write(f"build timed out after {timeout_s:g}s\n".encode())
        return -1
    return code


def _failure(sha: str, steps, failed: int, code: int, log_path: Path, *, cached: bool = False) -> str:
    """What failed: the commit, the step (of several), its exit, its argv and the log."""
    step = f"step {failed} of {len(steps)}, " if len(steps) > 1 else ""
    argv = steps[failed - 1] if 0 < failed <= len(steps) else steps[-1]
    return (f"build failed at {sha[:12]} ({'cached; ' if cached else ''}{step}exit {code}): "
            f"{' '.join(argv)} (log: {log_path})")


@dataclass(frozen=True)
class CheckoutMode:
    """One way a commit is checked out (``engine.checkout``): its name, its folder in a
    repository's cache folder, and what it is, for messages."""

    name: str
    folder: str
    summary: str


#: How a commit is checked out (``engine.checkout``), by name; the first is the default.
CHECKOUT_MODES: Registry[CheckoutMode] = Registry("checkout mode")
CHECKOUT_MODES.add(CheckoutMode("worktree", "worktrees", "a git worktree; its .git is a file"))
CHECKOUT_MODES.add(CheckoutMode("tree", "trees", "the commit's files, no .git"))
CHECKOUT_MODES.add(CheckoutMode("clone", "clones", "a full clone, for build scripts that run git or read .git/index"))

#: Variables that change what a compiler makes, so they key a commit's build; a
#: spec adds its own with ``engine.build_env``. PATH is left out: the interpreter
#: (and so a commit's own environment) is in the key already.
BUILD_ENV = ("CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "CMAKE_ARGS", "CMAKE_BUILD_TYPE",
             "CMAKE_GENERATOR", "CUDA_HOME", "CUDACXX", "CUDAARCHS", "NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS",
             "TORCH_CUDA_ARCH_LIST", "ROCM_PATH", "HIPCXX")


def build_key(python: str, steps: Sequence[Sequence[str]] | Sequence[str], env: Mapping[str, str], *,
              mode: str = "worktree", build_env: Sequence[str] = ()) -> str:
    """A build's cache key: the interpreter, every rendered step's argv (one step keys as
    its argv alone, as a build of one argv always has), the checkout mode (a worktree's
    build is not a clone's) and the values of the build's variables (:data:`BUILD_ENV`
    and ``build_env``; an unset one counts as unset)."""
    names = sorted(set(BUILD_ENV) | set(build_env))
    steps = build_steps(steps)
    argv = list(steps[0]) if len(steps) == 1 else [list(step) for step in steps]
    fields = [python, argv, [[n, env.get(n)] for n in names]]
    if mode != "worktree":
        fields.append(mode)
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:12]


def _export(mirror: Path, sha: str, dest: Path) -> None:
    """The files of ``sha`` into ``dest`` (made here), as ``git archive`` writes them,
    read as a stream: nothing on disk but the files."""
    dest.mkdir(parents=True)
    proc = subprocess.Popen(["git", "--git-dir", str(mirror), "archive", "--format=tar", sha],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            tar.extractall(dest, filter="tar")  # no member outside dest, no setuid bits
    finally:
        proc.stdout.close()
        err = proc.stderr.read().decode(errors="replace").strip()
        proc.stderr.close()
        code = proc.wait()
    if code != 0:
        raise OSError(f"git archive {sha[:12]} exited {code}: {err}")


#: Seconds a run waits for another run's mirror, worktree or environment creation.
LOCK_TIMEOUT_S = 1800.0
#: A build's default timeout (``Workspace.build``), which a check of its commit may wait out.
BUILD_TIMEOUT_S = 3600.0


def sha_of(path: Path) -> str:
    """The commit a cached checkout or environment belongs to, from its folder's name."""
    return Path(path).name.split("-", 1)[0]


@contextlib.contextmanager
def _locked(lock: FileLock) -> Iterator[None]:
    try:
        with lock:
            yield
    except Timeout:
        raise InfrastructureError(f"another harness has held the cache lock {lock.lock_file} for "
                                  f"{lock.timeout:.0f}s; wait for it to finish, or give this run its own "
                                  "--cache-dir") from None


def _touch(path: Path) -> None:
    """Mark ``path`` as used now (``harness cache prune --older-than`` reads this)."""
    try:
        os.utime(path)
    except OSError:
        pass


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
