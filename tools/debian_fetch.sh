#!/usr/bin/env bash
# Debian packages at their current version, verified as apt verifies them, unpacked into DEST
# without root: for each suite, its InRelease checked with gpgv against the Debian archive
# keyring on this machine (/usr/share/keyrings; apt's rule: one good signature by a key of the
# keyring and no bad one; only gpgv's verified output is read; a Valid-Until in the past is
# refused), its main/binary-amd64/Packages.xz against the sha256 that text gives, and each .deb
# against the Packages index's sha256. The newest version over the suites is taken. No version
# is pinned: Debian drops a superseded point-release or security build from its pool, so a
# pinned file 404s some later day (docs/design.md "The ARM64 check's toolchain").
# A mirror that cannot be reached, a missing keyring or a bad signature stops it with one line.
# DEBIAN_MIRROR / DEBIAN_SECURITY_MIRROR name other mirrors (suites ending in -security use the
# latter), DEBIAN_KEYRING another keyring.
#   usage: tools/debian_fetch.sh DEST SUITE[,SUITE...] PACKAGE...
#   e.g.   tools/debian_fetch.sh .cache/x bookworm,bookworm-updates,bookworm-security qemu-user-static
set -euo pipefail
dest=$1 suites=$2
shift 2
PACKAGES="$*"
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
keyring=${DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
SUITES=$(for s in ${suites//,/ }; do case $s in *-security) echo "$security $s" ;; *) echo "$mirror $s" ;; esac; done)

fail() { echo "debian_fetch: $*" >&2; exit 1; }
for tool in curl gpgv xz dpkg-deb dpkg sha256sum awk; do
  command -v $tool >/dev/null || fail "needs $tool (not found on PATH)"
done
[ -r "$keyring" ] || fail "no Debian archive keyring at $keyring to verify Debian's indexes (apt-get install debian-archive-keyring, or set DEBIAN_KEYRING)"

work=$(mktemp -d "${TMPDIR:-/tmp}/debian-fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
get() {  # URL FILE: one clear line when the mirror cannot be reached or lacks the file
  local err
  err=$(curl -fsS --retry 2 --connect-timeout 20 -o "$2" "$1" 2>&1) \
    || fail "cannot fetch $1 (${err##*curl: })"
}
sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# 1-2: the verified indexes; "name version filename sha256 base" lines for the wanted packages
: > "$work/found"
i=0
while read -r base suite; do
  i=$((i + 1))
  get "$base/dists/$suite/InRelease" "$work/$i.InRelease"
  # apt's rule: at least one good signature by a key of the keyring and no bad one (a signature
  # by a key this keyring predates, e.g. a later release's signing key, is passed over)
  gpgv --quiet --status-fd 3 --keyring "$keyring" --output "$work/$i.Release" "$work/$i.InRelease" \
    3>"$work/gpgv.status" 2>/dev/null || true
  if grep -qE '^\[GNUPG:\] (BADSIG|EXPKEYSIG|REVKEYSIG)' "$work/gpgv.status" \
     || ! grep -q '^\[GNUPG:\] VALIDSIG' "$work/gpgv.status"; then
    fail "$base/dists/$suite/InRelease does not verify against $keyring: $(grep -oE '(BADSIG|EXPKEYSIG|REVKEYSIG|NO_PUBKEY|ERRSIG) [0-9A-F]+' "$work/gpgv.status" | sort -u | tr '\n' ' ')"
  fi
  until=$(sed -n 's/^Valid-Until: //p' "$work/$i.Release")
  if [ -n "$until" ] && [ "$(date -u -d "$until" +%s)" -lt "$(date -u +%s)" ]; then
    fail "$base/dists/$suite/InRelease expired on $until (a stale mirror?)"
  fi
  want=$(awk '/^SHA256:/ {s=1; next} /^[^ ]/ {s=0} s && $3 == "main/binary-amd64/Packages.xz" {print $1}' "$work/$i.Release")
  [ -n "$want" ] || fail "$base/dists/$suite/InRelease lists no sha256 for main/binary-amd64/Packages.xz"
  get "$base/dists/$suite/main/binary-amd64/Packages.xz" "$work/$i.Packages.xz"
  got=$(sha_of "$work/$i.Packages.xz")
  [ "$got" = "$want" ] || fail "$base/dists/$suite/main/binary-amd64/Packages.xz has sha256 $got, not the signed $want"
  xz -dc "$work/$i.Packages.xz" | awk -v want="$PACKAGES" -v base="$base" '
    BEGIN { n = split(want, w, /[ \n]+/); for (k = 1; k <= n; k++) if (w[k] != "") wanted[w[k]] = 1 }
    /^Package: / { p = $2 } /^Version: / { v = $2 } /^Filename: / { f = $2 } /^SHA256: / { s = $2 }
    /^$/ { if (p in wanted) print p, v, f, s, base; p = v = f = s = "" }
    END { if (p in wanted) print p, v, f, s, base }' >> "$work/found"
done <<< "$SUITES"

# 3: the newest version of each, its .deb checked against the verified index, unpacked
mkdir -p "$dest"
for pkg in $PACKAGES; do
  best=""
  while read -r p v f s b; do
    [ "$p" = "$pkg" ] || continue
    if [ -z "$best" ] || dpkg --compare-versions "$v" gt "$(echo "$best" | cut -d' ' -f2)"; then
      best="$p $v $f $s $b"
    fi
  done < "$work/found"
  [ -n "$best" ] || fail "no package $pkg in the indexes of $suites"
  read -r p v f s b <<< "$best"
  deb="$work/$(basename "$f")"
  get "$b/$f" "$deb"
  got=$(sha_of "$deb")
  [ "$got" = "$s" ] || fail "$b/$f has sha256 $got, not the $s of the signed index"
  dpkg-deb -x "$deb" "$dest" || fail "dpkg-deb could not unpack $b/$f"
  rm -f "$deb"
  echo "debian_fetch: $p $v (verified) -> $dest"
done
