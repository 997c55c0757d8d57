"""Benchmark: ``harness bisect`` on llama.cpp's real history, against a culprit its maintainers named.

The regression (CPU, in ``llama-server``'s own sampling, whatever the backend):

* ggml-org/llama.cpp issue #9530, "Lower performance in pre-built binary
  llama-server, Since llama-b3681": decode fell from 60 to 40 tok/s between
  release b3680 and b3681 and stayed there.
* The culprit is b3681 itself, commit ``df270ef74596da8f1178f08991f4c51f18c9ee82``,
  "llama : refactor sampling v2 (#9294)". Its new greedy chain
  (``common/sampling.cpp``, ``gpt_sampler_init``) runs a softmax, which sorts the
  whole vocabulary, before every greedy pick; b3680 took the argmax
  (``llama_sample_token_greedy``) when ``temperature == 0``.
* The maintainers' fix names it: ``b0f27361f3539a81d983a8b045f3c61e682d9fc0``,
  "sampling : avoid expensive softmax during greedy sampling (#9605)" by
  ggerganov, "fix #9530" (2024-09-24, first in release b3816).

The cost is one sort of ``n_vocab`` candidates per generated token, so it shows
on a small model with a large vocabulary (the issue's reporters saw it on GPUs,
where the model itself is fast): the bench writes the tiny random-weight f16
Llama of ``tests/tinygguf.py`` with its vocabulary padded to TinyLlama's 32,000
pieces, and the harness's benchmark asks for greedy decoding (temperature 0, its
default). The default range is the 35 commits from ``49271efba`` (2024-08-31,
after the threadpool rewrite #8672) to ``e32d0816e``, the commit after the
culprit; the next one (#9330) changes the CPU matmul path for batch size 1 and
is left out.

What it does: writes the model and a hypotheses file to a temp folder (engine
``repo`` = ``--repo``, preset ``llamacpp``, a build of two steps per commit in the
harness's own checkout, no shell: ``cmake -B build ...`` then ``cmake --build build
-j2 --target llama-server``; metric = the server's own decode rate,
``timings.predicted_per_second`` of each stream's last chunk, declared as a
``from: response`` source), runs the real ``harness bisect ... --json`` in a
subprocess, echoes its progress, and scores its answer against the culprit.

No shim and no build-script work-around: the harness speaks the native stream
of that era's server itself (``benchmark.api: llamacpp``: ``POST /completion``,
``{"content": ..., "stop": ...}`` events, ``tokens_predicted`` and ``timings``
in the last one), and CMake's build-info of that era reads ``.git``, so the
checkouts are clones (``--checkout worktree`` or ``tree`` take the other modes;
``--build make`` the one-argv ``make -j2 llama-server`` the figures below were
measured with). ``--dry-run`` prints the harness's plan (checkout mode, each build
step and the launch per config) and boots nothing. The journal lists every paired
test the search ran and each boot's role. ccache is shared across the commits'
checkouts by the harness itself (``CCACHE_BASEDIR`` is each checkout's folder);
``CCACHE_NOHASHDIR`` is set for make, which compiles with ``-g`` and so puts the
checkout's folder into ccache's key.

Measured with ``--build make`` and the native API (no proxy, worktree checkouts), on
a shared 2-core x86 VM with every build already in ccache: ``harness bisect`` named ``df270ef74``
with P = 0.9999995 (stop reason ``confident``; endpoint test 3 pairs, p = 0.0054;
culprit against its parent 3 pairs, p = 0.0020), after 19 boots of 8 commits (8
builds, 14 s of them from ccache), in 59 s; the parent decoded at 3,900-4,800 tok/s,
the culprit at 380-400; prompts fitted by the server's ``/tokenize`` (2 words, 14
tokens for 16 asked: the padded vocabulary spends 7 pieces a word). Earlier,
through a translating proxy and with cold builds: the same commit, P = 0.999998,
19 boots, 1,377 s, of which builds took 1,276 s.

Run (2 CPU cores: a full build takes about 8 min on a busy host, ccache makes
most of the others short):

    git clone https://github.com/ggerganov/llama.cpp llama.cpp
    python bench/bench_real_history.py --repo llama.cpp [--good 49271efba] \\
        [--bad e32d0816e] [--culprit df270ef74] [--max-boots 60] [--cache-dir DIR] [--checkout clone] \\
        [--build cmake|make] [--dry-run]

Its progress is the harness's own output; the last line printed is one JSON
object: whether the culprit was named, the expected and named commits, the
posterior probability, builds made, boots, seconds and the stop reason.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

GOOD = "49271efba"      # llama : fix typo in xcda_array_view comment (2024-08-31)
BAD = "e32d0816e"       # ggml : always check bounds on get_rows operations (#9354), after the culprit
CULPRIT = "df270ef74"   # llama : refactor sampling v2 (#9294), release b3681
N_VOCAB = 32000         # TinyLlama's vocabulary size
METRIC = "server_decode_tok_s"


# --------------------------------------------------------------------------- the model

def write_model(path: Path, n_vocab: int = N_VOCAB) -> Path:
    """``tests/tinygguf.py``'s f16 model, its vocabulary padded with filler pieces to ``n_vocab``."""
    sys.path.insert(0, str(ROOT / "tests"))
    import tinygguf

    base = tinygguf._vocab

    def padded():
        tokens, scores, types = base()
        start = len(tokens)
        for i in range(start, n_vocab):
            tokens.append(f"\u2581x{i}")
            scores.append(-10.0 - i * 1e-4)
            types.append(types[-1])  # NORMAL, as the word pieces before them
        return tokens, scores, types

    tinygguf._vocab = padded
    try:
        return tinygguf.build_tiny_gguf(path, layers=2, hidden=64, heads=2, kv_heads=2, ff=128, ctx=512, f16=True)
    finally:
        tinygguf._vocab = base


# --------------------------------------------------------------------------- the spec

#: The build per commit, as argvs run in order in its checkout (no shell), and where it puts the server.
BUILDS = {
    "cmake": ([["cmake", "-B", "build", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=ON"],
               ["cmake", "--build", "build", "-j", "2", "--target", "llama-server"]], "build/bin/llama-server"),
    # make of that era writes build-info from `git rev-parse`, which works in a worktree
    "make": ([["make", "-j2", "llama-server"]], "llama-server"),
}


def write_spec(folder: Path, repo: Path, model: Path, good: str, bad: str, threads: int,
               checkout: str = "clone", build: str = "cmake") -> Path:
    steps, server = BUILDS[build]
    doc = {
        "version": 1,
        "engine": {
            "preset": "llamacpp",
            "repo": str(repo),
            "checkout": checkout,
            "build": steps,
            "environment": "shared",
            "launch": ["{worktree}/" + server, "-m", str(model), "-c", "512", "-t", str(threads), "-np", "1",
                       "--metrics", "--host", "{host}", "--port", "{port}"],
            "ready_timeout_s": 120,
            "metrics": [{"name": METRIC, "from": "response", "chunk": "last",
                         "field": "timings.predicted_per_second", "unit": "tok/s", "better": "higher"}],
        },
        # the server's own /completion stream (its OpenAI endpoint of that time answers natively too)
        "benchmark": {"api": "llamacpp", "prompt_tokens": 16, "output_tokens": 128, "concurrency": 1,
                      "requests_per_sample": 4, "warmup_requests": 1, "ignore_eos": True, "temperature": 0.0},
        "defaults": {"samples_per_boot": 2, "boots_per_arm": 3, "max_boots_per_arm": 6, "host_check": "mark"},
        "hypotheses": [{"id": "greedy-sampling-regression",
                        "statement": f"greedy decoding at {bad} is at least 10% slower than at {good} (issue #9530)",
                        "baseline": {"commit": good}, "treatment": {"commit": bad},
                        "metric": METRIC, "expect": "decrease", "min_effect": "10%"}],
    }
    path = folder / "hypotheses.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


# --------------------------------------------------------------------------- the run

def _sha(repo: Path, rev: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                          capture_output=True, text=True, check=True).stdout.strip()


def _count_commits(repo: Path, good: str, bad: str) -> int:
    out = subprocess.run(["git", "-C", str(repo), "rev-list", "--count", f"{good}..{bad}"],
                         capture_output=True, text=True, check=True).stdout
    return int(out) + 1


def _builds_since(cache_dir: Path, t0: float) -> tuple[int, float]:
    """Builds the harness ran (not found cached) since ``t0``, and their seconds."""
    n, seconds = 0, 0.0
    for marker in cache_dir.glob("repos/*/builds/*.json"):
        if marker.stat().st_mtime >= t0:
            try:
                info = json.loads(marker.read_text())
            except (OSError, ValueError):
                continue
            n += 1
            seconds += float(info.get("seconds") or 0.0)
    return n, seconds


def _ledger_figures(db: Path) -> dict:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        boots = con.execute("SELECT COUNT(*), SUM(b.status = 'ok') FROM boots b").fetchone()
        commits = con.execute('SELECT COUNT(DISTINCT c."commit") FROM boots b JOIN configs c ON c.id = b.config_id'
                              ).fetchone()[0]
        busy = con.execute("SELECT COUNT(*) FROM boots WHERE marks LIKE '%host_busy%'").fetchone()[0]
    finally:
        con.close()
    return {"boots_in_ledger": boots[0], "boots_ok": boots[1] or 0, "commits_booted": commits, "boots_host_busy": busy}


def run(args: argparse.Namespace) -> dict:
    repo = Path(args.repo).resolve()
    good, bad = _sha(repo, args.good), _sha(repo, args.bad)
    culprit = _sha(repo, args.culprit) if args.culprit else None
    n_commits = _count_commits(repo, good, bad)
    cache_dir = Path(args.cache_dir).resolve() if args.cache_dir else None
    work = Path(tempfile.mkdtemp(prefix="bench-real-history-"))
    model = write_model(work / "tiny-32k-f16.gguf")
    spec = write_spec(work, repo, model, good, bad, args.threads, args.checkout, args.build)
    if args.dry_run:  # the plan: checkout mode, each build step and the launch per config
        return {"dry_run": subprocess.run([sys.executable, "-m", "bisect_harness.cli", "run", str(spec), "--dry-run",
                                           "--json"], cwd=work, capture_output=True, text=True).stdout}
    db = work / "results.db"
    cmd = [sys.executable, "-m", "bisect_harness.cli", "bisect", str(spec), "--good", good, "--bad", bad,
           "--metric", METRIC, "--max-boots", str(args.max_boots), "--json",
           "--ledger", f"sqlite:///{db}", "--journal-dir", str(work / "experiments")]
    if cache_dir:
        cmd += ["--cache-dir", str(cache_dir)]
    print(f"range {good[:9]}..{bad[:9]}: {n_commits} commits; expected culprit {culprit and culprit[:9]}", flush=True)
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.time()
    env = dict(os.environ)
    # make of that era compiles with -g, which puts the working folder in ccache's key:
    # without this, no worktree would reuse another's objects
    env.setdefault("CCACHE_NOHASHDIR", "1")
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        print("  | " + line.rstrip("\n"), flush=True)
    code = proc.wait()
    seconds = time.time() - t0
    result = None
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                result = json.loads(line)
                break
            except ValueError:
                continue
    from bisect_harness.places import default_cache_dir
    builds, build_s = _builds_since(cache_dir or default_cache_dir(), t0)
    named = (result or {}).get("culprit")
    out = {
        "bench": "real_history", "engine": "llama.cpp", "issue": "ggml-org/llama.cpp#9530",
        "fix": "ggml-org/llama.cpp#9605", "good": good, "bad": bad, "commits": n_commits,
        "expected": culprit, "culprit": named,
        "culprit_found": bool(culprit and named and named == culprit),
        "probability": (result or {}).get("leader_probability"),
        "stopped": (result or {}).get("stopped"),
        "boots": (result or {}).get("boots"), "new_boots": (result or {}).get("new_boots"),
        "builds": builds, "build_seconds": round(build_s, 1), "seconds": round(seconds, 1),
        "candidate_set": (result or {}).get("candidate_set"), "skipped": (result or {}).get("skipped"),
        "endpoint_test": (result or {}).get("endpoint_test"), "verify_test": (result or {}).get("verify_test"),
        "tests": (result or {}).get("tests"),
        "warnings": (result or {}).get("warnings"), "exit_code": code, "workdir": str(work),
    }
    if db.exists():
        out.update(_ledger_figures(db))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", required=True, help="a clone of github.com/ggerganov/llama.cpp")
    p.add_argument("--good", default=GOOD)
    p.add_argument("--bad", default=BAD)
    p.add_argument("--culprit", default=CULPRIT, help="the commit to score the answer against ('' for none)")
    p.add_argument("--max-boots", type=int, default=60)
    p.add_argument("--threads", type=int, default=1,
                   help="llama-server -t (1: on a small shared host, two spinning threads stall each other)")
    p.add_argument("--cache-dir", default=None, help="the harness's cache (checkouts, builds)")
    from bisect_harness.engines.checkout import CHECKOUT_MODES

    p.add_argument("--checkout", default="clone", choices=CHECKOUT_MODES.names(),
                   help="engine.checkout: how each commit is checked out")
    p.add_argument("--build", default="cmake", choices=sorted(BUILDS),
                   help="cmake: configure, then build (two steps); make: one argv")
    p.add_argument("--dry-run", action="store_true", help="print the harness's plan and boot nothing")
    args = p.parse_args()
    out = run(args)
    if args.dry_run:
        print(out["dry_run"], flush=True)
        return 0
    print(f"culprit named: {out['culprit'] and out['culprit'][:9]} (expected {out['expected'] and out['expected'][:9]}, "
          f"P={out['probability']}) stopped={out['stopped']} boots={out['boots']} builds={out['builds']} "
          f"seconds={out['seconds']}", flush=True)
    print(json.dumps(out), flush=True)
    return 0 if out["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
