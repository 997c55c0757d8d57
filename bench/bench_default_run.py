"""The repository's default experiment, end to end, timed.

Runs ``harness run hypotheses.yaml`` on the demo engine in a fresh temp folder with
a fresh cache (so the demo repository, its worktrees and builds are made too), and
checks the story it tells: the HEAD regression is confirmed and bisected to the
commit the demo generator planted, the no-effect flag is not confirmed, the
scrubbed tuning variable is flagged as not reaching the workers.

Goal (issue "The whole loop"): the whole run in 5 minutes or less on 2 CPU cores.

    python bench/bench_default_run.py

The last line printed is one JSON object.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "BISECT_HARNESS_CACHE": str(tmp / "cache")}
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "bisect_harness.cli", "run", str(ROOT / "hypotheses.yaml"),
                               "--ledger", f"sqlite:///{tmp / 'results.db'}", "--journal-dir", str(tmp / "exp"),
                               "--json"], env=env, cwd=tmp, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL)
        wall = time.monotonic() - start
        if proc.returncode != 0:
            print(proc.stderr[-3000:])
            print(json.dumps({"ok": False, "exit_code": proc.returncode, "wall_s": wall}))
            return 1
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        verdicts = {h["id"]: h for h in summary["hypotheses"]}

        from bisect_harness.demo import read_demo_history
        from bisect_harness.record.ledger import Bisection, Ledger
        from sqlalchemy import select

        demo = next((tmp / "cache").glob("demo-engine-v*"))
        events = read_demo_history(demo).events
        with Ledger(f"sqlite:///{tmp / 'results.db'}") as led:
            bis = led.session.scalars(select(Bisection)).first()
            result = (bis.result or {}) if bis else {}
        env_flagged = any("env_missing" in w for w in verdicts["comm-tuning"]["warnings"])
        out = {
            "wall_s": round(wall, 1),
            "goal_s": 300,
            "within_goal": wall <= 300,
            "verdicts": {k: v["verdict"] for k, v in verdicts.items()},
            "regression_ratio": verdicts["head-regression"]["effect"],
            "culprit_correct": result.get("culprit") == events["regression"],
            "culprit_probability": result.get("probability"),
            "bisection_boots": result.get("new_boots"),
            "no_effect_flag_confirmed": verdicts["attention-mode-decode"]["verdict"] == "confirmed",
            "env_scrub_flagged": env_flagged,
        }
        for k, v in out["verdicts"].items():
            print(f"{k:24s} {v}")
        print(f"wall {wall:.0f}s; culprit correct: {out['culprit_correct']} (p={out['culprit_probability']})")
        print(json.dumps(out))
        return 0


if __name__ == "__main__":
    sys.exit(main())
