"""Matmul kernels through the binding's test hook, against gguf's own
quantizers and a numpy reference, for every type and every SIMD level the
CPU has (scalar always runs)."""
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize, quantize  # noqa: E402

from colibri_lab import _engine  # noqa: E402
from colibri_lab.errors import InvalidRequestError  # noqa: E402

Q = gguf.GGMLQuantizationType
TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]
QUANTIZED = {Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1}
SIMD = ["scalar", "avx2", "avx512"]


def _need(simd):
    avail = _engine.simd_available()
    assert "scalar" in avail
    if simd not in avail:
        pytest.skip(f"CPU lacks {simd}")


def _weights(qtype, n_out, n_in, rng):
    """Raw GGUF blocks (uint8, n_out rows) and their dequantized float matrix."""
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    w += (np.arange(n_out) % 3)[:, None].astype(np.float32) * 0.3  # nonzero row means
    if qtype == Q.F32:
        raw = w.copy()
    elif qtype == Q.F16:
        raw = w.astype(np.float16)
    else:
        raw = quantize(w, qtype)
    deq = dequantize(raw, qtype).astype(np.float64).reshape(n_out, n_in)
    return np.ascontiguousarray(raw).view(np.uint8).reshape(-1), deq


def _rel(y, ref):
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("simd", SIMD)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_out,n_in,n_rows", [(64, 576, 3), (37, 1536, 5), (192, 64, 9)])
def test_matmul_matches_numpy(simd, qtype, n_out, n_in, n_rows):
    _need(simd)
    rng = np.random.default_rng(n_out * 1000 + n_in + int(qtype))
    raw, wd = _weights(qtype, n_out, n_in, rng)
    x = rng.standard_normal((n_rows, n_in)).astype(np.float32)
    y = _engine.kernel_matmul(int(qtype), raw, n_out, n_in, x, simd, 1)
    assert y.shape == (n_rows, n_out) and y.dtype == np.float32
    ref = x.astype(np.float64) @ wd.T
    tol = 2e-2 if qtype in QUANTIZED else 1e-5
    assert _rel(y, ref) <= tol


@pytest.mark.parametrize("simd", SIMD)
@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.F16], ids=lambda t: t.name)
def test_batch_and_threads_bit_identical(simd, qtype):
    """Each row's result is the same bits alone, in a batch, and on 1-3 threads."""
    _need(simd)
    rng = np.random.default_rng(7)
    n_out, n_in, n_rows = 70, 576, 7
    raw, _ = _weights(qtype, n_out, n_in, rng)
    x = rng.standard_normal((n_rows, n_in)).astype(np.float32)
    alone = np.stack([_engine.kernel_matmul(int(qtype), raw, n_out, n_in, x[r:r + 1], simd, 1)[0]
                      for r in range(n_rows)])
    for n_threads in (1, 2, 3):
        y = _engine.kernel_matmul(int(qtype), raw, n_out, n_in, x, simd, n_threads)
        assert np.array_equal(y.view(np.uint32), alone.view(np.uint32)), n_threads


def test_simd_levels_agree_closely():
    """Different SIMD levels may round differently, but only slightly."""
    rng = np.random.default_rng(3)
    raw, _ = _weights(Q.Q4_1, 48, 1536, rng)
    x = rng.standard_normal((2, 1536)).astype(np.float32)
    ys = {s: _engine.kernel_matmul(int(Q.Q4_1), raw, 48, 1536, x, s, 1) for s in _engine.simd_available()}
    base = ys["scalar"]
    for s, y in ys.items():
        assert _rel(y, base) <= 1e-5, s


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q5_0], ids=lambda t: t.name)
def test_avx2_panels_match_avx512_bits(qtype):
    """Q4_0, Q4_1 and Q5_0 run panel kernels at AVX2 and AVX-512 with the same
    exact integer sums and the same float steps per output lane: the two
    levels give the same bits, in 8-row tiles, 4-row tiles and tails, for a
    partial last panel and on 1 and 3 threads."""
    _need("avx2")
    _need("avx512")
    rng = np.random.default_rng(11)
    n_out, n_in, n_rows = 45, 896, 15
    raw, _ = _weights(qtype, n_out, n_in, rng)
    x = rng.standard_normal((n_rows, n_in)).astype(np.float32)
    x[2] *= 1e-20  # tiny and huge rows: the scales' float range
    x[3] *= 1e20
    x[4, 64:96] = 0.0  # a zero activation block
    ref = _engine.kernel_matmul(int(qtype), raw, n_out, n_in, x, "avx512", 1)
    for n_threads in (1, 3):
        y = _engine.kernel_matmul(int(qtype), raw, n_out, n_in, x, "avx2", n_threads)
        assert np.array_equal(y.view(np.uint32), ref.view(np.uint32)), n_threads


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q5_0, Q.Q8_0], ids=lambda t: t.name)
def test_avx2_row_kernels_past_the_panel_limit(qtype):
    """Rows longer than the panel layout takes (4096 blocks) keep the file
    layout, and AVX2 runs its row kernels on them; Q8_0 always does."""
    _need("avx2")
    rng = np.random.default_rng(13)
    n_out, n_in, n_rows = 3, 32 * 4100, 2
    raw, wd = _weights(qtype, n_out, n_in, rng)
    x = rng.standard_normal((n_rows, n_in)).astype(np.float32)
    y = _engine.kernel_matmul(int(qtype), raw, n_out, n_in, x, "avx2", 2)
    assert _rel(y, x.astype(np.float64) @ wd.T) <= 2e-2
    alone = np.stack([_engine.kernel_matmul(int(qtype), raw, n_out, n_in, x[r:r + 1], "avx2", 1)[0]
                      for r in range(n_rows)])
    assert np.array_equal(y.view(np.uint32), alone.view(np.uint32))


def test_bad_arguments_raise():
    rng = np.random.default_rng(1)
    raw, _ = _weights(Q.Q8_0, 4, 64, rng)
    x = np.zeros((1, 64), np.float32)
    with pytest.raises(InvalidRequestError):
        _engine.kernel_matmul(int(Q.Q8_0), raw, 4, 64, x, "sse9", 1)
    with pytest.raises(InvalidRequestError):
        _engine.kernel_matmul(int(Q.Q8_0), raw, 4, 48, x[:, :48], "scalar", 1)  # not a block multiple
    for s in SIMD:
        if s not in _engine.simd_available():
            with pytest.raises(InvalidRequestError):
                _engine.kernel_matmul(int(Q.Q8_0), raw, 4, 64, x, s, 1)
