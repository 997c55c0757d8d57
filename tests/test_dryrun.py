"""``harness run --dry-run``: the plan, as text and as JSON, with nothing booted.

The SGLang example is planned on a machine that has neither SGLang nor its
checkout: revisions stay as written. A demo spec, whose repository exists,
gets its revisions resolved to full shas. Every run happens in an empty
working folder, so a ledger or journal written by mistake would show.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bisect_harness.demo import create_demo_repo

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "experiments" / "sglang-eagle3" / "hypotheses.yaml"
NCCL_TUNING = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_MIN_NCHANNELS": "16"}
STEP_IDS = {n: f"eagle3-steps[speculative-num-steps={n}]" for n in (1, 2, 3)}


def harness(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bisect_harness.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def assert_nothing_written(cwd: Path) -> None:
    """No ledger, no journal, no boot log: the working folder holds only what the test put there."""
    assert not (cwd / "results.db").exists()
    assert not (cwd / "experiments").exists()
    assert not list(cwd.rglob("*.db"))
    assert not list(cwd.rglob("*.log"))


def flag_value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


@pytest.fixture
def example(tmp_path) -> Path:
    """The SGLang example, byte for byte, three folders deep: its ``engine.repo``
    (``../../../sglang``) then points at ``tmp_path/sglang``, which never exists."""
    target = tmp_path / "a" / "b" / "c" / "hypotheses.yaml"
    target.parent.mkdir(parents=True)
    shutil.copyfile(EXAMPLE, target)
    work = tmp_path / "work"
    work.mkdir()
    return target


def test_example_plan_as_json(example, tmp_path):
    work = tmp_path / "work"
    proc = harness(["run", str(example), "--dry-run", "--json", "--ledger", f"sqlite:///{work / 'l.db'}"], work)
    assert proc.returncode == 0, proc.stderr
    plan = last_json(proc.stdout)
    assert_nothing_written(work)

    hyps = {h["id"]: h for h in plan["hypotheses"]}
    # The step matrix expands into three hypotheses: 4 plain + 3 = 7.
    assert set(hyps) == {"eagle3-speedup", *STEP_IDS.values(), "nccl-tuning", "verify-attention-mode",
                         "eagle3-regression", "plain-vs-eagle"}
    configs = {c["key"]: c for c in plan["configs"]}
    # plain HEAD; EAGLE-3 2 steps (shared by speedup, nccl baseline, regression treatment);
    # three step counts; nccl treatment; two attention modes; HEAD~200; plain at HEAD~200 and
    # the tuned EAGLE-3 config of plain-vs-eagle.
    assert len(plan["configs"]) == len(configs) == 11
    assert plan["defaults"] == {"boots_per_arm": 3, "max_boots_per_arm": 6, "samples_per_boot": 3, "alpha": 0.05,
                                "max_samples_per_boot": 16, "boot_cost_s": None, "sample_cost_s": None}

    # a build is declared: each commit gets its own environment, so {python} is known only at boot
    assert plan["environment"] == {"mode": "venv", "base_python": sys.executable}
    for c in plan["configs"]:
        argv = c["argv"]
        assert argv[:3] == ["{python}", "-m", "sglang.launch_server"], argv
        assert flag_value(argv, "--port") == "{port}", "the port is chosen per boot, so it stays a placeholder"
        assert flag_value(argv, "--host") == "127.0.0.1"
        assert flag_value(argv, "--tp-size") == "8"
        assert c["env"]["NCCL_NVLS_ENABLE"] == "0"
        assert c["boots"] == {"min": 3, "max": 6}
        assert c["commit"] in ("HEAD", "HEAD~200"), "revisions stay as written when the repo is absent"
        assert c["hypotheses"], "every config is used by some hypothesis"

    plain = configs[hyps["eagle3-speedup"]["baseline"]]
    assert "--speculative-algorithm" not in plain["argv"]
    assert all(configs[h["baseline"]] is plain for h in hyps.values() if h["id"] in STEP_IDS.values())
    plain_old = configs[hyps["plain-vs-eagle"]["baseline"]]  # plain decoding at HEAD~200
    assert "--speculative-algorithm" not in plain_old["argv"] and plain_old["commit"] == "HEAD~200"
    eagle_users = [c for c in plan["configs"] if c is not plain and c is not plain_old]
    for c in eagle_users:
        assert flag_value(c["argv"], "--speculative-algorithm") == "EAGLE3", c["argv"]

    for n, hid in STEP_IDS.items():
        treat = configs[hyps[hid]["treatment"]]
        assert flag_value(treat["argv"], "--speculative-num-steps") == str(n)
        assert treat["argv"].count("--speculative-num-steps") == 1
        assert treat["hypotheses"] == [hid]

    # NCCL tuning reaches only the nccl-tuning treatment; NVLS is off everywhere.
    tuned = configs[hyps["nccl-tuning"]["treatment"]]
    assert tuned["env"] == {"NCCL_NVLS_ENABLE": "0", **NCCL_TUNING}
    first_run = configs[hyps["plain-vs-eagle"]["treatment"]]
    for c in plan["configs"]:
        if c is not tuned and c is not first_run:
            assert c["env"] == {"NCCL_NVLS_ENABLE": "0"}, c["env"]
    assert first_run["env"] == tuned["env"]
    assert hyps["plain-vs-eagle"]["explain"] is True
    assert tuned["argv"] == configs[hyps["nccl-tuning"]["baseline"]]["argv"], "env is the only difference"

    reg = hyps["eagle3-regression"]
    assert reg["bisect"] is True and reg["expect"] == "decrease" and reg["min_effect"] == pytest.approx(0.10)
    assert configs[reg["baseline"]]["commit"] == "HEAD~200"
    assert configs[reg["treatment"]]["commit"] == "HEAD"
    assert reg["treatment"] == hyps["eagle3-speedup"]["treatment"], "equal arms share one config"

    mode = hyps["verify-attention-mode"]
    assert mode["metric"] == "verify_ms" and mode["expect"] == "decrease"
    sources = plan["metric_sources"]
    assert sources[0].startswith("log source 'verify_ms': median 'value' of")
    assert len(sources) == len({s.split("'")[1] for s in sources}) >= 2
    assert flag_value(configs[mode["baseline"]]["argv"], "--speculative-attention-mode") == "prefill"
    assert flag_value(configs[mode["treatment"]]["argv"], "--speculative-attention-mode") == "decode"


def test_example_plan_as_text(example, tmp_path):
    work = tmp_path / "work"
    proc = harness(["run", str(example), "--dry-run"], work)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert_nothing_written(work)
    assert "8 hypotheses, 11 configs" in out
    assert "boots per config: 3 to 6 (sequential), 3 to 16 samples per boot" in out
    assert "noise prior: a hypothesis whose two configs an earlier run in the ledger compared" in out
    assert f"engine.repo {tmp_path / 'sglang'} does not exist here; revisions are shown as written" in out
    assert "commit: HEAD~200" in out
    assert f"python: each commit's own environment ({{python}} in argv), a venv over {sys.executable}" in out
    argv_lines = [line.split("argv:", 1)[1].strip() for line in out.splitlines() if line.strip().startswith("argv:")]
    assert len(argv_lines) == 11
    for line in argv_lines:  # one line each, and it parses back as the argv it shows
        argv = shlex.split(line)
        assert argv[:3] == ["{python}", "-m", "sglang.launch_server"]
        assert flag_value(argv, "--port") == "{port}"
    env_lines = [line for line in out.splitlines() if line.strip().startswith("env:")]
    assert len(env_lines) == 11 and all("NCCL_NVLS_ENABLE=0" in line for line in env_lines)
    assert sum("NCCL_PROTO=LL" in line for line in env_lines) == 2  # nccl-tuning and plain-vs-eagle treatments
    for n, hid in STEP_IDS.items():
        assert f"hypothesis {hid}: config 1 vs config" in out
    assert "hypothesis eagle3-regression: config 9 vs config 2, tok_s decrease >= 10.0%, bisect if confirmed" in out
    # each declared metric source says, in one line, what it reads
    assert "\nmetric sources:\n  log source 'verify_ms': median 'value' of the server log's new lines matching " in out
    assert "[ms], lower is better" in out


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return create_demo_repo(tmp_path_factory.mktemp("dryrun-demo") / "engine")


DEMO_SPEC = """\
version: 1
engine:
  preset: demo
  repo: {repo}
  env: {{NCCL_NVLS_ENABLE: "0"}}
hypotheses:
  - id: head-regression
    statement: HEAD decodes at least 10% slower than HEAD~26
    baseline: {{commit: {base}}}
    treatment: {{commit: HEAD}}
    metric: tok_s
    expect: decrease
    min_effect: 10%
  - id: attention
    statement: attention mode decode is faster
    baseline: {{commit: HEAD}}
    treatment: {{commit: HEAD, flags: {{attention-mode: decode}}}}
    metric: tok_s
    expect: increase
    min_effect: 5%
"""


def planned(spec: Path, tmp_path: Path) -> tuple[dict, Path]:
    """``harness run SPEC --dry-run --json`` from an empty working folder: (the plan, that folder)."""
    work = tmp_path / "work"
    work.mkdir()
    proc = harness(["run", str(spec), "--dry-run", "--json"], work)
    assert proc.returncode == 0, proc.stderr
    assert_nothing_written(work)
    return last_json(proc.stdout), work


def test_demo_plan_resolves_revisions_to_full_shas(demo, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(DEMO_SPEC.format(repo=demo.path, base="HEAD~26"))
    plan, work = planned(spec, tmp_path)
    configs = {c["key"]: c for c in plan["configs"]}
    hyps = {h["id"]: h for h in plan["hypotheses"]}
    assert len(configs) == 3, "HEAD plain is shared by both hypotheses"
    assert configs[hyps["head-regression"]["baseline"]]["commit"] == demo.shas[-27]
    assert configs[hyps["head-regression"]["treatment"]]["commit"] == demo.head
    assert configs[hyps["attention"]["treatment"]]["commit"] == demo.head
    for c in plan["configs"]:
        assert c["argv"] == ["{python}", "serve.py", "--host", "127.0.0.1", "--port", "{port}",
                             *(["--attention-mode", "decode"] if c["flags"] else [])]

    text = harness(["run", str(spec), "--dry-run"], work)
    assert text.returncode == 0, text.stderr
    assert f"commit: {demo.shas[-27]}" in text.stdout and f"commit: {demo.head}" in text.stdout
    assert "does not exist here" not in text.stdout
    assert_nothing_written(work)


def test_demo_plan_with_an_unknown_revision_names_the_hypothesis(demo, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(DEMO_SPEC.format(repo=demo.path, base="no-such-branch"))
    work = tmp_path / "work"
    work.mkdir()
    proc = harness(["run", str(spec), "--dry-run", "--json"], work)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "no-such-branch" in proc.stderr and "head-regression" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert_nothing_written(work)


def test_the_readme_experiment_plans_its_bisection_and_its_explanation(demo, tmp_path):
    # The repository's own hypotheses.yaml (README's main command), pointed at a demo
    # repository made here: it bisects the HEAD regression and explains the tuned launch.
    spec = yaml.safe_load((ROOT / "hypotheses.yaml").read_text())
    spec["engine"]["repo"] = str(demo.path)
    path = tmp_path / "hypotheses.yaml"
    path.write_text(yaml.safe_dump(spec))
    plan, _ = planned(path, tmp_path)
    hyps = {h["id"]: h for h in plan["hypotheses"]}
    assert hyps["head-regression"]["bisect"] and not hyps["head-regression"]["explain"]
    tuned = hyps["tuned-launch"]
    assert tuned["explain"] and tuned["metric"] == "decode_tok_s"
    configs = {c["key"]: c for c in plan["configs"]}
    assert configs[tuned["treatment"]]["env"] == {"NCCL_PROTO": "Simple"}
    assert configs[tuned["treatment"]]["commit"] == configs[tuned["baseline"]]["commit"] == demo.head
