#!/usr/bin/env bash
# An aarch64 cross toolchain and qemu-user, without root, for the ARM64 kernel check
# (`make kernels-arm64`): Debian bookworm's gcc-12 cross compiler, binutils, the arm64
# libc/libstdc++ (static libraries, so the test driver runs under qemu with no sysroot), and
# qemu-user-static, each at its current version in bookworm (with its updates and security
# suites), verified through Debian's signed indexes (tools/debian_fetch.sh: no pinned file that
# Debian later drops), unpacked into DEST. Skipped when DEST is complete.
#   usage: tools/aarch64_cross.sh DEST      (then DEST/usr/bin/aarch64-linux-gnu-g++-12,
#                                              DEST/usr/bin/qemu-aarch64-static)
set -euo pipefail
dest=$1
have() { [ -x "$dest/usr/bin/qemu-aarch64-static" ] && [ -x "$dest/usr/bin/aarch64-linux-gnu-g++-12" ]; }
have && exit 0
"$(dirname "$0")/debian_fetch.sh" "$dest" bookworm,bookworm-updates,bookworm-security \
  g++-12-aarch64-linux-gnu gcc-12-aarch64-linux-gnu cpp-12-aarch64-linux-gnu binutils-aarch64-linux-gnu \
  libgcc-12-dev-arm64-cross libstdc++-12-dev-arm64-cross libc6-dev-arm64-cross linux-libc-dev-arm64-cross \
  libc6-arm64-cross libstdc++6-arm64-cross libgcc-s1-arm64-cross qemu-user-static
have || { echo "aarch64_cross: the packages unpacked, but $dest lacks qemu-aarch64-static or aarch64-linux-gnu-g++-12" >&2; exit 1; }
