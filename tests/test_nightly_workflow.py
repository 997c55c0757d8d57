"""The nightly workflow (.github/workflows/nightly.yml), run here step by step.

No Actions runner is reachable from the tests, so a small runner below reads the
workflow and runs its ``run:`` steps, in order, with the job's env and GitHub's
``bash -eo pipefail``, in a temp folder. The ``uses:`` actions are the seams,
emulated as their documentation says: checkout copies the experiment folder,
cache/restore and cache/save copy the cached path to and from a store that
outlives a run, upload-artifact copies the matching files (or folder) out, the JUnit
report action reads its file as a check would. Each run has its own
``$GITHUB_STEP_SUMMARY`` file, and repository variables (``vars.*``) read empty, as
where none is set. The ``install``
step is checked but not run (the package is already installed here; installing
would change this environment). Three nights in a row on the demo engine show the
ledger kept between runs, the journal published each night, and the job's result
following the harness's exit code; a harness that exits 4 fails the job, and the
ledger and journal are still saved.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import xml.etree.ElementTree as ET

import pytest
import xmlschema
import yaml

from helpers import query

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"
JUNIT_SCHEMA = xmlschema.XMLSchema(str(Path(__file__).parent / "data" / "junit.xsd"))


class LocalRunner:
    """Runs one job of a workflow: ``run:`` steps for real, ``uses:`` steps emulated."""

    def __init__(self, workflow: Path, job: str, root: Path, harness_bin: Path):
        self.doc = yaml.safe_load(workflow.read_text())
        self.job = self.doc["jobs"][job]
        self.root, self.bin = root, harness_bin
        self.store = root / "actions-cache"      # outlives a workflow run, as the Actions cache does
        self.artifacts = root / "artifacts"
        self.checks = root / "checks"           # the JUnit files a check run was made of
        self.run_id = 0

    def expr(self, text: str) -> str:
        def one(m):
            name = m.group(1).strip()
            if name == "github.run_id":
                return str(self.run_id)
            if name.startswith("vars."):
                return ""
            raise AssertionError(f"the local runner does not know the expression {name!r}")
        return re.sub(r"\$\{\{(.*?)\}\}", one, str(text))

    def run(self) -> dict:
        """One workflow run in a fresh workspace; per step its result, and the job's."""
        self.run_id += 1
        ws = self.root / f"workspace-{self.run_id}"
        ws.mkdir()
        env = {**os.environ, **{k: self.expr(v) for k, v in (self.job.get("env") or {}).items()},
               "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}", "GITHUB_WORKSPACE": str(ws),
               "GITHUB_STEP_SUMMARY": str(ws.parent / f"step-summary-{self.run_id}.md")}
        shell = (self.job.get("defaults") or {}).get("run", {}).get("shell")
        assert shell == "bash", "run steps need bash -eo pipefail (GitHub's `shell: bash`)"
        failed, results = False, []
        for step in self.job["steps"]:
            always = str(step.get("if", "")).strip() == "always()"
            if failed and not always:
                results.append((step.get("name", step.get("uses")), "skipped", None))
                continue
            if "uses" in step:
                self.uses(step, ws)
                results.append((step.get("name", step["uses"]), "ok", None))
                continue
            if step.get("id") == "install":
                assert "pip install -e ." in step["run"]
                results.append((step["name"], "not run here", None))
                continue
            proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", self.expr(step["run"])],
                                  cwd=ws, env={**env, **{k: self.expr(v) for k, v in (step.get("env") or {}).items()}},
                                  capture_output=True, text=True, timeout=600)
            results.append((step["name"], "ok" if proc.returncode == 0 else "failed", proc))
            failed = failed or proc.returncode != 0
        return {"workspace": ws, "steps": results, "failed": failed,
                "proc": next(p for n, s, p in results if n == "Nightly check")}

    def uses(self, step: dict, ws: Path) -> None:
        action, with_ = step["uses"].split("@")[0], {k: self.expr(v) for k, v in (step.get("with") or {}).items()}
        if action == "actions/checkout":
            shutil.copytree(ROOT / "experiments" / "nightly-demo", ws / "experiments" / "nightly-demo")
        elif action == "actions/setup-python":
            assert with_["python-version"]
        elif action == "actions/cache/restore":
            saved = sorted(self.store.glob(f"{with_['restore-keys']}*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
            exact = self.store / with_["key"]
            src = exact if exact.exists() else (saved[-1] if saved else None)
            if src is not None:
                shutil.copytree(src / with_["path"], ws / with_["path"])
        elif action == "actions/cache/save":
            if (ws / with_["path"]).exists():
                shutil.copytree(ws / with_["path"], self.store / with_["key"] / with_["path"])
        elif action == "actions/upload-artifact":
            dest = self.artifacts / with_["name"]
            for pattern in str(with_["path"]).split():
                for f in glob.glob(str(ws / pattern)):
                    dest.mkdir(parents=True, exist_ok=True)
                    if Path(f).is_dir():  # a folder uploads its contents
                        shutil.copytree(f, dest, dirs_exist_ok=True)
                    else:
                        shutil.copy2(f, dest / Path(f).name)
        elif action == "mikepenz/action-junit-report":
            report = ws / with_["report_paths"]
            if report.exists():
                ET.parse(report)  # the action fails on a file that is not XML
                self.checks.mkdir(parents=True, exist_ok=True)
                shutil.copy2(report, self.checks / f"{self.run_id}-{report.name}")
            else:
                assert str(with_.get("require_tests", "true")).lower() == "false", "a missing report fails the check"
        else:
            raise AssertionError(f"the local runner does not emulate {action}")


def _harness_bin(folder: Path, body: str | None = None) -> Path:
    """A ``harness`` on PATH: this interpreter and this tree (or ``body``, a stand-in)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "harness"
    script.write_text(body or f'#!/bin/sh\nexec "{sys.executable}" -m bisect_harness.cli "$@"\n')
    script.chmod(0o755)
    return folder


@pytest.mark.slow
def test_three_nights_keep_the_ledger_publish_the_journal_and_fail_only_on_an_alert(tmp_path):
    runner = LocalRunner(WORKFLOW, "nightly", tmp_path, _harness_bin(tmp_path / "bin"))
    assert "schedule" in runner.doc[True] and runner.doc[True]["schedule"][0]["cron"]  # `on:` reads as True
    nights = [runner.run() for _ in range(3)]
    for i, night in enumerate(nights, start=1):
        proc = night["proc"]
        assert proc.returncode in (0, 4), proc.stderr[-3000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert night["failed"] == (proc.returncode == 4) == out["alert"]
        after = [name for name, _, _ in night["steps"]].index("Nightly check") + 1
        assert {s for _, s, _ in night["steps"][after:]} == {"ok"}  # the ledger, journal, answers saved even so
        # the ledger came back from the cache: tonight's run is the i-th nightly run in it
        db = night["workspace"] / ".nightly" / "ledger" / "results.db"
        assert [r for (r,) in query(db, "SELECT id FROM runs WHERE kind = 'nightly' ORDER BY id")] == list(range(1, i + 1))
        assert out["changepoints"]["nights"] == i and out["changepoints"]["points"] == []
        # the journal was published: tonight's page, its index of every night, the JSON
        art = tmp_path / "artifacts" / f"nightly-journal-{i}"
        assert (art / "nightly.json").read_text().strip() == proc.stdout.strip().splitlines()[-1]
        (page,) = art.glob(f"*-nightly-demo-run{i}.md")
        text = page.read_text()
        assert f"## Nightly check: {out['status']}" in text
        assert f"Change points over the whole series: change points over {i} night(s) of tok_s: 0 found" in text
        index = (art / "index.md").read_text()
        assert all(f"| {r} |" in index for r in range(1, i + 1))
        # the answers where CI reads them: the step summary, the JUnit check, the HTML report
        summary = (night["workspace"].parent / f"step-summary-{i}.md").read_text()
        assert summary.startswith(f"## nightly-demo: nightly check {out['status']}")
        assert out["reason"] in summary.split("<details>")[0] and "</details>" in summary
        assert "](http" not in summary  # no site address given: no links
        report = tmp_path / "checks" / f"{i}-junit.xml"
        JUNIT_SCHEMA.validate(str(report))
        (case,) = ET.parse(report).getroot().iter("testcase")
        ended = next((c.tag for c in case), "passed")
        assert ended == {"first-night": "skipped", "ok": "passed"}.get(out["status"], "failure")
        assert (tmp_path / "artifacts" / f"nightly-report-{i}" / "index.html").exists()
    last = [json.loads(n["proc"].stdout.strip().splitlines()[-1]) for n in nights]
    assert nights[0]["proc"].returncode == 0 and last[0]["status"] == "first-night"
    assert last[2]["nights_compared"] == 2


def test_an_alert_fails_the_job_and_still_saves_the_ledger_and_journal(tmp_path):
    # the harness itself is the seam here: a stand-in that exits 4 as an alerting night does
    stand_in = ('#!/bin/sh\nif [ "$1" = nightly ]; then mkdir -p .nightly/ledger && echo kept > .nightly/ledger/results.db;'
                ' echo \'{"alert": true}\'; exit 4; fi\necho "bisect-harness stand-in"\n')
    runner = LocalRunner(WORKFLOW, "nightly", tmp_path, _harness_bin(tmp_path / "bin", stand_in))
    night = runner.run()
    assert night["failed"] and night["proc"].returncode == 4
    steps = {name: status for name, status, _ in night["steps"]}
    assert steps["Nightly check"] == "failed"
    assert steps["Save the ledger"] == "ok" and steps["Publish the journal"] == "ok"
    assert steps["Publish the JUnit results"] == "ok" and steps["Publish the report"] == "ok"
    assert (tmp_path / "actions-cache" / "nightly-ledger-1" / ".nightly" / "ledger" / "results.db").read_text() == "kept\n"
    assert json.loads((tmp_path / "artifacts" / "nightly-journal-1" / "nightly.json").read_text()) == {"alert": True}
