#!/usr/bin/env bash
# Runs of one hypotheses file against llama-server with CUDA, each with its own journal:
#   experiments/llamacpp-h200/fresh-runs.sh OUT_DIR FIRST LAST [HYPOTHESES] [SECONDS_EACH] [LEDGER]
# Runs FIRST..LAST, each under a deadline of SECONDS_EACH (default 170). LEDGER: "own"
# (default: each run its own ledger, nothing carried from one run to the next) or
# "shared" (every run into OUT_DIR/shared.db, so that each run after the first pools the
# spread the earlier ones saw: defaults.noise_prior). Needs llama-server on PATH
# (run-on-gpu.sh builds it) and the models (make_models.py).
set -uo pipefail
out=${1:?out dir}; first=${2:?first run}; last=${3:?last run}
file=${4:-experiments/llamacpp-h200/fewer-boots.yaml}; each=${5:-170}; ledger=${6:-own}
mkdir -p "$out"
for i in $(seq "$first" "$last"); do
  db="$out/run$i.db"; [ "$ledger" = shared ] && db="$out/shared.db"
  t0=$(date +%s)
  timeout "$each" python3 -m bisect_harness.cli run "$file" --no-calibration --json \
      --ledger "sqlite:///$db" --journal-dir "$out/journal$i" >"$out/run$i.json" 2>"$out/run$i.err"
  echo "run $i: exit $? in $(( $(date +%s) - t0 )) s"
done
