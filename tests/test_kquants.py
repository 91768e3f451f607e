"""K-quant kernels (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) through the binding's test hook
(_engine.kernel_matmul -> cb_kernel_matmul -> kquants*.c), against gguf's
own dequantizer and numpy, on every SIMD level the CPU has.

gguf.quants cannot quantize K-quants, so weights are either built by
tinymodels.quantize_k (valid blocks from real-valued rows) or are random
bytes (every byte pattern is a valid K-quant block except non-finite f16
scales, which are replaced): both are read back with gguf.quants.dequantize,
an implementation independent of ours.
"""
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize  # noqa: E402

from colibri_lab import _engine  # noqa: E402
from colibri_lab.errors import InvalidRequestError  # noqa: E402
from tinymodels import quantize_k  # noqa: E402

Q = gguf.GGMLQuantizationType
KTYPES = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
BLOCK_BYTES = {Q.Q2_K: 84, Q.Q3_K: 110, Q.Q4_K: 144, Q.Q5_K: 176, Q.Q6_K: 210}
SCALE_OFFSET = {Q.Q2_K: 80, Q.Q3_K: 108, Q.Q4_K: 0, Q.Q5_K: 0, Q.Q6_K: 208}  # f16 d (and dmin) in a block
PANEL = {Q.Q4_K, Q.Q5_K, Q.Q6_K}  # repacked into panels for the AVX2 and AVX-512 kernels
SIMD = ["scalar", "avx2", "avx512"]


def _need(simd):
    if simd not in _engine.simd_available():
        pytest.skip(f"CPU lacks {simd}")


def _random_blocks(qtype, n_out, n_in, rng):
    """Random bytes with finite, moderate f16 super-block scales."""
    nb = n_in // 256
    raw = rng.integers(0, 256, (n_out, nb, BLOCK_BYTES[qtype]), dtype=np.uint8)
    scales = (rng.uniform(0.5, 2.0, (n_out, nb, 2)) * 1e-2).astype(np.float16).view(np.uint8).reshape(n_out, nb, 4)
    off = SCALE_OFFSET[qtype]
    n = 2 if qtype in (Q.Q3_K, Q.Q6_K) else 4
    raw[:, :, off:off + n] = scales[:, :, :n]
    return raw.reshape(n_out, -1)


def _weights(qtype, n_out, n_in, rng, kind):
    if kind == "quantized" and qtype in PANEL:  # quantize_k knows Q4_K / Q5_K / Q6_K
        w = rng.standard_normal((n_out, n_in)).astype(np.float32)
        w += (np.arange(n_out) % 3)[:, None].astype(np.float32) * 0.3  # nonzero means: exercises the mins
        raw = quantize_k(w, qtype)
    else:
        raw = _random_blocks(qtype, n_out, n_in, rng)
    deq = dequantize(raw, qtype).astype(np.float64).reshape(n_out, n_in)
    return np.ascontiguousarray(raw).reshape(-1), deq


def _rel(y, ref):
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


def test_type_table():
    for t in KTYPES:
        assert _engine.type_size(int(t), 512) == 2 * BLOCK_BYTES[t]
        assert _engine.type_name(int(t)).lower() == t.name.lower()
    assert _engine.type_size(int(Q.Q4_K), 300) == 0   # not a multiple of 256


@pytest.mark.parametrize("simd", SIMD)
@pytest.mark.parametrize("qtype", KTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("kind", ["quantized", "random"])
# 37 rows: full 8-row tiles of the AVX-512 panel kernels and a 5-row tail,
# 40 outputs: two panels and a masked one, 768 inputs: 3 super-blocks;
# 8960 inputs x 21 rows: two row blocks of the panel drivers (16 rows each there)
@pytest.mark.parametrize("n_out,n_in,n_rows", [(40, 256, 1), (37, 1024, 5), (8, 512, 9), (50, 8960, 10), (40, 768, 37),
                                               (24, 8960, 21)])
def test_matmul_matches_dequantize(simd, qtype, kind, n_out, n_in, n_rows):
    _need(simd)
    rng = np.random.default_rng(n_out * 1000 + n_in + int(qtype) + (7 if kind == "random" else 0))
    raw, wd = _weights(qtype, n_out, n_in, rng, kind)
    x = rng.standard_normal((n_rows, n_in)).astype(np.float32)
    y = _engine.kernel_matmul(int(qtype), raw, n_out, n_in, x, simd, 1)
    ref = x.astype(np.float64) @ wd.T
    # activations are rounded to 8 bits per 32 values (Q2_K, Q3_K; like Q8_0, 2e-2 in
    # test_kernels) or per 256 (Q4_K, Q5_K, Q6_K: llama.cpp's Q8_K), ~1e-2 here
    assert _rel(y, ref) <= 2e-2


@pytest.mark.parametrize("qtype", KTYPES, ids=lambda t: t.name)
def test_activation_rounding_is_the_only_error(qtype):
    """With activations that are exactly representable in int8 blocks
    (integers, block max 127: scale 1 for blocks of 32 and of 256) the
    kernel equals the float product to float rounding — so the weight
    decoding itself is exact."""
    rng = np.random.default_rng(11)
    n_out, n_in = 16, 512
    raw, wd = _weights(qtype, n_out, n_in, rng, "random")
    x = rng.integers(-127, 128, (3, n_in)).astype(np.float32)
    x[:, ::32] = 127.0  # every block's max is 127 -> scale exactly 1
    for simd in _engine.simd_available():
        y = _engine.kernel_matmul(int(qtype), raw, n_out, n_in, x, simd, 1)
        ref = x.astype(np.float64) @ wd.T
        assert np.max(np.abs(y - ref)) <= 1e-5 * np.max(np.abs(ref)), simd


@pytest.mark.parametrize("qtype", KTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("kind", ["quantized", "random"])
def test_simd_levels_agree(qtype, kind):
    """Every level does the same exact integer sums and the same float steps
    in the same order (Q4_K / Q5_K / Q6_K: one per super-block against Q8K
    activations, quantized to the same bytes at every level; Q2_K / Q3_K:
    one per 32 activations): bit-identical to scalar, at 8-row tiles, tails
    and 1 to 3 threads."""
    rng = np.random.default_rng(5)
    raw, _ = _weights(qtype, 40, 768, rng, kind)
    x = rng.standard_normal((13, 768)).astype(np.float32)
    x[3] *= 1e-20  # tiny and huge rows: the scales' float range
    x[4] *= 1e20
    x[5, 256:512] = 0.0  # a zero super-block of activations
    ys = {(s, t): _engine.kernel_matmul(int(qtype), raw, 40, 768, x, s, t)
          for s in _engine.simd_available() for t in (1, 3)}
    for key, y in ys.items():
        assert np.array_equal(y.view(np.uint32), ys[("scalar", 1)].view(np.uint32)), key


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
def test_decode_rows_agree_across_levels(qtype):
    """One and two rows (decode, and a verify of one draft) pick their kernel
    by CPU (a Zen 4 runs Q4_K's on the 256-bit kernel of ymm_decode inside
    the AVX-512 level; set_ymm_decode runs either kernel on any AVX-512 CPU):
    every level and kernel must still give the scalar path's bits, in one and
    two threads, over enough panels that both threads get several, with a
    last panel of 5 outputs (less than half of one)."""
    rng = np.random.default_rng(11)
    raw, _ = _weights(qtype, 16 * 7 + 5, 1536, rng, "quantized")
    start = _engine.ymm_decode()
    try:
        for ymm in (False, True):
            _engine.set_ymm_decode(ymm)
            for n_rows in (1, 2):
                x = rng.standard_normal((n_rows, 1536)).astype(np.float32)
                ref = _engine.kernel_matmul(int(qtype), raw, 16 * 7 + 5, 1536, x, "scalar", 1)
                for s in _engine.simd_available():
                    for t in (1, 2):
                        y = _engine.kernel_matmul(int(qtype), raw, 16 * 7 + 5, 1536, x, s, t)
                        assert np.array_equal(y.view(np.uint32), ref.view(np.uint32)), (ymm, n_rows, s, t)
    finally:
        assert _engine.set_ymm_decode(None) == start


def test_ymm_decode_switch():
    """set_ymm_decode takes True, False or None (the CPU's choice) and
    refuses anything else by name."""
    start = _engine.ymm_decode()
    try:
        assert _engine.set_ymm_decode(True) is True and _engine.ymm_decode() is True
        assert _engine.set_ymm_decode(False) is False
        with pytest.raises(InvalidRequestError, match="True, False or None"):
            _engine.set_ymm_decode("yes")
    finally:
        assert _engine.set_ymm_decode(None) == start


@pytest.mark.parametrize("simd", SIMD)
@pytest.mark.parametrize("qtype", KTYPES, ids=lambda t: t.name)
def test_batch_and_threads_bit_identical(simd, qtype):
    _need(simd)
    rng = np.random.default_rng(9)
    # 37 rows: 8-row tiles and a 5-row tail must give each row the bits it
    # gets alone, as must every split over threads
    n_out, n_in, n_rows = 70, 768, 37
    raw, _ = _weights(qtype, n_out, n_in, rng, "quantized")
    x = rng.standard_normal((n_rows, n_in)).astype(np.float32)
    alone = np.stack([_engine.kernel_matmul(int(qtype), raw, n_out, n_in, x[r:r + 1], simd, 1)[0]
                      for r in range(n_rows)])
    for n_threads in (1, 2, 3):
        y = _engine.kernel_matmul(int(qtype), raw, n_out, n_in, x, simd, n_threads)
        assert np.array_equal(y.view(np.uint32), alone.view(np.uint32)), n_threads


def test_wrong_nibble_order_would_fail():
    """The dequantize comparison can fail: swapping the two nibble halves of
    Q4_K's packed quants moves the product far beyond the tolerance."""
    rng = np.random.default_rng(2)
    raw, wd = _weights(Q.Q4_K, 8, 256, rng, "quantized")
    bad = raw.reshape(8, 144).copy()
    qs = bad[:, 16:]
    bad[:, 16:] = ((qs & 0x0F) << 4) | (qs >> 4)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    y = _engine.kernel_matmul(int(Q.Q4_K), bad.reshape(-1), 8, 256, x, "scalar", 1)
    assert _rel(y, x.astype(np.float64) @ wd.T) > 0.2


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K], ids=lambda t: t.name)
def test_amx_tiles_bit_identical(qtype):
    """Where the CPU has AMX, 16-row tiles of prefill-sized batches run on
    it (staged digits of the scales, one tile product per 64 inputs); the
    result must be the VNNI kernels' and the scalar path's bits, over row
    blocks, staged super-block chunks, a row tail and thread splits."""
    if not _engine.amx_active():
        pytest.skip("AMX tiles not active on this CPU (or COLIBRI_LAB_AMX=0)")
    rng = np.random.default_rng(21)
    n_out, n_in, n_rows = 40, 2560, 16 * 9 + 5
    raw, _ = _weights(qtype, n_out, n_in, rng, "random")
    x = rng.standard_normal((n_rows, n_in)).astype(np.float32)
    x[3] *= 1e-20
    x[20] *= 1e20
    x[40, 256:512] = 0.0
    scalar = _engine.kernel_matmul(int(qtype), raw, n_out, n_in, x, "scalar", 1)
    try:
        amx = {t: _engine.kernel_matmul(int(qtype), raw, n_out, n_in, x, "avx512", t) for t in (1, 2)}
        assert not _engine.set_amx(False)
        vnni = _engine.kernel_matmul(int(qtype), raw, n_out, n_in, x, "avx512", 2)
    finally:
        assert _engine.set_amx(True)
    for y in (*amx.values(), vnni):
        assert np.array_equal(y.view(np.uint32), scalar.view(np.uint32))


@pytest.mark.parametrize("simd", ["avx2", "avx512"])
@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K], ids=lambda t: t.name)
def test_panel_prefetch_modes_bit_identical(simd, qtype):
    """The panel kernels' software prefetch (on, off, or by CPU vendor) is a
    speed choice only: one row (decode, one pass per panel) and 20 rows
    (several row tiles per panel), one and two threads, every mode gives the
    same bits; the mode reads back and a bad one is refused."""
    from gguf.quants import quantize

    _need(simd)
    rng = np.random.default_rng(int(qtype) + 7)
    n_out, n_in = 16 * 5 + 3, 1024  # 6 panels: the ones 2 ahead are prefetched, a masked tail
    if qtype in PANEL:
        raw, _ = _weights(qtype, n_out, n_in, rng, "quantized")
    else:
        w = rng.standard_normal((n_out, n_in)).astype(np.float32)
        raw = np.ascontiguousarray(quantize(w, qtype)).view(np.uint8).reshape(-1)
    start = _engine.prefetch_mode()
    try:
        for n_rows in (1, 20):
            x = rng.standard_normal((n_rows, n_in)).astype(np.float32)
            ys = {}
            for mode in ("on", "off", "auto"):
                assert _engine.set_prefetch(mode) == mode == _engine.prefetch_mode()
                for nt in (1, 2):
                    ys[mode, nt] = _engine.kernel_matmul(int(qtype), raw, n_out, n_in, x, simd, nt)
            ref = ys["on", 1]
            for key, y in ys.items():
                assert np.array_equal(y.view(np.uint32), ref.view(np.uint32)), key
        with pytest.raises(InvalidRequestError, match="prefetch mode"):
            _engine.set_prefetch("sometimes")
        assert _engine.prefetch_mode() == "auto"
    finally:
        _engine.set_prefetch(start)
