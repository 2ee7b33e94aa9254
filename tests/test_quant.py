"""gg.quant: ggml's block types, bit-identical to the gguf package's numpy code, checked against an
independent per-element float64 decoder written from the layouts, with quantization error bounds."""
import struct
import warnings

import numpy as np
import pytest

import gg
from gg import dtypes, quant
from gg.dtypes import Q4_0, Q4_1, Q4_K, Q6_K, Q8_0

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf.constants import GGML_QUANT_SIZES  # noqa: E402

GGUF_TYPE = {Q8_0: GT.Q8_0, Q4_0: GT.Q4_0, Q4_1: GT.Q4_1, Q4_K: GT.Q4_K, Q6_K: GT.Q6_K}
ENCODABLE = (Q8_0, Q4_0, Q4_1)
# byte offsets of each block's F16 scales (d, and m / dmin where the type has one)
SCALE_OFFSETS = {Q8_0: (0,), Q4_0: (0,), Q4_1: (0, 2), Q4_K: (0, 2), Q6_K: (208,)}
SPECIAL_F16 = {"zero": 0x0000, "neg_zero": 0x8000, "subnormal": 0x0003, "neg_subnormal": 0x83FF,
               "inf": 0x7C00, "neg_inf": 0xFC00, "nan": 0x7E00, "nan_payload": 0x7C01, "max": 0x7BFF}


def gguf_quantize(x, dtype):
    with warnings.catch_warnings():  # gguf's own code warns on overflowing scales
        warnings.simplefilter("ignore")
        return gguf.quants.quantize(x, GGUF_TYPE[dtype])


def gguf_dequantize(raw, dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gguf.quants.dequantize(raw, GGUF_TYPE[dtype])


def same_bits(a, b):
    """float32 arrays equal bit for bit (signed zeros, infinities), NaN where the other is NaN."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if a.shape != b.shape:
        return False
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(a.view(np.uint32)[~nan], b.view(np.uint32)[~nan]))


# ---- layouts and sizes -----------------------------------------------------------------------------

@pytest.mark.parametrize("dt", list(GGUF_TYPE))
def test_block_layout_matches_ggml(dt):
    assert (dt.block_size, dt.size) == GGML_QUANT_SIZES[GGUF_TYPE[dt]]
    assert dt.gguf_type == int(GGUF_TYPE[dt]) and dtypes.from_gguf_type(dt.gguf_type) is dt
    assert dt.is_quantized and dt.is_float and dt.storage == np.uint8
    assert dt in dtypes.ALL and dt in dtypes.QUANTIZED and getattr(gg.dtypes, dt.name.upper()) is dt


def test_plain_dtypes_are_unchanged():
    for dt, gt in ((dtypes.F32, GT.F32), (dtypes.F16, GT.F16), (dtypes.BF16, GT.BF16), (dtypes.I32, GT.I32)):
        assert dt.block_size == 1 and not dt.is_quantized and dt.gguf_type == int(gt)
    with pytest.raises(gg.DTypeError, match="not supported"):
        dtypes.from_gguf_type(6)  # Q5_0


def test_row_bytes():
    assert quant.row_bytes(Q8_0, 4096) == 128 * 34
    assert quant.row_bytes(Q4_K, 512) == 288
    assert quant.row_bytes(Q6_K, 256) == 210
    assert quant.row_bytes(dtypes.F16, 5) == 10
    assert quant.tensor_bytes(Q4_0, (64, 3, 2)) == 2 * 18 * 6
    assert quant.check_row_length(Q4_1, 96) == 3
    for dt, ne0 in ((Q8_0, 33), (Q4_K, 32), (Q6_K, 100), (Q4_0, -32)):
        with pytest.raises(gg.ShapeError, match="ne0"):
            quant.row_bytes(dt, ne0)


def test_block_types_refuse_per_element_codecs():
    with pytest.raises(gg.DTypeError, match="block type"):
        dtypes.to_float32(np.zeros(34, np.uint8), Q8_0)
    with pytest.raises(gg.DTypeError, match="block type"):
        dtypes.encode(np.zeros(32, np.float32), Q4_0)


# ---- quantize: bit-identical to gguf ----------------------------------------------------------------

def extreme_rows(rng, k):
    """Rows that probe every branch of the encoders: sizes from tiny (zero F16 scale, 1/d = inf) to
    huge (F16 scale overflow), constant rows, zeros, negative extremes, ties."""
    u = lambda s: rng.uniform(-1, 1, k) * s  # noqa: E731
    rows = [u(1.0), u(1e-30), u(1e-38), u(1e-44), u(1e-5), u(7e4), u(1e7), u(1e30), u(3.4e38),
            np.full(k, 0.3), np.full(k, -2.5), np.full(k, 1e-40), np.zeros(k), np.full(k, -0.0)]
    with_zeros = u(2.0)
    with_zeros[::3] = 0
    negative_max = np.abs(u(1.0))
    negative_max[5] = -7.0  # the largest magnitude is negative
    tie = u(1.0)
    tie[3], tie[9] = 4.0, -4.0  # equal magnitudes of both signs: the first wins
    # Q8_0 with amax = 127 has 1/d = 1: x * id is x itself, so these hit the rounding ties and
    # the largest float below 0.5 (which x + 0.5 would wrongly round up)
    halves = rng.integers(-254, 255, k) / 2.0
    halves[:8] = [127.0, 0.49999997, -0.49999997, 0.5, -0.5, 1.5, -2.5, 126.5]
    ramp = np.linspace(-1, 1, k)
    one_big = u(1e-3)
    one_big[k - 1] = 1e3
    rows += [with_zeros, negative_max, tie, halves, ramp, one_big, -np.abs(u(3.0))]
    return np.stack(rows).astype(np.float32)


@pytest.mark.parametrize("dt", ENCODABLE)
def test_quantize_bit_identical_to_gguf_random(dt):
    rng = np.random.default_rng(1)
    for shape in ((1, 32), (7, 160), (3, 5, 64), (13, 1024)):
        x = (rng.standard_normal(shape) * rng.uniform(0.01, 10.0, shape[:-1] + (1,))).astype(np.float32)
        got = quant.quantize(x, dt)
        assert got.dtype == np.uint8 and got.shape == shape[:-1] + (shape[-1] // 32 * dt.size,)
        assert np.array_equal(got, gguf_quantize(x, dt)), (dt, shape)


@pytest.mark.parametrize("dt", ENCODABLE)
def test_quantize_bit_identical_to_gguf_extremes(dt):
    rng = np.random.default_rng(2)
    x = extreme_rows(rng, 96)
    got = quant.quantize(x, dt)
    want = gguf_quantize(x, dt)
    bad = np.nonzero((got != want).any(axis=1))[0]
    assert bad.size == 0, f"{dt}: rows {bad.tolist()} differ from gguf"
    # and per block in any order of rows: blocks are independent
    perm = rng.permutation(x.shape[0])
    assert np.array_equal(quant.quantize(x[perm], dt), want[perm])


@pytest.mark.parametrize("dt", ENCODABLE)
@pytest.mark.parametrize("src", [np.float64, np.float16])
def test_quantize_other_float_inputs_round_to_f32_first(dt, src):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 64)).astype(src)
    assert np.array_equal(quant.quantize(x, dt), gguf_quantize(x.astype(np.float32), dt))


def test_quantize_crosses_chunk_boundaries(monkeypatch):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((9, 224)).astype(np.float32)
    want = {dt: quant.quantize(x, dt) for dt in ENCODABLE}
    raw = {dt: rng.integers(0, 256, (5, 7 * dt.size), dtype=np.uint8) for dt in GGUF_TYPE}
    deq = {dt: quant.dequantize(r, dt) for dt, r in raw.items()}
    monkeypatch.setattr(quant, "_CHUNK_BLOCKS", 4)  # 63 / 35 blocks: chunks end inside rows
    for dt in ENCODABLE:
        assert np.array_equal(quant.quantize(x, dt), want[dt])
    for dt, r in raw.items():
        assert same_bits(quant.dequantize(r, dt), deq[dt])


def test_quantize_errors():
    x = np.ones((2, 64), np.float32)
    with pytest.raises(gg.DTypeError, match="not implemented"):
        quant.quantize(x, Q4_K)
    with pytest.raises(gg.DTypeError, match="not a block type"):
        quant.quantize(x, dtypes.F32)
    with pytest.raises(gg.DTypeError, match="floats"):
        quant.quantize(np.ones((2, 64), np.int32), Q8_0)
    with pytest.raises(gg.ShapeError, match="multiple of 32"):
        quant.quantize(np.ones((2, 48), np.float32), Q8_0)
    with pytest.raises(gg.ShapeError, match="0-d"):
        quant.quantize(np.float32(1), Q4_0)
    for bad in (np.nan, np.inf, -np.inf):
        y = x.copy()
        y[1, 7] = bad
        with pytest.raises(gg.GGError, match="NaN/inf"):
            quant.quantize(y, Q4_1)


def test_quantize_empty_rows():
    assert quant.quantize(np.zeros((0, 64), np.float32), Q8_0).shape == (0, 68)
    assert quant.dequantize(np.zeros((3, 0), np.uint8), Q4_K).shape == (3, 0)


# ---- dequantize: bit-identical to gguf, and to a float64 decoder written from the layouts ----------

def random_blocks(rng, dt, n, scales="valid"):
    """n random blocks of dt: random bytes, F16 scales random finite values (valid) or, one block
    per kind, the special values of SPECIAL_F16."""
    raw = rng.integers(0, 256, (n, dt.size), dtype=np.uint8)
    for off in SCALE_OFFSETS[dt]:
        if scales == "valid":
            vals = (rng.uniform(-1, 1, n) * 10.0 ** rng.uniform(-6, 3, n)).astype(np.float16)
        else:
            vals = np.array([SPECIAL_F16[k] for k in rng.choice(sorted(SPECIAL_F16), n)], np.uint16).view(np.float16)
        raw[:, off:off + 2] = vals.astype("<f2").view(np.uint8).reshape(n, 2)
    return raw


@pytest.mark.parametrize("dt", list(GGUF_TYPE))
@pytest.mark.parametrize("scales", ["valid", "special"])
def test_dequantize_bit_identical_to_gguf(dt, scales):
    rng = np.random.default_rng(5)
    raw = random_blocks(rng, dt, 3 * 11, scales).reshape(3, 11 * dt.size)
    got = quant.dequantize(raw, dt)
    assert got.dtype == np.float32 and got.shape == (3, 11 * dt.block_size)
    assert same_bits(got, gguf_dequantize(raw, dt))
    if scales == "special":
        assert np.isnan(got).any() and np.isinf(got).any()  # the special scales did reach the values


def test_dequantize_fully_random_bytes_match_gguf():
    rng = np.random.default_rng(6)
    for dt in GGUF_TYPE:
        raw = rng.integers(0, 256, (2, 3, 5 * dt.size), dtype=np.uint8)
        assert same_bits(quant.dequantize(raw, dt), gguf_dequantize(raw, dt))


def f16(b, off):
    return float(np.frombuffer(bytes(b[off:off + 2]), "<f2")[0])


def ref_block(dt, b):
    """One block decoded element by element in float64, from the layout alone."""
    b = [int(v) for v in b]
    y = np.zeros(dt.block_size)
    if dt is Q8_0:
        d = f16(b, 0)
        for j in range(32):
            y[j] = d * struct.unpack("b", bytes([b[2 + j]]))[0]
    elif dt in (Q4_0, Q4_1):
        d, base = f16(b, 0), (4 if dt is Q4_1 else 2)
        for j in range(16):
            lo, hi = b[base + j] & 15, b[base + j] >> 4
            if dt is Q4_0:
                y[j], y[j + 16] = d * (lo - 8), d * (hi - 8)
            else:
                m = f16(b, 2)
                y[j], y[j + 16] = d * lo + m, d * hi + m
    elif dt is Q4_K:
        d, dmin, s = f16(b, 0), f16(b, 2), b[4:16]
        for sub in range(8):
            if sub < 4:
                sc, mn = s[sub] & 63, s[sub + 4] & 63
            else:
                sc = (s[sub + 4] & 15) | ((s[sub - 4] >> 6) << 4)
                mn = (s[sub + 4] >> 4) | ((s[sub] >> 6) << 4)
            for l in range(32):
                byte = b[16 + (sub // 2) * 32 + l]
                q = (byte >> 4) if sub % 2 else (byte & 15)
                y[sub * 32 + l] = d * sc * q - dmin * mn
    elif dt is Q6_K:
        d = f16(b, 208)
        for e in range(256):
            half, p = divmod(e, 128)
            quarter, l = divmod(p, 32)
            ql = b[half * 64 + l + (32 if quarter in (1, 3) else 0)]
            low = (ql >> 4) if quarter >= 2 else (ql & 15)
            high = (b[128 + half * 32 + l] >> (2 * quarter)) & 3
            scale = struct.unpack("b", bytes([b[192 + e // 16]]))[0]
            y[e] = d * scale * ((low | (high << 4)) - 32)
    return y


@pytest.mark.parametrize("dt", list(GGUF_TYPE))
def test_dequantize_matches_float64_layout_reference(dt):
    rng = np.random.default_rng(7)
    raw = random_blocks(rng, dt, 4)
    got = quant.dequantize(raw.reshape(-1), dt).reshape(4, dt.block_size)
    ref = np.stack([ref_block(dt, b) for b in raw])
    # float32 rounds each of the (at most 3) operations once
    scale = np.abs(ref).max(axis=1, keepdims=True) + 1e-30
    assert np.all(np.abs(got - ref) <= 4 * np.finfo(np.float32).eps * scale), dt


def test_dequantize_accepts_views_bytes_and_plain_floats():
    rng = np.random.default_rng(8)
    raw = random_blocks(rng, Q4_0, 12).reshape(4, 3 * 18)
    want = quant.dequantize(raw, Q4_0)
    assert same_bits(quant.dequantize(raw[::2], Q4_0), want[::2])  # non-contiguous rows
    assert same_bits(quant.dequantize(raw[1].tobytes(), Q4_0), want[1])
    x = rng.standard_normal((3, 5)).astype(np.float32)
    for dt, arr in ((dtypes.F32, x), (dtypes.F16, x.astype(np.float16)), (dtypes.BF16, dtypes.encode(x, dtypes.BF16))):
        got = quant.dequantize(np.ascontiguousarray(arr).view(np.uint8), dt)
        assert same_bits(got, dtypes.to_float32(arr, dt))


def test_dequantize_errors():
    with pytest.raises(gg.ShapeError, match="whole number"):
        quant.dequantize(np.zeros((2, 35), np.uint8), Q8_0)
    with pytest.raises(gg.DTypeError, match="uint8"):
        quant.dequantize(np.zeros((2, 34), np.int16), Q8_0)
    with pytest.raises(gg.DTypeError, match="cannot decode"):
        quant.dequantize(np.zeros((2, 8), np.uint8), dtypes.I32)
    with pytest.raises(gg.DTypeError, match="numpy array"):
        quant.dequantize([0] * 34, Q8_0)
    with pytest.raises(gg.ShapeError, match="0-d"):
        quant.dequantize(np.uint8(3), Q8_0)


# ---- round trip: error within each type's bound, against float64 ----------------------------------

F16_REL = 2.0 ** -11  # relative rounding of an F16 scale


def test_round_trip_error_bounds():
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((33, 256)) * rng.uniform(1e-3, 1e3, (33, 1))).astype(np.float32)
    blocks = x.astype(np.float64).reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    for dt in ENCODABLE:
        y = quant.dequantize(quant.quantize(x, dt), dt).astype(np.float64).reshape(-1, 32)
        err = np.abs(y - blocks)
        if dt is Q8_0:
            d = amax / 127
            bound = d * (0.5 + 127 * F16_REL) * (1 + 1e-6)
        elif dt is Q4_0:
            # the extreme maps to -8 exactly; the grid ends at +7, so values of the opposite sign
            # beyond 7.5 steps clip (error up to one step)
            d = amax / 8
            extreme = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1)[:, None], axis=1)
            clipped = (-blocks * np.sign(extreme)) / d > 7.5 - 1e-4
            bound = d * (np.where(clipped, 1.0, 0.5) + 8 * F16_REL) * (1 + 1e-6)
        else:
            lo, hi = blocks.min(axis=1, keepdims=True), blocks.max(axis=1, keepdims=True)
            d = (hi - lo) / 15
            bound = (d * (0.5 + 15 * F16_REL) + np.abs(lo) * F16_REL) * (1 + 1e-6)
        assert np.all(err <= bound), (dt, float((err / bound).max()))
        nmse = float(((y - blocks) ** 2).sum() / (blocks ** 2).sum())
        limit = {Q8_0: 5e-5, Q4_0: 1.5e-2, Q4_1: 1.5e-2}[dt]  # ~ (step^2 / 12) / var
        assert nmse <= limit, (dt, nmse)


def test_round_trip_is_idempotent_on_grid_values():
    """Dequantized values lie on the grid: quantizing them again gives the same bytes (Q8_0 and
    Q4_0 are symmetric grids with the extreme kept exactly)."""
    rng = np.random.default_rng(10)
    x = rng.standard_normal((5, 128)).astype(np.float32)
    for dt in (Q8_0, Q4_0):
        once = quant.quantize(x, dt)
        y = quant.dequantize(once, dt)
        np.testing.assert_allclose(quant.dequantize(quant.quantize(y, dt), dt), y, rtol=2e-3, atol=0)
