"""The fast forms against the portable one through tests/native/kernel_forms.cc (no onnxruntime):
this host's forms natively, and the ARM64 forms (native/*_neon.cc: NEON, and NEON with sdot) from
an x86-64 host: `make kernels-arm64` cross-compiles the library and the driver with Debian's
aarch64 gcc and runs the driver under qemu-aarch64, as a CPU without the dot-product extension
and as one with it. Each form must give the portable form's bits for QMatMulGGML (every type),
QMatMul4/8 (1 .. 64 rows, row by row, 2 threads) and PackedAttention (contexts across the
softmax's chunks, 1 and 2 threads); a NEON form built with SPECRT_MUTANT must differ.

The toolchain and qemu-user-static are bookworm's current packages, verified through Debian's
signed indexes and fetched once into .cache (tools/aarch64_cross.sh, tools/debian_fetch.sh).
"""

from __future__ import annotations

import platform
import shutil
import subprocess

import pytest

from paths import ROOT


def _forms(target: str, timeout: int = 900) -> tuple[list[str], str]:
    """`make -s TARGET` (it must succeed) -> its `kernel_forms: ` lines of forms it ran (those it
    skipped, the CPU lacking their instructions, are in the whole stdout) and its whole stdout."""
    r = subprocess.run(["make", "-s", target], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("kernel_forms: ")]
    return [ln for ln in lines if ": skipped, " not in ln], r.stdout


def test_neon_forms_are_the_portable_bits_under_qemu():
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the cross check runs from an x86-64 host (an ARM64 host runs its forms natively)")
    if not (shutil.which("make") and shutil.which("dpkg-deb") and shutil.which("curl")):
        pytest.skip("the cross toolchain needs make, curl and dpkg-deb")
    lines, out = _forms("kernels-arm64")
    # cortex-a53 (no dotprod): the NEON form; max: NEON and dotprod; then the mutant, caught
    assert len(lines) == 4, out
    assert lines[0].startswith("kernel_forms: neon: ") and lines[1].startswith("kernel_forms: neon: ")
    assert lines[2].startswith("kernel_forms: dotprod: ")
    assert all(ln.endswith("every one the portable form's bits") for ln in lines[:3]), out
    assert lines[3].endswith("DIFFERENT bits"), out
    assert all(int(ln.split(": ")[2].split()[0]) > 400 for ln in lines[:3]), out  # calls compared


def test_the_avx2_forms_run_on_a_cpu_without_avx512():
    """The x86-64 driver under qemu-x86_64 as a Haswell (AVX2, FMA, F16C; no AVX-512): the AVX2
    form alone is chosen, gives the portable bits, and never executes an AVX-512 instruction (qemu
    would stop it with SIGILL) -- what an AVX2-only host runs, checked from this AVX-512 one."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("an x86-64 check")
    if not (shutil.which("make") and shutil.which("dpkg-deb") and shutil.which("curl")):
        pytest.skip("qemu-user-static is fetched with curl and dpkg-deb")
    lines, out = _forms("kernels-avx2-only")
    assert len(lines) == 1 and lines[0].startswith("kernel_forms: avx2: "), out
    assert lines[0].endswith("every one the portable form's bits"), out
    # neither vpdpbusd form is run where the CPU lacks it (qemu's Haswell: no AVX-VNNI, no AVX-512)
    assert "kernel_forms: avxvnni: skipped, " in out and "kernel_forms: avxvnni-evex: skipped, " in out, out


@pytest.fixture(scope="module")
def host_forms() -> tuple[list[str], str]:
    if not shutil.which("make"):
        pytest.skip("the driver is built by make")
    return _forms("kernels-forms", timeout=600)


def test_this_hosts_forms_are_the_portable_bits_in_the_driver(host_forms):
    """The same driver, built for this host: every fast form the CPU runs (AVX2, the AVX-VNNI form
    in EVEX encoding and AVX-512 VNNI here) on random shapes, beside the onnxruntime-level tests of
    the other files."""
    lines, out = host_forms
    assert lines and all(ln.endswith("every one the portable form's bits") for ln in lines), out


def test_each_of_this_hosts_forms_is_caught_wrong_in_the_driver():
    """The driver over the mutant library (one sum reordered in each form's QMatMulGGML, and in
    the AVX2 / AVX-VNNI QMatMul4): every form this CPU runs is reported different, so a form the
    driver compares is one it can fail."""
    if not shutil.which("make"):
        pytest.skip("the driver is built by make")
    lines, out = _forms("kernels-forms-mutant")
    assert lines and all(ln.endswith("DIFFERENT bits") for ln in lines), out


@pytest.mark.parametrize("form", ["avxvnni", "avxvnni-evex", "amx"])
def test_the_avxvnni_and_amx_forms_are_the_portable_bits_where_the_cpu_runs_them(form, host_forms):
    """The AVX2 sources built with vpdpbusd (native/avx2_dot.h): in AVX-VNNI's VEX encoding (the
    object best_isa() takes on Alder Lake and later) and in AVX-512 VL + VNNI's EVEX encoding (the
    same instruction: how an AVX-512 host checks the form); and the AMX tile forms of QMatMulGGML
    and QMatMul4/8, at every row count, where the VM grants the tile state. Skipped, with the
    driver's reason, where the CPU has none of them."""
    lines, out = host_forms
    mine = [ln for ln in lines if ln.startswith(f"kernel_forms: {form}: ")]
    if not mine:
        skipped = [ln for ln in out.splitlines() if ln.startswith(f"kernel_forms: {form}: skipped, ")]
        assert skipped, out  # the driver says why it did not run the form
        pytest.skip(skipped[0].removeprefix("kernel_forms: "))
    assert mine[0].endswith("every one the portable form's bits"), out
    assert int(mine[0].split(": ")[2].split()[0]) > 300, out  # calls compared
