#!/usr/bin/env bash
# Runs of one hypotheses file against llama-server with CUDA into one ledger, so that
# each run after the first pools the spread the earlier ones saw (defaults.noise_prior):
#   experiments/llamacpp-h200/prior-runs.sh OUT_DIR FIRST LAST [HYPOTHESES] [SECONDS_EACH]
# Runs FIRST..LAST into OUT_DIR/shared.db, each with its own journal folder and under a
# deadline of SECONDS_EACH (default 170). Needs llama-server on PATH (build-server.sh
# builds it) and the models (make_models.py).
set -uo pipefail
out=${1:?out dir}; first=${2:?first run}; last=${3:?last run}
file=${4:-experiments/llamacpp-h200/fewer-boots.yaml}; each=${5:-170}
mkdir -p "$out"
for i in $(seq "$first" "$last"); do
  t0=$(date +%s)
  timeout "$each" python3 -m bisect_harness.cli run "$file" --no-calibration --json \
      --ledger "sqlite:///$out/shared.db" --journal-dir "$out/journal$i" >"$out/run$i.json" 2>"$out/run$i.err"
  echo "run $i: exit $? in $(( $(date +%s) - t0 )) s"
done
