"""Bisecting released builds, then the commits between two of them.

Real parts: the demo engine's generated history, tagged ``v0.1.0`` .. ``v0.8.0`` at
eight commits that build; a wheel of each release built from its tag
(``bisect_harness.demo.releases``) into a folder that pip reads with
``--find-links``. A run comparing two releases installs each by pip into an
environment of its own and boots real servers on 127.0.0.1; its boots name the
version installed and the hash of the very wheel. The planted regression lies between
two releases, with commits in between to descend into: the search over the releases
and its descent to the commit are search logic, so they run in this process with their
boots answered by the mock backend (``mock_boots.Planted``: the history's regression,
1.9x, at the release that holds it and at its commits); a bisection on real demo
servers is ``test_bisect_cli``'s and ``test_slurm_e2e``'s.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bisect_harness.engines.releases import ReleaseSource
from bisect_harness.demo import create_demo_repo
from bisect_harness.demo.releases import build_demo_releases, release_points, tag_releases
from bisect_harness.errors import CommitError, SpecError
from bisect_harness.spec import parse_spec

from helpers import query
from mock_boots import Planted, harness_here

DECODE = {"name": "decode_ms", "from": "log", "pattern": "decode cycle: (?P<value>[0-9.]+) ms/cyc",
          "reduce": "median", "unit": "ms", "better": "lower"}


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    root = tmp_path_factory.mktemp("releases")
    hist = create_demo_repo(root / "engine")
    points = release_points(hist)
    tag_releases(hist.path, points)
    wheels = build_demo_releases(hist.path, points, root / "wheels")
    return hist, points, wheels


def _spec(path: Path, hist, wheels: Path, hypotheses=None, defaults=None) -> Path:
    doc = {
        "version": 1,
        "engine": {
            "preset": "demo", "repo": str(hist.path), "metrics": [DECODE],
            "releases": {"package": "demo-engine", "index": str(wheels), "tag": "v{version}",
                         "launch": ["{python}", "-m", "demo_engine", "--host", "{host}", "--port", "{port}"]},
        },
        "benchmark": {"prompt_tokens": 16, "output_tokens": 32, "requests_per_sample": 2, "warmup_requests": 1},
        "defaults": defaults or {"samples_per_boot": 1, "boots_per_arm": 2, "max_boots_per_arm": 4},
        "hypotheses": hypotheses or [{"id": "releases", "baseline": {"release": "0.1.0"},
                                      "treatment": {"release": "0.8.0"}, "metric": "decode_ms",
                                      "expect": "increase", "min_effect": "10%"}],
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_the_versions_in_a_folder_are_ordered_by_pep_440(tmp_path):
    for name in ("demo_engine-0.9.0-py3-none-any.whl", "demo_engine-0.10.0-py3-none-any.whl",
                 "demo-engine-0.2.0.tar.gz", "other_pkg-1.0.0-py3-none-any.whl", "README.txt"):
        (tmp_path / name).write_bytes(b"")
    src = ReleaseSource("demo-engine", str(tmp_path))
    assert src.versions() == ("0.2.0", "0.9.0", "0.10.0")
    assert src.between("0.2.0", "0.10.0") == ("0.2.0", "0.9.0", "0.10.0")
    with pytest.raises(CommitError, match="--bad 0.11.0: no such release of demo-engine"):
        src.between("0.2.0", "0.11.0")
    with pytest.raises(CommitError, match="is not older than"):
        src.between("0.10.0", "0.9.0")


def test_a_release_arm_needs_engine_releases_and_is_not_also_a_commit(tmp_path):
    base = {"version": 1, "engine": {"preset": "openai", "launch": ["srv", "--port", "{port}"]},
            "hypotheses": [{"id": "h", "baseline": {"release": "1.0"}, "treatment": {}, "metric": "tok_s",
                            "expect": "decrease", "min_effect": "5%"}]}
    with pytest.raises(SpecError, match="this engine has no releases") as info:
        parse_spec(yaml.safe_dump(base), tmp_path / "h.yaml")
    assert info.value.key == "hypotheses[0].baseline.release"
    base["engine"]["releases"] = {"package": "srv", "index": "wheels", "tag": "v{version}"}
    base["engine"]["repo"] = str(tmp_path)
    base["hypotheses"][0]["baseline"]["commit"] = "HEAD"
    with pytest.raises(SpecError, match="a release or a commit, not both"):
        parse_spec(yaml.safe_dump(base), tmp_path / "h.yaml")
    base["engine"]["releases"]["tag"] = "v-latest"
    with pytest.raises(SpecError, match="must hold {version}") as info:
        parse_spec(yaml.safe_dump(base), tmp_path / "h.yaml")
    assert info.value.key == "engine.releases.tag"


def _harness(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    # The session's cache (conftest's harness_cache): each release's environment and each
    # commit's build is made once in the session, whichever test asks first, as a user's
    # cache keeps them between runs; a test of the install itself reads the provenance.
    return subprocess.run([sys.executable, "-m", "bisect_harness.cli", *args, "--json",
                           "--ledger", f"sqlite:///{tmp_path / 'r.db'}", "--journal-dir", str(tmp_path / "journal")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)


def test_a_bisection_over_releases_names_the_release_then_descends_to_the_commit(released, tmp_path):
    hist, points, wheels = released
    culprit_commit = hist.events["regression"]
    order = list(points)
    # the release that first holds the regression, by the history's own order
    expected = next(v for v in order if hist.index(points[v]) >= hist.index(culprit_commit))
    planted = Planted(slow_from=[*hist.shas[hist.index(culprit_commit):],
                                 *(v for v in order if hist.index(points[v]) >= hist.index(culprit_commit))])
    spec = _spec(tmp_path / "hypotheses.yaml", hist, wheels)
    proc = harness_here("bisect", spec, "--good", order[0], "--bad", order[-1], "--metric", "decode_ms",
                        "--max-boots", "120", "--json", "--ledger", f"sqlite:///{tmp_path / 'r.db'}",
                        "--journal-dir", tmp_path / "journal", handler=planted, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["revisions"] == "releases" and out["culprit"] == expected, out
    descent = out["descent"]
    assert descent is not None, out["descent_note"]
    assert descent["culprit"] == culprit_commit and descent["stopped"] == "confident", descent
    assert f"culprit release: {expected}" in proc.stderr and f"culprit commit: {culprit_commit}" in proc.stderr
    # the search booted releases, then only commits between the culprit release and the one before it
    before = order[order.index(expected) - 1]
    between = hist.shas[hist.index(points[before]):hist.index(points[expected]) + 1]
    assert set(planted.booted) & set(order) and set(planted.booted) & set(hist.shas)
    assert set(planted.booted) & set(hist.shas) <= set(between)

    # both stages are in one journal
    (journal,) = [p for p in (tmp_path / "journal").glob("*.md") if p.name != "index.md"]
    text = journal.read_text()
    assert "The revisions were releases" in text and f"culprit `{culprit_commit[:12]}`" in text
    assert "## Bisection 1: 0.1.0..0.8.0" in text and "## Bisection 2: " in text


def _bisect_releases(tmp_path: Path, released, max_boots: int, **noise) -> tuple:
    """``harness bisect`` over every release of the demo history, its boots answered by a
    planted history (the regression 1.9x with 3% noise unless ``noise`` says otherwise):
    the process, its JSON, the release that holds the regression."""
    hist, points, wheels = released
    culprit_commit, order = hist.events["regression"], list(points)
    slow = [v for v in order if hist.index(points[v]) >= hist.index(culprit_commit)]
    planted = Planted(slow_from=[*hist.shas[hist.index(culprit_commit):], *slow], **noise)
    spec = _spec(tmp_path / "hypotheses.yaml", hist, wheels)
    proc = harness_here("bisect", spec, "--good", order[0], "--bad", order[-1], "--metric", "decode_ms",
                        "--max-boots", max_boots, "--json", "--ledger", f"sqlite:///{tmp_path / 'r.db'}",
                        "--journal-dir", tmp_path / "journal", handler=planted, cwd=tmp_path)
    return proc, json.loads(proc.stdout.strip().splitlines()[-1]), slow[0]


def _said(proc, start: str) -> int:
    lines = proc.stderr.splitlines()
    return next(i for i, x in enumerate(lines) if x.startswith(start))


def test_the_release_stage_uses_its_share_only_and_no_culprit_exits_6(released, tmp_path):
    # Noisy boots and a 25% step: the release stage would spend more than it may. It is
    # given --max-boots less what the commit stage plans to need, says so first, and
    # keeps to it; stopped on that budget it names no culprit: exit 6, never 0.
    proc, out, _ = _bisect_releases(tmp_path, released, 100, noise=0.15, factor=1.25)
    keeps = _said(proc, "bisection plan: the commit stage, up to ")
    line = proc.stderr.splitlines()[keeps]
    share = out["plan"]["budget"]
    commit_planned = int(re.search(r"about (\d+) boots planned", line).group(1))
    assert f"the release stage may use {share} of --max-boots 100, keeping {100 - share} for it" in line
    assert share == 100 - commit_planned < 100
    assert out["plan"]["planned_boots"] > share and out["plan"]["least_boots"] <= share
    assert keeps < _said(proc, "bisection plan: release stage, 8 revisions (7 candidates)") < _said(
        proc, "bisect step 1: ")
    assert out["new_boots"] <= share, out
    assert out["culprit"] is None and out["stopped"] == "budget" and out["descent"] is None
    assert proc.returncode == 6, proc.stderr[-3000:]


def test_a_commit_stage_that_cannot_finish_in_what_is_left_says_so_and_is_not_started(released, tmp_path):
    # --max-boots 30 leaves the release stage its least (16): boots of 0.5% noise let it name the
    # release in those (3% sometimes asks one probe more, and 1% did once in a whole run: the noise
    # draws follow the configs' keys, which hold this session's folders); the commit stage then has
    # 14 left.
    proc, out, expected = _bisect_releases(tmp_path, released, 30, noise=0.005)
    assert out["culprit"] == expected and out["stopped"] == "confident", out
    left = 30 - out["new_boots"]
    both = _said(proc, "bisection: --max-boots 30 cannot finish both stages: they need at least ")
    assert both < _said(proc, "bisect step 1: ")
    line = proc.stderr.splitlines()[_said(proc, f"bisection: culprit release {expected}, but the commit stage "
                                                f"cannot finish in {left} boots: it needs at least ")]
    assert "raise --max-boots to at least " in line
    assert out["descent"] is None and "cannot finish" in out["descent_note"]
    assert "culprit commit:" not in proc.stderr
    assert proc.returncode == 6, proc.stderr[-3000:]


# --------------------------------------------------------------------------- releases as container images
# No container runtime runs on the machines this is tested on: the runner is tested up
# to the runtime's argv, and the digest lookup against a stand-in client on PATH.


@pytest.mark.parametrize("runtime, head", [
    ("docker", ["docker", "run", "--rm", "--init", "--network", "host", "--name", "bh-1", "--gpus", "all",
                "-e", "NCCL_ALGO=Ring", "img:v1"]),
    ("podman", ["podman", "run", "--rm", "--init", "--network", "host", "--name", "bh-1", "--gpus", "all",
                "-e", "NCCL_ALGO=Ring", "img:v1"]),
    ("apptainer", ["apptainer", "exec", "--cleanenv", "--gpus", "all", "--env", "NCCL_ALGO=Ring", "img:v1"]),
    ("enroot", ["enroot", "start", "--rw", "--gpus", "all", "-e", "NCCL_ALGO=Ring", "img:v1"]),
])
def test_each_runtime_runs_the_launch_inside_the_image_with_the_arms_env(runtime, head):
    from bisect_harness.engines.releases import container_argv

    argv = container_argv(runtime, "img:v1", ["python3", "-m", "sglang.launch_server", "--port", "8000"],
                          {"NCCL_ALGO": "Ring"}, name="bh-1", runtime_args=["--gpus", "all"])
    assert argv == head + ["python3", "-m", "sglang.launch_server", "--port", "8000"]


def test_an_image_release_plans_its_runtime_argv_and_is_known_by_its_digest(tmp_path, monkeypatch):
    from bisect_harness.engines.releases import ReleaseRequest, image_record
    from bisect_harness.errors import BuildFailed
    from bisect_harness.spec import load_spec
    from bisect_harness.plan.build import make_plan

    doc = {"version": 1,
           "engine": {"preset": "openai", "launch": ["srv"],
                      "releases": {"package": "engine", "image": "registry.invalid/engine:v{version}",
                                   "versions": ["1.0", "1.1"], "runtime": "docker",
                                   "launch": ["python3", "-m", "engine.serve", "--port", "{port}"]}},
           "hypotheses": [{"id": "h", "baseline": {"release": "1.0"}, "treatment": {"release": "1.1",
                                                                                   "env": {"NCCL_ALGO": "Ring"}},
                           "metric": "tok_s", "expect": "decrease", "min_effect": "5%"}]}
    path = tmp_path / "h.yaml"
    path.write_text(yaml.safe_dump(doc))
    plan = make_plan(load_spec(path), cache_dir=tmp_path / "cache")
    treat = plan.recipe(plan.hypotheses[0].treatment)
    assert list(treat.argv) == ["docker", "run", "--rm", "--init", "--network", "host", "--name",
                                "bisect-harness-{port}", "-e", "NCCL_ALGO=Ring", "registry.invalid/engine:v1.1",
                                "python3", "-m", "engine.serve", "--port", "{port}"]
    req = treat.request.release
    assert (req.image, req.version) == ("registry.invalid/engine:v1.1", "1.1")

    # a stand-in docker client on PATH: `image inspect` knows v1.1 and nothing else; pull fails
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(
        "#!/bin/sh\n"
        'if [ "$1 $2" = "image inspect" ]; then\n'
        '  case "$5" in *:v1.1) echo sha256:0123abcd; exit 0;; esac\n'
        '  echo "Error: No such image: $5" >&2; exit 1\n'
        "fi\n"
        'if [ "$1" = "pull" ]; then echo "pull access denied for $2" >&2; exit 1; fi\n'
        "exit 2\n")
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    rec = image_record(req)
    assert rec == {"package": "engine", "version": "1.1", "image": "registry.invalid/engine:v1.1",
                   "runtime": "docker", "digest": "sha256:0123abcd"}
    with pytest.raises(BuildFailed, match="the image registry.invalid/engine:v1.0 of release 1.0 is not available"):
        image_record(ReleaseRequest("engine", "1.0", "", image="registry.invalid/engine:v1.0", runtime="docker"))


@pytest.mark.slow
def test_a_run_compares_two_releases_each_from_its_own_environment(released, tmp_path):
    hist, points, wheels = released
    order = list(points)
    culprit = next(v for v in order if hist.index(points[v]) >= hist.index(hist.events["regression"]))
    before = order[order.index(culprit) - 1]
    spec = _spec(tmp_path / "hypotheses.yaml", hist, wheels, hypotheses=[
        {"id": "release-regression", "baseline": {"release": before}, "treatment": {"release": culprit},
         "metric": "decode_ms", "expect": "increase", "min_effect": "10%"}],
        # two samples a boot and up to 6 boots an arm: on a shared CI host one boot of 4 once read 2x
        # slower than its neighbours and left the planted +40% inconclusive (0.93-2.26x)
        defaults={"samples_per_boot": 2, "boots_per_arm": 2, "max_boots_per_arm": 6})
    proc = _harness(tmp_path, "run", str(spec), "--no-calibration")
    assert proc.returncode == 0, proc.stderr[-4000:]
    (h,) = json.loads(proc.stdout.strip().splitlines()[-1])["hypotheses"]
    assert h["verdict"] == "confirmed", h
    envs = {json.loads(p)["environment"]["python"]
            for (p,) in query(tmp_path / "r.db", "SELECT provenance FROM boots WHERE status = 'ok'")}
    assert len(envs) == 2 and all(f"/releases/demo-engine/{v}-" in e for v, e in zip(sorted([before, culprit]),
                                                                                         sorted(envs)))
    # the journal lists the commits between the two releases' tags, not "no commits to compare"
    (journal,) = [p for p in (tmp_path / "journal").glob("*.md") if p.name != "index.md"]
    text = journal.read_text()
    assert "no commits to compare" not in text and f"in v{before}..v{culprit}, newest first" in text, text
    assert hist.messages[hist.index(points[culprit])].splitlines()[0] in text

    # each release boot names the version installed and the hash of the very wheel
    wheel_sha = {p.name.split("-")[1]: hashlib.sha256(p.read_bytes()).hexdigest() for p in wheels.glob("*.whl")}
    rows = query(tmp_path / "r.db", "SELECT c.label, b.provenance FROM boots b JOIN configs c ON c.id = b.config_id "
                                    "WHERE b.status = 'ok'")
    released_boots = [(label, json.loads(p)) for label, p in rows if label.startswith("release ")]
    assert {label.split()[1] for label, _ in released_boots} == {before, culprit}
    for label, prov in released_boots:
        version = label.split()[1]
        rec = prov["environment"]["release"]
        assert (rec["version"], rec["sha256"]) == (version, wheel_sha[version]), (label, rec)
        assert "release_mismatch" not in prov
        assert version in prov["engine_version"]["label"]  # the server reports the release it is
    for version in (before, culprit):
        assert f"demo-engine {version} installed from `demo_engine-{version}-py3-none-any.whl`, sha256 " \
               f"{wheel_sha[version][:16]}" in text


def test_the_commits_between_two_releases_are_listed_from_their_tags(released, tmp_path):
    from bisect_harness.report.reproduce import commit_log

    hist, points, wheels = released
    spec = _spec(tmp_path / "hypotheses.yaml", hist, wheels)
    order = list(points)
    old, new = order[0], order[-1]
    lines, note = commit_log(spec.read_text(), str(spec), None, None, releases=(old, new))
    expected = subprocess.run(["git", "-C", str(hist.path), "rev-list", "--count", f"v{old}..v{new}"],
                              capture_output=True, text=True, check=True).stdout.strip()
    assert note.startswith(f"{expected} commit(s) in v{old}..v{new}") and lines, note
    assert lines[0].split()[0] == points[new][:len(lines[0].split()[0])]  # newest first: the release's own commit
    untagged = spec.read_text().replace("tag: v{version}\n", "")
    assert "tag:" not in untagged
    lines, note = commit_log(untagged, str(spec), None, None, releases=(old, new))
    assert lines == [] and "set engine.releases.tag" in note


def test_the_dry_run_shows_each_release_and_the_launch_it_runs(released, tmp_path):
    hist, points, wheels = released
    spec = _spec(tmp_path / "hypotheses.yaml", hist, wheels)
    proc = subprocess.run([sys.executable, "-m", "bisect_harness.cli", "run", str(spec), "--dry-run", "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [c["release"] for c in out["configs"]] == ["0.1.0", "0.8.0"]
    assert all(c["argv"][1:3] == ["-m", "demo_engine"] for c in out["configs"])


def test_bisect_help_says_what_a_revision_may_be():
    """--good and --bad take commits, tags, branches, or versions of engine.releases."""
    proc = subprocess.run([sys.executable, "-m", "bisect_harness.cli", "bisect", "--help"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "400", "NO_COLOR": "1"})
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.replace("│", " ").split())
    for flag in ("--good", "--bad"):
        line = text.split(flag, 1)[1][:400]
        assert "a commit (sha), tag or branch of engine.repo" in line, line
        assert "a released version (e.g. 1.4.2) where the file has engine.releases" in line, line
