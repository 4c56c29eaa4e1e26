#!/usr/bin/env bash
# An aarch64 cross toolchain and qemu-user, without root, for the ARM64 kernel check
# (`make kernels-arm64`): Debian bookworm's gcc-12 cross compiler, binutils, the arm64
# libc/libstdc++ (static libraries, so the test driver runs under qemu with no sysroot), and
# qemu-user-static, unpacked into DEST. Skipped when DEST is complete.
#
# No version is pinned: Debian drops a superseded point-release .deb from its pool (qemu's
# security updates do so every few weeks), so a pinned file 404s some later day. Each package's
# current version is read from Debian's own indexes and checked by their chain of trust, as apt
# does (docs/design.md "The ARM64 check's toolchain"):
#   1. each suite's InRelease (bookworm, bookworm-updates, bookworm-security) verified with gpgv
#      against the Debian archive keyring on this machine (/usr/share/keyrings): one good
#      signature and no bad one, as apt asks; the text used is gpgv's verified output, and a
#      Valid-Until in the past is refused;
#   2. its main/binary-amd64/Packages.xz checked against the sha256 that verified text gives;
#   3. each .deb checked against the sha256 the Packages index gives; the newest version over the
#      three suites is taken.
# A mirror that cannot be reached fails with one line. DEBIAN_MIRROR / DEBIAN_SECURITY_MIRROR
# name other mirrors; DEBIAN_KEYRING another keyring.
#   usage: tools/aarch64_cross.sh DEST      (then DEST/usr/bin/aarch64-linux-gnu-g++-12,
#                                              DEST/usr/bin/qemu-aarch64-static)
set -euo pipefail
dest=$1
[ -x "$dest/usr/bin/qemu-aarch64-static" ] && [ -x "$dest/usr/bin/aarch64-linux-gnu-g++-12" ] && exit 0

PACKAGES="g++-12-aarch64-linux-gnu gcc-12-aarch64-linux-gnu cpp-12-aarch64-linux-gnu
  binutils-aarch64-linux-gnu libgcc-12-dev-arm64-cross libstdc++-12-dev-arm64-cross
  libc6-dev-arm64-cross linux-libc-dev-arm64-cross libc6-arm64-cross libstdc++6-arm64-cross
  libgcc-s1-arm64-cross qemu-user-static"
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
keyring=${DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
SUITES="$mirror bookworm
$mirror bookworm-updates
$security bookworm-security"

fail() { echo "aarch64_cross: $*" >&2; exit 1; }
for tool in curl gpgv xz dpkg-deb dpkg sha256sum awk; do
  command -v $tool >/dev/null || fail "needs $tool (not found on PATH)"
done
[ -r "$keyring" ] || fail "no Debian archive keyring at $keyring to verify Debian's indexes (apt-get install debian-archive-keyring, or set DEBIAN_KEYRING)"

work=$(mktemp -d "${TMPDIR:-/tmp}/aarch64-cross.XXXXXX")
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
  [ -n "$best" ] || fail "no package $pkg in bookworm's indexes"
  read -r p v f s b <<< "$best"
  deb="$work/$(basename "$f")"
  get "$b/$f" "$deb"
  got=$(sha_of "$deb")
  [ "$got" = "$s" ] || fail "$b/$f has sha256 $got, not the $s of the signed index"
  dpkg-deb -x "$deb" "$dest" || fail "dpkg-deb could not unpack $b/$f"
  rm -f "$deb"
  echo "aarch64_cross: $p $v (verified) -> $dest"
done
[ -x "$dest/usr/bin/qemu-aarch64-static" ] && [ -x "$dest/usr/bin/aarch64-linux-gnu-g++-12" ] \
  || fail "the packages unpacked, but $dest lacks qemu-aarch64-static or aarch64-linux-gnu-g++-12"
