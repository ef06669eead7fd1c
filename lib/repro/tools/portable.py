"""The portable quick-mode environment: the same numbers on any x86-64 machine with AVX2.

Executed notebooks are committed with their outputs, and the tests compare each claims table exactly, so quick
mode must give the same floating-point results on the development machines and on CI, whatever their CPU.
Measured here: the same notebook gave different claim values on an Intel Xeon (AVX-512) and on the AMD EPYC that
produced the earlier committed outputs, because every numerical library picks kernels by CPU at run time:

* MKL (torch's BLAS/LAPACK): ``MKL_CBWR=AVX2,STRICT`` (conditional numerical reproducibility on the AVX2 code path;
  15-35 % slower on POGO's batched 16x16 products, little cost on larger matmuls, while ``COMPATIBLE`` made BLAS
  2.5x slower: quick mode buys exact agreement with this, full mode does not use it);
* ATen's own vectorised kernels (softmax, reductions): ``ATEN_CPU_CAPABILITY=avx2``;
* oneDNN (convolutions): ``ONEDNN_MAX_CPU_ISA=AVX2``;
* OpenBLAS inside NumPy and SciPy: ``OPENBLAS_CORETYPE=Haswell`` (the kernels AMD Zen gets too);
* one thread everywhere (results of threaded reductions depend on the split), and a fixed hash seed.

These are read when the libraries load, so they go into the environment the kernel is started with: the batch
runner and the tests' conftest use :data:`QUICK_ENV`.
"""

from __future__ import annotations

from collections.abc import Mapping

QUICK_ENV: dict[str, str] = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_CBWR": "AVX2,STRICT",
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OPENBLAS_CORETYPE": "Haswell",
    "PYTHONHASHSEED": "0",
}


def quick_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` (e.g. ``os.environ``) with the portable quick-mode settings on top."""
    return {**base, **QUICK_ENV}
