"""SIGKILL a real run at seeded random points, resume it, count what the ledger says.

Each trial starts ``harness run`` on the demo engine (two hypotheses, three
configs, 2..3 boots per arm) in a session of its own, waits until the ledger
holds a seeded random number of finished boots plus a seeded random delay,
SIGKILLs the whole group, waits for the watchdog to stop the servers, and runs
``harness run FILE --resume`` to the end. From the ledger it counts, per trial:
whether every hypothesis got a final verdict, how many ok boots from before the
kill fed a verdict (counted) or were left out, boots cut short and whether any
fed a verdict, the most good boots of any config against ``max_boots_per_arm``,
configs that numbered two boots alike, and the share of the finished run's ok
boots that the resume did not have to boot again.

    python bench/bench_resume.py [--trials N] [--seed S]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

MAX_BOOTS = 3
SPEC = {
    "version": 1,
    "engine": {"preset": "demo", "repo": "engine"},
    "benchmark": {"prompt_tokens": 16, "output_tokens": 32, "requests_per_sample": 2, "warmup_requests": 1},
    "defaults": {"samples_per_boot": 2, "boots_per_arm": 2, "max_boots_per_arm": MAX_BOOTS},
    "hypotheses": [
        {"id": "head-regression", "baseline": {"commit": "HEAD~26"}, "treatment": {"commit": "HEAD"},
         "metric": "tok_s", "expect": "decrease", "min_effect": "10%"},
        {"id": "decode-attention", "baseline": {"commit": "HEAD"},
         "treatment": {"commit": "HEAD", "flags": {"attention-mode": "decode"}},
         "metric": "tok_s", "expect": "increase", "min_effect": "10%"},
    ],
}
HARNESS = [sys.executable, "-m", "bisect_harness.cli"]


def q(db: Path, sql: str) -> list[tuple]:
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)
    except sqlite3.Error:
        return []
    try:
        return con.execute(sql).fetchall()
    except sqlite3.Error:
        return []
    finally:
        con.close()


def ok_boots(db: Path) -> int:
    rows = q(db, "SELECT COUNT(*) FROM boots WHERE status = 'ok'")
    return rows[0][0] if rows else 0


def trial(tmp: Path, env: dict, rng: random.Random) -> dict:
    spec = tmp / "hypotheses.yaml"
    spec.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    db = tmp / "r.db"
    common = ["--no-calibration", "--ledger", f"sqlite:///{db}", "--journal-dir", str(tmp / "exp")]
    kill_after, delay = rng.randint(1, 6), rng.uniform(0.0, 3.0)
    t0 = time.monotonic()
    proc = subprocess.Popen([*HARNESS, "run", str(spec), *common], cwd=tmp, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    while proc.poll() is None and ok_boots(db) < kill_after and time.monotonic() - t0 < 600:
        time.sleep(0.2)
    time.sleep(delay)
    finished_first = proc.poll() is not None
    if not finished_first:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    first_s = time.monotonic() - t0
    time.sleep(3.0)  # the watchdog notices its harness is gone (about once a second) and stops the group
    ok_before = {i for (i,) in q(db, "SELECT id FROM boots WHERE status = 'ok'")}
    cut = {i for (i,) in q(db, "SELECT id FROM boots WHERE status = 'running'")}
    t1 = time.monotonic()
    res = subprocess.run([*HARNESS, "run", str(spec), "--resume", *common, "--json"], cwd=tmp, env=env,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    resume_s = time.monotonic() - t1
    finals = q(db, "SELECT h.hid, v.baseline_boot_ids, v.treatment_boot_ids FROM hypotheses h "
                   "JOIN verdicts v ON v.hypothesis_id = h.id WHERE v.final = 1")
    used = {i for _, b, t in finals for i in json.loads(b) + json.loads(t)}
    good = [n for _, n in q(db, "SELECT config_id, COUNT(*) FROM boots WHERE status = 'ok' GROUP BY config_id")]
    seqs = [s for _, s in q(db, "SELECT config_id, GROUP_CONCAT(seq) FROM boots GROUP BY config_id")]
    total_ok = sum(good)
    return {
        "kill_after_ok_boots": kill_after, "delay_s": round(delay, 2), "killed": not finished_first,
        "resume_exit": res.returncode, "runs": len(q(db, "SELECT id FROM runs")),
        "decided": sorted(h for h, _, _ in finals) == sorted(h["id"] for h in SPEC["hypotheses"]),
        "ok_before": len(ok_before), "ok_before_counted": len(ok_before & used),
        "cut_short": len(cut), "cut_short_in_verdicts": len(cut & used),
        "max_good_per_config": max(good, default=0), "configs_over_budget": sum(n > MAX_BOOTS for n in good),
        "configs_with_duplicate_seq": sum(len(s.split(",")) != len(set(s.split(","))) for s in seqs),
        "ok_total": total_ok, "reused_share": round(len(ok_before) / total_ok, 3) if total_ok else None,
        "journal_says_resumed": any("from before the resume at" in p.read_text() for p in (tmp / "exp").glob("*.md")),
        "first_s": round(first_s, 1), "resume_s": round(resume_s, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--seed", type=int, default=13)
    args = ap.parse_args()
    from bisect_harness.demo import create_demo_repo

    rng = random.Random(args.seed)
    rows = []
    with tempfile.TemporaryDirectory() as root:
        root = Path(root)
        env = {**os.environ, "BISECT_HARNESS_CACHE": str(root / "cache")}
        for i in range(args.trials):
            tmp = root / f"t{i}"
            tmp.mkdir()
            create_demo_repo(tmp / "engine")
            rows.append(trial(tmp, env, rng))
            r = rows[-1]
            print(f"trial {i}: killed after {r['kill_after_ok_boots']} ok boots + {r['delay_s']} s "
                  f"(killed={r['killed']}): ok before {r['ok_before']} (counted {r['ok_before_counted']}), "
                  f"cut short {r['cut_short']} (in verdicts {r['cut_short_in_verdicts']}), decided={r['decided']}, "
                  f"max good/config {r['max_good_per_config']}/{MAX_BOOTS}, reused {r['reused_share']}, "
                  f"resume exit {r['resume_exit']}", flush=True)
    killed = [r for r in rows if r["killed"]]
    summary = {
        "trials": len(rows), "killed": len(killed), "seed": args.seed,
        "all_decided": sum(r["decided"] and (r["resume_exit"] == 0 or not r["killed"]) for r in rows),
        "one_run_row": sum(r["runs"] == 1 for r in rows),
        "ok_boots_before_kill": sum(r["ok_before"] for r in killed),
        "ok_boots_before_kill_counted": sum(r["ok_before_counted"] for r in killed),
        "cut_short_boots": sum(r["cut_short"] for r in killed),
        "cut_short_in_verdicts": sum(r["cut_short_in_verdicts"] for r in rows),
        "configs_over_budget": sum(r["configs_over_budget"] for r in rows),
        "configs_with_duplicate_seq": sum(r["configs_with_duplicate_seq"] for r in rows),
        "journal_says_resumed": sum(r["journal_says_resumed"] for r in killed),
        "mean_reused_share": round(sum(r["reused_share"] or 0 for r in killed) / len(killed), 3) if killed else None,
        "rows": rows,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
