"""The portable quick-mode environment absorbs what another x86-64 machine changes (issue 44), kernel by kernel.

A probe computes the kernels the notebooks use (convolutions forward and backward, GEMMs of several shapes, LAPACK,
attention, NumPy's and SciPy's transcendental and BLAS functions) in a fresh process and hashes every result. Under
QUICK_ENV it must give the same bits as under QUICK_ENV with the emulated other machine's overrides
(:data:`repro.tools.portability.PRESETS` ``"other"``: oneDNN on SSE4.1, NumPy without its AVX-512 loops, MKL limited
to SSE4.2); under the environment before issue 44 the same overrides change some bits, so the check has teeth.
A few seconds: the CI-affordable part of the emulation (``python -m repro portability`` runs whole notebooks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from repro.tools import portability, portable

PROBE = r"""
import hashlib, json, os
import numpy as np, scipy.linalg, scipy.special, torch
import torch.nn.functional as F
from repro import runtime

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
if os.environ.get("REPRO_PORTABLE_KERNELS") == "1":
    runtime.portable_kernels()
out = {}

def put(name, x):
    if isinstance(x, torch.Tensor):
        x = x.detach().contiguous().numpy()
    out[name] = hashlib.blake2b(np.ascontiguousarray(x).tobytes(), digest_size=8).hexdigest()

g = torch.Generator().manual_seed(0)
x = torch.rand(64, 3, 48, 24, generator=g, requires_grad=True)
w1 = torch.randn(16, 3, 3, 3, generator=g, requires_grad=True)
w2 = torch.randn(32, 16, 1, 1, generator=g, requires_grad=True)
y = F.conv2d(F.relu(F.conv2d(x, w1, padding=1)), w2)
y.square().sum().backward()
put("conv fwd", y); put("conv grad x", x.grad); put("conv grad w", w1.grad)
with torch.no_grad():
    put("conv inference", F.conv2d(x, w1, padding=1))
    put("conv 5x5 inference", F.conv2d(x[:, :1], torch.randn(8, 1, 5, 5, generator=g), padding=2))
for m, k, n in ((64, 32, 16), (128, 256, 128), (300, 300, 300), (1, 512, 512)):
    put(f"mm {m}x{k}x{n}", torch.randn(m, k, generator=g) @ torch.randn(k, n, generator=g))
put("addmm (linear)", F.linear(torch.randn(256, 96, generator=g), torch.randn(128, 96, generator=g),
                               torch.randn(128, generator=g)))
put("bmm 1000x16^2", torch.bmm(torch.randn(1000, 16, 16, generator=g), torch.randn(1000, 16, 16, generator=g)))
put("bmm 8x64x64", torch.bmm(torch.randn(8, 64, 64, generator=g), torch.randn(8, 64, 64, generator=g)))
q = torch.randn(2, 4, 50, 32, generator=g)
put("sdpa", F.scaled_dot_product_attention(q, q.flip(2), q, is_causal=True))
a = torch.randn(64, 64, generator=g, dtype=torch.float64)
s = a @ a.T + 64 * torch.eye(64, dtype=torch.float64)
put("cholesky", torch.linalg.cholesky(s)); put("eigh", torch.linalg.eigh(s)[0]); put("qr", torch.linalg.qr(a)[0])
put("solve", torch.linalg.solve(s, a)); put("svdvals", torch.linalg.svdvals(a.float()))
put("softmax/layer_norm", F.layer_norm(torch.randn(64, 256, generator=g).softmax(-1), (256,)))
r = np.random.default_rng(0)
v = r.standard_normal(100_003)
for f in ("exp", "log", "expm1", "log1p", "tanh", "sin"):
    put(f"np.{f}", getattr(np, f)(np.abs(v) if f.startswith("log") else v))
put("np.power", np.power(np.abs(v), 0.3)); put("np.sum", v.sum()); put("np.sort", np.sort(v))
m = r.standard_normal((200, 200))
put("np.matmul (OpenBLAS)", m @ m); put("np.einsum", np.einsum("ij,jk->ik", m, m))
put("np.linalg.eigh", np.linalg.eigh(m + m.T)[0])
put("scipy.linalg.solve", scipy.linalg.solve(m @ m.T + np.eye(200), m))
put("scipy.special.logsumexp", scipy.special.logsumexp(m, axis=1))
print(json.dumps(out))
"""


def _probe(env_overrides: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in portable.QUICK_ENV and k != "MKL_ENABLE_INSTRUCTIONS"}
    env.update(portable.QUICK_ENV)
    for k, v in env_overrides.items():
        if v:
            env[k] = v
        else:
            env.pop(k, None)
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def _differ(a: dict[str, str], b: dict[str, str]) -> list[str]:
    return [k for k in a if a[k] != b[k]]


@pytest.fixture(scope="module")
def quick() -> dict[str, str]:
    return _probe({})


def test_the_emulated_other_machine_gives_the_same_bits(quick):
    other = _probe(portability.PRESETS["other"])
    assert not _differ(quick, other), f"kernels whose bits depend on the CPU under QUICK_ENV: {_differ(quick, other)}"


def test_the_emulation_detects_the_kernels_issue_44_found(quick):
    """Before issue 44 the same overrides changed convolutions (oneDNN) and, on a CPU with AVX-512, NumPy's float64
    exp (its AVX-512 loops)."""
    from numpy._core._multiarray_umath import __cpu_features__

    before = portable.BEFORE_44
    differ = _differ(_probe(before), _probe({**before, **portability.PRESETS["other"]}))
    assert "conv fwd" in differ, differ
    if __cpu_features__.get("X86_V4"):
        assert "np.exp" in differ, differ


def test_reruns_give_the_same_bits(quick):
    assert quick == _probe({})
