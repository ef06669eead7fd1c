"""The portable quick-mode environment: the same numbers on any x86-64 machine with AVX2, Intel or AMD.

Executed notebooks are committed with their outputs, and the tests compare each claims table exactly, so quick
mode must give the same floating-point results on the development machines and on CI, whatever their CPU.
Every numerical library picks kernels by CPU at run time; what pins each one (issue 44, measured on an AMD EPYC
with AVX-512, ``python -m repro portability`` and :mod:`repro.tools.trace`):

* MKL (torch's BLAS/LAPACK): ``MKL_CBWR=COMPATIBLE``. MKL honours the ISA branches (``AVX2``, ``AVX512``, ...)
  only on Intel CPUs: on AMD ``MKL_CBWR=AVX2,STRICT`` runs as ``AUTO`` (``MKL_VERBOSE`` reports ``CNR:AUTO``;
  ``AVX2``, ``AVX512``, ``SSE4_2`` and ``AUTO`` gave the same bits there), so an Intel and an AMD machine ran
  different GEMM kernels. ``COMPATIBLE`` (SSE2) is the one branch both vendors run. It costs 2-3x on GEMM
  (measured: 512^3 3.0 -> 8.3 ms, POGO's 1000x16x16 bmm 0.20 -> 0.50 ms); quick mode buys exact agreement with it,
  full mode does not use it.
* oneDNN and NNPACK (convolutions): bypassed (``REPRO_PORTABLE_KERNELS=1``: :func:`repro.runtime.portable_kernels`;
  ATen's im2col + MKL instead). oneDNN's blocking follows the cache sizes, which ``ONEDNN_MAX_CPU_ISA`` does not cap;
  NNPACK has no cap at all. ``ONEDNN_MAX_CPU_ISA=AVX2`` stays for any other oneDNN use.
* ATen's own vectorised kernels (softmax, reductions, Sleef's transcendental functions, and ``torch.randn``'s
  Box-Muller): ``ATEN_CPU_CAPABILITY=avx2``.
* NumPy's own SIMD loops: ``NPY_DISABLE_CPU_FEATURES`` drops the AVX-512 ones, which an AVX2-only CPU (AMD Zen 3,
  Intel before Skylake-SP) does not have: without them float64 ``exp``, ``log``, ``power``, ``expm1``, ``log1p``
  (and SciPy's ``logsumexp``) gave other bits.
* OpenBLAS inside NumPy and SciPy: ``OPENBLAS_CORETYPE=Haswell`` (the kernels AMD Zen gets too).
* one thread everywhere (results of threaded reductions depend on the split), and a fixed hash seed.

These are read when the libraries load (``REPRO_PORTABLE_KERNELS`` when a notebook calls ``runtime.setup``), so they
go into the environment the kernel is started with: the batch runner and the tests' conftest use :data:`QUICK_ENV`.
"""

from __future__ import annotations

from collections.abc import Mapping

KERNELS_ENV = "REPRO_PORTABLE_KERNELS"

QUICK_ENV: dict[str, str] = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_CBWR": "COMPATIBLE",
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
    "OPENBLAS_CORETYPE": "Haswell",
    KERNELS_ENV: "1",
    "PYTHONHASHSEED": "0",
}

# The portable environment before issue 44 (the committed outputs were made with it): A/B measurements of the fixes.
BEFORE_44: dict[str, str] = {"MKL_CBWR": "AVX2,STRICT", "NPY_DISABLE_CPU_FEATURES": "", KERNELS_ENV: ""}


def quick_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` (e.g. ``os.environ``) with the portable quick-mode settings on top."""
    return {**base, **QUICK_ENV}
