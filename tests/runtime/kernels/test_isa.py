"""Which instruction-set form the kernel library takes (native/isa.h, native/ort_ops.cc best_isa):
the decision over the cpuid bits of CPUs this host is not (tests/native/isa_choice.cc), and on this
host against what Linux reports of it (/proc/cpuinfo). Above all: the AVX-VNNI form's VEX object
runs only where the CPU has AVX-VNNI (anywhere else it would stop the process with SIGILL)."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from paths import ROOT
from specrt.runtime import kernels

X86 = platform.machine() in ("x86_64", "AMD64")


def _flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    pytest.skip("/proc/cpuinfo lists no flags")


def test_the_decision_over_other_cpus_cpuid():
    """Haswell, Alder Lake, Zen 4 / 5, Cascade Lake, Sapphire Rapids (AMX granted or not), OSes
    saving no ymm / zmm state: the forms each runs, best_isa's pick, SPECRT_KERNELS_ISA's choices."""
    if not X86:
        pytest.skip("an x86-64 decision")
    if not shutil.which("make"):
        pytest.skip("the check is built by make")
    r = subprocess.run(["make", "-s", "kernels-isa"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    assert "every answer as expected" in r.stdout and "15 CPUs" in r.stdout, r.stdout


@pytest.fixture
def library():
    if not X86:
        pytest.skip("x86-64 forms")
    if not kernels.available():
        pytest.skip("the kernel library is not built (make kernels)")


def test_this_hosts_best_form_is_what_linux_reports(library, monkeypatch):
    f = _flags()
    monkeypatch.delenv("SPECRT_KERNELS_ISA", raising=False)
    avx2 = {"avx2", "fma", "f16c"} <= f
    vnni = avx2 and {"avx512f", "avx512bw", "avx512_vnni"} <= f
    amx = vnni and {"amx_tile", "amx_int8"} <= f
    want = ("amx" if amx else "vnni" if vnni else "avxvnni" if avx2 and "avx_vnni" in f
            else "avx2" if avx2 else "ref")
    if amx and kernels.isa() == "vnni":
        pytest.skip("the kernel refused AMX's tile state here (arch_prctl)")
    assert kernels.isa() == want


def test_avxvnni_is_taken_by_name_only_where_the_cpu_runs_vpdpbusd_on_256_bits(library, monkeypatch):
    """SPECRT_KERNELS_ISA=avxvnni gives the form on a CPU with AVX-VNNI (VEX) or AVX-512 VL + VNNI
    (EVEX, e.g. this Zen 4 host), and leaves the best form anywhere else."""
    f = _flags()
    monkeypatch.delenv("SPECRT_KERNELS_ISA", raising=False)
    best = kernels.isa()
    runs = {"avx2", "fma", "f16c"} <= f and ("avx_vnni" in f or {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= f)
    monkeypatch.setenv("SPECRT_KERNELS_ISA", "avxvnni")
    assert kernels.isa() == ("avxvnni" if runs else best)
    monkeypatch.setenv("SPECRT_KERNELS_ISA", "sse2")  # no such form: the best
    assert kernels.isa() == best


def test_the_library_holds_both_encodings_of_the_avxvnni_form(library):
    """The shipped library links the VEX object (what an Alder Lake runs; no host here can run it)
    and the EVEX one (what this host's tests run), each with its vpdpbusd on ymm registers."""
    if not shutil.which("objdump"):
        pytest.skip("objdump (binutils) reads the library")
    out = subprocess.run(["objdump", "-d", str(kernels.library_path())], capture_output=True, text=True,
                         timeout=120).stdout
    ymm = [ln for ln in out.splitlines() if "vpdpbusd" in ln and "%ymm" in ln]
    vex = [ln for ln in ymm if "{vex}" in ln]
    assert vex, "no VEX vpdpbusd: the AVX-VNNI object is not in the library"
    assert len(ymm) > len(vex), "no EVEX vpdpbusd on ymm: the avxvnni_evex object is not in the library"
