#!/usr/bin/env bash
# An aarch64 cross toolchain and qemu-user, without root, for the ARM64 kernel check
# (`make kernels-arm64-check`): Debian bookworm's gcc-12 cross compiler, binutils, the arm64
# libc/libstdc++ (static libraries, so the test driver runs under qemu with no sysroot), and
# qemu-user-static, each .deb from the Debian mirror apt is configured with, checked against its
# pinned sha256 (tools/deb_headers.sh) and unpacked into DEST. Skipped when DEST is complete.
#   usage: tools/aarch64_cross.sh DEST      (then DEST/usr/bin/aarch64-linux-gnu-g++-12,
#                                              DEST/usr/bin/qemu-aarch64-static)
set -euo pipefail
dest=$1
[ -x "$dest/usr/bin/qemu-aarch64-static" ] && [ -x "$dest/usr/bin/aarch64-linux-gnu-g++-12" ] && exit 0
while read -r pool sha; do
  [ -n "$pool" ] && tools/deb_headers.sh "$pool" "$sha" "$dest"
done <<'DEBS'
pool/main/g/gcc-12-cross/g++-12-aarch64-linux-gnu_12.2.0-14cross1_amd64.deb 3693e31fe2b42fcbdd92fef3e5578e91dd86af30e3d2c5fff3f9821e34a1cb91
pool/main/g/gcc-12-cross/gcc-12-aarch64-linux-gnu_12.2.0-14cross1_amd64.deb 43747bbcd46a4062e66e855090b8ed9c2e06a93ae5a69fb304beebbc8c36d11f
pool/main/g/gcc-12-cross/cpp-12-aarch64-linux-gnu_12.2.0-14cross1_amd64.deb 5921df4ad56e34e6257a1caf862474845aab6548ba7ae7852e8cdd7cb622394e
pool/main/b/binutils/binutils-aarch64-linux-gnu_2.40-2_amd64.deb 3d6f64a7a4ed6d73719f8fa2e85fd896f58ff7f211a6683942ba93de690aaa66
pool/main/g/gcc-12-cross/libgcc-12-dev-arm64-cross_12.2.0-14cross1_all.deb ff1324e262bae2c3aad685c2ed52bd531ab0a2a337a0fe35c3b720947d55b2ba
pool/main/g/gcc-12-cross/libstdc++-12-dev-arm64-cross_12.2.0-14cross1_all.deb 942b5710c6b9792578dfa64f7a4633bc0d3cb205b56ded11297e240ff824f5da
pool/main/c/cross-toolchain-base/libc6-dev-arm64-cross_2.36-8cross1_all.deb 5e4cf6abf0e89e89c4b3006bb8b7dc47aa831df25d94df9134929b8b968cacb4
pool/main/c/cross-toolchain-base/linux-libc-dev-arm64-cross_6.1.4-1cross1_all.deb 66457f015d16b7d372db6591cff38db0da928362ff2ea1fa75491e28f6904d81
pool/main/c/cross-toolchain-base/libc6-arm64-cross_2.36-8cross1_all.deb 91936cbbee75771c360ed16513f6e734a25ca5517fe7c3e13dfd7835d7553186
pool/main/g/gcc-12-cross/libstdc++6-arm64-cross_12.2.0-14cross1_all.deb 9cba984b64d0cf11698978fc5e0fe93c7441d29b9f42f70f1c6c734cc9e2ea41
pool/main/g/gcc-12-cross/libgcc-s1-arm64-cross_12.2.0-14cross1_all.deb af1e686fc6a416228222e7bfb68317dd2fa2685236301ae29141fc6108a66cac
pool/main/q/qemu/qemu-user-static_7.2+dfsg-7+deb12u18+b3_amd64.deb c3e3ba2bd87f8c5b9a5da5ef21b5a3b82d7c63b89dd448d9ddaa4eabc5b6e402
DEBS
