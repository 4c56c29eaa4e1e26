#!/usr/bin/env bash
# onnxruntime's C/C++ API headers (Debian's libonnxruntime-dev), for native/ (`make kernels`).
# The .deb comes from the Debian mirrors apt itself is configured with (apt-get indextargets reads
# /etc/apt/sources.list{,.d}), is checked against the pinned sha256, and is unpacked into DEST.
# An already-unpacked copy is used as it is (make skips this script then), so no network is needed.
# ORT_DEB_URL=... names the file directly on a machine without apt.
#   usage: tools/ort_headers.sh DEB SHA256 DEST
set -euo pipefail
deb=$1 sha=$2 dest=$3
pool=pool/main/o/onnxruntime/$deb
mkdir -p .cache
tmp=.cache/$deb.part
fail() { echo "make kernels: cannot get onnxruntime's headers: $*" >&2; exit 1; }

if [ -n "${ORT_DEB_URL:-}" ]; then
  urls=$ORT_DEB_URL
elif command -v apt-get >/dev/null; then
  urls=$(apt-get indextargets --no-release-info --format '$(REPO_URI)' 2>/dev/null | sort -u \
         | sed "s|/*\$|/$pool|")
  [ -n "$urls" ] || fail "apt has no Debian mirror configured (apt-get indextargets lists none); set ORT_DEB_URL to $deb's address"
else
  fail "no apt-get on this machine to name a Debian mirror; set ORT_DEB_URL to $deb's address"
fi

for url in $urls; do
  if curl -fsSL --retry 2 -o "$tmp" "$url" 2>/dev/null; then
    got=$(sha256sum "$tmp" | cut -d' ' -f1)
    [ "$got" = "$sha" ] || { rm -f "$tmp"; fail "$url has sha256 $got, not the pinned $sha"; }
    mkdir -p "$dest"
    dpkg-deb -x "$tmp" "$dest" || fail "dpkg-deb could not unpack $url"
    rm -f "$tmp"
    echo "onnxruntime headers from $url -> $dest"
    exit 0
  fi
done
rm -f "$tmp"
fail "$deb was not found at: $(echo $urls | tr '\n' ' ')"
