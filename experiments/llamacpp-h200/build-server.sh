#!/usr/bin/env bash
# Build llama-server with CUDA (Hopper only) into /tmp/llama.cpp/build and make the models:
#   experiments/llamacpp-h200/build-server.sh LLAMA_SRC_TARBALL OUT_DIR
# LLAMA_SRC_TARBALL: the llama.cpp tree vendored in the llama-cpp-python 0.3.36 source
# package (tools/server/webui left out), as a .tar.xz. Then put /tmp/llama.cpp/build/bin
# on PATH.
set -euo pipefail
src=${1:?tarball}; out=${2:?out dir}
mkdir -p "$out" /tmp/llama-src
t0=$(date +%s)
tar -xJf "$src" -C /tmp/llama-src  # the tree, or one folder holding it
tree=$(dirname "$(find /tmp/llama-src -maxdepth 2 -name CMakeLists.txt | sort | head -1)")
cmake -S "$tree" -B /tmp/llama.cpp/build -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >"$out/cmake.log" 2>&1
cmake --build /tmp/llama.cpp/build --target llama-server -j "$(nproc)" >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
echo "llama-server built in $(( $(date +%s) - t0 )) s"
/tmp/llama.cpp/build/bin/llama-server --version 2>&1 | tail -2
python3 experiments/llamacpp-h200/make_models.py
