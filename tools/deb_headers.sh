#!/usr/bin/env bash
# Headers from a pinned Debian package (onnxruntime's C/C++ API for `make kernels` and `make cpp`,
# nlohmann-json for `make cpp`). The .deb comes from the Debian mirrors apt itself is configured
# with (apt-get indextargets reads /etc/apt/sources.list{,.d}), is checked against the pinned
# sha256, and is unpacked into DEST. No root is needed. An already-unpacked copy is used as it is
# (make skips this script then), so no network is needed. DEB_URL=... names the file directly on
# a machine without apt. Once Debian has dropped the pinned file from its pool (a newer build
# superseded it), the package's current version in DEB_SUITES (default bookworm's) is taken
# instead, verified through Debian's signed indexes (tools/debian_fetch.sh).
#   usage: tools/deb_headers.sh POOL_PATH SHA256 DEST
#   e.g.   tools/deb_headers.sh pool/main/n/nlohmann-json3/nlohmann-json3-dev_3.11.2-2_all.deb <sha> .cache/nlohmann-json
set -euo pipefail
pool=$1 sha=$2 dest=$3
deb=$(basename "$pool")
mkdir -p .cache
tmp=.cache/$deb.part
fail() { echo "cannot get the headers of $deb: $*" >&2; exit 1; }

if [ -n "${DEB_URL:-}" ]; then
  urls=$DEB_URL
elif command -v apt-get >/dev/null; then
  urls=$(apt-get indextargets --no-release-info --format '$(REPO_URI)' 2>/dev/null | sort -u \
         | sed "s|/*\$|/$pool|")
  [ -n "$urls" ] || fail "apt has no Debian mirror configured (apt-get indextargets lists none); set DEB_URL to $deb's address"
else
  fail "no apt-get on this machine to name a Debian mirror; set DEB_URL to $deb's address"
fi

for url in $urls; do
  if curl -fsSL --retry 2 -o "$tmp" "$url" 2>/dev/null; then
    got=$(sha256sum "$tmp" | cut -d' ' -f1)
    [ "$got" = "$sha" ] || { rm -f "$tmp"; fail "$url has sha256 $got, not the pinned $sha"; }
    mkdir -p "$dest"
    dpkg-deb -x "$tmp" "$dest" || fail "dpkg-deb could not unpack $url"
    rm -f "$tmp"
    echo "headers of $deb from $url -> $dest"
    exit 0
  fi
done
rm -f "$tmp"
[ -z "${DEB_URL:-}" ] || fail "$deb was not found at $DEB_URL"
# Debian drops a superseded build from its pool: then the package's current version in the
# suites it came from (DEB_SUITES), verified through Debian's signed indexes (tools/debian_fetch.sh)
suites=${DEB_SUITES:-bookworm,bookworm-updates,bookworm-security}
echo "$deb is gone from $(echo $urls | tr '\n' ' '); taking ${deb%%_*}'s current version in $suites" >&2
exec "$(dirname "$0")/debian_fetch.sh" "$dest" "$suites" "${deb%%_*}"
