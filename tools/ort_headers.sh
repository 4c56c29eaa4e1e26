#!/usr/bin/env bash
# onnxruntime's C/C++ API headers (Debian's libonnxruntime-dev), for native/ (`make kernels`) and
# cpp/ (`make cpp`): tools/deb_headers.sh with onnxruntime's pool path. ORT_DEB_URL=... names the
# file directly on a machine without apt. The package is trixie's (its fallback suites).
#   usage: tools/ort_headers.sh DEB SHA256 DEST
set -euo pipefail
DEB_URL=${ORT_DEB_URL:-} DEB_SUITES=${DEB_SUITES:-trixie,trixie-updates,trixie-security} exec "$(dirname "$0")/deb_headers.sh" "pool/main/o/onnxruntime/$1" "$2" "$3"
