#!/usr/bin/env bash
# Build llama-server with CUDA (Hopper only), make the models, run the experiment.
#   experiments/llamacpp-h200/run-on-gpu.sh LLAMA_SRC_TARBALL OUT_DIR [HYPOTHESES]
# LLAMA_SRC_TARBALL: the llama.cpp tree vendored in the llama-cpp-python 0.3.36 source
# package (tools/server/webui left out), as a .tar.xz. Run from the repository root,
# with the harness importable (pip install -e ., or PYTHONPATH). HYPOTHESES: the file
# to run (hypotheses.yaml beside this script if left out).
set -euo pipefail
src=${1:?tarball}; out=${2:?out dir}; file=${3:-experiments/llamacpp-h200/hypotheses.yaml}
t1=$(date +%s)
"$(dirname "$0")/build-server.sh" "$src" "$out"
export PATH="/tmp/llama.cpp/build/bin:$PATH"
python3 -m bisect_harness.cli run "$file" --no-calibration --json \
    --ledger "sqlite:///$out/results.db" --journal-dir "$out/journal" || echo "harness exit $?"
echo "experiment took $(( $(date +%s) - t1 )) s"
