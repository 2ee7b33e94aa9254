// Block-quantized weights (ggml's Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) read in place: row dequantization
// (get_rows, and F16 weights for a cuBLAS prefill GEMM) and the decode mat-vec with F32
// activations. Layouts and launch geometry: docs/quantization.md.
//
// Blocks of 34, 18 or 210 bytes straddle any 16-byte grid, so every kernel stages whole 16-byte
// vectors of the raw rows in shared memory and decodes from there. dequant_rows / get_rows: a
// warp per "tile" of a row (a whole number of blocks, a multiple of 16 bytes), lanes decoding
// "units" of 16 elements. The mat-vec (below, with its own design notes): a thread block per
// group of rows, chunks of every row copied ahead with cp.async; each weight byte is read once.
//
// Dequantization is bit-identical to gg.quant.dequantize (and gguf's numpy code): each value is
// computed with the same float32 operations in the same order, every rounding explicit (__fmul_rn
// and __fadd_rn are never contracted into an FMA). The mat-vec uses FMAs (F32 accumulation).
#include "epilogue.cuh"

typedef unsigned char u8;

// Warps per thread block (blockDim = (32, QUANT_WARPS)); the host passes it as -D.
#ifndef QUANT_WARPS  // the host passes it (families/blocks.py), with QUANT_TILE_<type>
#error "QUANT_WARPS comes from the host as -D"
#endif

// ---- shared-memory reads at the alignments the layouts give -----------------------------------

__device__ __forceinline__ unsigned sm_u16(const u8* p) { return *(const unsigned short*)p; }
__device__ __forceinline__ float sm_half(const u8* p) { return h2f(*(const u16*)p); }

// 16 bytes at a 2-byte aligned address as 4 little-endian words.
__device__ __forceinline__ void sm_words16_a2(const u8* p, unsigned* w) {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = sm_u16(p + 4 * i) | (sm_u16(p + 4 * i + 2) << 16);
}

// 8 bytes at a 2-byte aligned address.
__device__ __forceinline__ void sm_words8_a2(const u8* p, unsigned* w) {
#pragma unroll
    for (int i = 0; i < 2; ++i) w[i] = sm_u16(p + 4 * i) | (sm_u16(p + 4 * i + 2) << 16);
}

__device__ __forceinline__ unsigned byte_of(const unsigned* w, int i) { return (w[i >> 2] >> (8 * (i & 3))) & 0xffu; }

// ---- the types ---------------------------------------------------------------------------------
// Each type: BYTES per block, QK elements per block, TILE blocks per staged tile (TILE * BYTES a
// multiple of 16), UNITS of 16 elements per block, MIN (value = a * q + b, else a * q), and
// unit(): a block's unit u as q[16] (small integers as floats), the scale a, the offset b, and
// the element offsets o1, o2 (in the block) of q[0..7] and q[8..15].

struct QQ8_0 {
    static constexpr int BYTES = 34, QK = 32, TILE = QUANT_TILE_Q8_0, UNITS = 2;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unit(const u8* blk, int u, float* q, float& a, float& b, int& o1, int& o2) {
        unsigned w[4];
        sm_words16_a2(blk + 2 + 16 * u, w);
#pragma unroll
        for (int i = 0; i < 16; ++i) q[i] = (float)(signed char)byte_of(w, i);
        a = sm_half(blk);
        b = 0.0f;
        o1 = 16 * u;
        o2 = o1 + 8;
    }
};

struct QQ4_0 {
    static constexpr int BYTES = 18, QK = 32, TILE = QUANT_TILE_Q4_0, UNITS = 2;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unit(const u8* blk, int u, float* q, float& a, float& b, int& o1, int& o2) {
        unsigned w[2];  // byte j: element 8u + j (low nibble) and 16 + 8u + j (high nibble)
        sm_words8_a2(blk + 2 + 8 * u, w);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            q[i] = (float)((int)(byte_of(w, i) & 15u) - 8);
            q[8 + i] = (float)((int)(byte_of(w, i) >> 4) - 8);
        }
        a = sm_half(blk);
        b = 0.0f;
        o1 = 8 * u;
        o2 = 16 + 8 * u;
    }
};

struct QQ4_1 {
    static constexpr int BYTES = 20, QK = 32, TILE = QUANT_TILE_Q4_1, UNITS = 2;
    static constexpr bool MIN = true;
    static __device__ __forceinline__ void unit(const u8* blk, int u, float* q, float& a, float& b, int& o1, int& o2) {
        const unsigned* p = (const unsigned*)(blk + 4 + 8 * u);  // 4-aligned: 20-byte blocks
        const unsigned w[2] = {p[0], p[1]};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            q[i] = (float)(byte_of(w, i) & 15u);
            q[8 + i] = (float)(byte_of(w, i) >> 4);
        }
        a = sm_half(blk);
        b = sm_half(blk + 2);
        o1 = 8 * u;
        o2 = 16 + 8 * u;
    }
};

struct QQ4_K {
    static constexpr int BYTES = 144, QK = 256, TILE = QUANT_TILE_Q4_K, UNITS = 16;
    static constexpr bool MIN = true;
    // 8 sub-blocks of 32 with a 6-bit scale and min each, packed in the 12 bytes at sc: sub-blocks
    // 0-3 in the low 6 bits of bytes 0-3 (scale) and 4-7 (min), 4-7 in the nibbles of bytes 8-11
    // plus the top 2 bits of bytes 0-3 (scale) and 4-7 (min).
    // Without a branch: neighbouring lanes take different sub-blocks (the streaming build's lane t
    // has item t % 8), and a branch ran both halves for every lane.
    static __device__ __forceinline__ void scale_min(const u8* sc, int s, unsigned& scale, unsigned& mn) {
        const int j = s & 3;
        const unsigned b0 = sc[j], b4 = sc[j + 4], b8 = sc[j + 8];
        const bool hi = s >= 4;
        scale = hi ? (b8 & 15u) | ((b0 >> 6) << 4) : b0 & 63u;
        mn = hi ? (b8 >> 4) | ((b4 >> 6) << 4) : b4 & 63u;
    }
    static __device__ __forceinline__ void unit(const u8* blk, int u, float* q, float& a, float& b, int& o1, int& o2) {
        const int s = u >> 1, lh = u & 1;
        unsigned scale, mn;
        scale_min(blk + 4, s, scale, mn);
        // 4 groups of 32 bytes: group g's low nibbles are sub-block 2g, its high nibbles 2g + 1
        const V16 v = *(const V16*)(blk + 16 + 32 * (s >> 1) + 16 * lh);  // 16-aligned
        const int shift = 4 * (s & 1);
#pragma unroll
        for (int i = 0; i < 16; ++i) q[i] = (float)((byte_of(v.w, i) >> shift) & 15u);
        a = __fmul_rn(sm_half(blk), (float)scale);
        b = -__fmul_rn(sm_half(blk + 2), (float)mn);  // x - y == x + (-y) exactly
        o1 = 32 * s + 16 * lh;
        o2 = o1 + 8;
    }
};

struct QQ6_K {
    static constexpr int BYTES = 210, QK = 256, TILE = QUANT_TILE_Q6_K, UNITS = 16;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unit(const u8* blk, int u, float* q, float& a, float& b, int& o1, int& o2) {
        // Element e = 128 n + 32 k + l (l < 32): low 4 bits in ql[64 n + l + 32 (k & 1)] (low
        // nibble for k < 2, high for k >= 2), high 2 bits at qh[32 n + l] >> 2k, minus 32;
        // scale int8 scales[e / 16].
        const int n = u >> 3, k = (u >> 1) & 3, lh = u & 1;
        unsigned lo[4], hi[4];
        sm_words16_a2(blk + 64 * n + 16 * lh + 32 * (k & 1), lo);
        sm_words16_a2(blk + 128 + 32 * n + 16 * lh, hi);
        const int ls = 4 * (k >> 1), hs = 2 * k;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const unsigned v = ((byte_of(lo, i) >> ls) & 15u) | (((byte_of(hi, i) >> hs) & 3u) << 4);
            q[i] = (float)((int)v - 32);
        }
        a = __fmul_rn(sm_half(blk + 208), (float)(signed char)blk[192 + 8 * n + lh + 2 * k]);
        b = 0.0f;
        o1 = 128 * n + 32 * k + 16 * lh;
        o2 = o1 + 8;
    }
};

template <class Q> struct TileOf {
    static constexpr int BYTES = Q::TILE * Q::BYTES;
    static constexpr int VPL = (BYTES / 16 + 31) / 32;  // 16-byte vectors per lane
    static_assert(BYTES % 16 == 0, "a tile must be a whole number of 16-byte vectors");
};

// The exact value of one element (see the header: the same roundings as numpy).
template <bool MIN> __device__ __forceinline__ float qvalue(float q, float a, float b) {
    return MIN ? __fadd_rn(__fmul_rn(a, q), b) : __fmul_rn(a, q);
}

// ---- staging -----------------------------------------------------------------------------------

// Up to 16 bytes one by one (the tail of a row, or rows that are not 16-byte aligned).
__device__ __forceinline__ V16 ld16_bytes(const char* p, int n) {
    V16 v;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        unsigned w = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (4 * i + j < n) w |= (unsigned)(u8)p[4 * i + j] << (8 * j);
        v.w[i] = w;
    }
    return v;
}

// This lane's vectors of the nbytes (<= tile bytes) at src; vectors past nbytes are zero.
template <int VPL>
__device__ __forceinline__ void tile_fetch(V16 (&buf)[VPL], const char* src, int nbytes, bool aligned, int lane) {
#pragma unroll
    for (int j = 0; j < VPL; ++j) {
        const int off = 16 * (lane + 32 * j);
        if (aligned && off + 16 <= nbytes) {
            buf[j] = ld16_cs(src + off);
        } else if (off < nbytes) {
            buf[j] = ld16_bytes(src + off, nbytes - off);
        } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) buf[j].w[i] = 0u;
        }
    }
}

template <int BYTES, int VPL>
__device__ __forceinline__ void tile_store(u8* sm, const V16 (&buf)[VPL], int lane) {
#pragma unroll
    for (int j = 0; j < VPL; ++j) {
        const int off = 16 * (lane + 32 * j);
        if (off < BYTES) *(V16*)(sm + off) = buf[j];
    }
}

__device__ __forceinline__ bool aligned16(const void* p, i64 stride) {
    return (((unsigned long long)p | (unsigned long long)stride) & 15ull) == 0;
}

// ---- row dequantization (and get_rows) -----------------------------------------------------------
// One warp per (row, tile): warp w of the grid takes row w / ntiles, tile w % ntiles.
// Row r of dst gets source row r (IDS false) or ids[r] (IDS true: an index outside
// [0, n_src_rows) writes zeros and reports `code` through err).
template <class Q, class T, bool IDS>
__device__ __forceinline__ void dequant_rows_impl(const char* src, i64 src_nb1, char* dst, i64 dst_nb1, i64 n_rows,
                                                  i64 ne0, const int* ids, i64 n_src_rows, int* err, int code) {
    typedef TileOf<Q> TL;
    __shared__ __align__(16) u8 sm_all[QUANT_WARPS][TL::BYTES];
    u8* sm = sm_all[threadIdx.y];
    const int lane = threadIdx.x;
    const i64 nblk = ne0 / Q::QK, ntiles = (nblk + Q::TILE - 1) / Q::TILE;
    const i64 wid = (i64)blockIdx.x * QUANT_WARPS + threadIdx.y;
    if (ntiles == 0 || wid >= n_rows * ntiles) return;  // whole warps: nothing below syncs the block
    const i64 r = wid / ntiles, t = wid - r * ntiles;
    i64 sr = r;
    bool ok = true;
    if (IDS) {
        const i64 k = ids[r];
        ok = k >= 0 && k < n_src_rows;
        if (!ok && lane == 0 && t == 0) report_error(err, code);
        sr = ok ? k : 0;
    }
    const int nb = (int)min((i64)Q::TILE, nblk - t * Q::TILE);
    V16 buf[TL::VPL];
    tile_fetch<TL::VPL>(buf, src + sr * src_nb1 + t * TL::BYTES, ok ? nb * Q::BYTES : 0, aligned16(src, src_nb1), lane);
    tile_store<TL::BYTES, TL::VPL>(sm, buf, lane);
    __syncwarp();
    char* drow = dst + r * dst_nb1 + t * (i64)(Q::TILE * Q::QK) * (i64)sizeof(T);
    const bool vec = aligned16(dst, dst_nb1);
    for (int u = lane; u < nb * Q::UNITS; u += 32) {
        const int blk = u / Q::UNITS;
        float q[16], a, b;
        int o1, o2;
        Q::unit(sm + blk * Q::BYTES, u % Q::UNITS, q, a, b, o1, o2);
        float v[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = ok ? qvalue<Q::MIN>(q[i], a, b) : 0.0f;
        char* p1 = drow + (i64)(blk * Q::QK + o1) * (i64)sizeof(T);
        char* p2 = drow + (i64)(blk * Q::QK + o2) * (i64)sizeof(T);
        if (vec) {
            st8<T>(p1, v);
            st8<T>(p2, v + 8);
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                st<T>(p1 + i * (i64)sizeof(T), v[i]);
                st<T>(p2 + i * (i64)sizeof(T), v[8 + i]);
            }
        }
    }
}

// ---- mat-vec: y[c * y_stride + r] = sum_k W[r, k] * x[c * x_stride + k], c < ncols <= QUANT_MV_NMAX --
// A decode mat-vec reads each weight byte once and must keep ~40-64 KB of it in flight per SM to
// run at HBM speed, while the work per weight is small enough to hide behind the loads. Design
// (docs/quantization.md, "CUDA mat-vec", has the numbers):
//
// * A block of QUANT_MV_THREADS threads takes R rows (QUANT_MV_ROWS_<type> for the sibling
//   products, QUANT_MV1_ROWS_<type> for mul_mat_vec1, one column,
//   QUANT_MV_ROWS_N for up to QUANT_MV_NMAX), or `slots` groups of R rows when rows are short
//   (a row of K elements keeps tpr = min(threads, K / 8) threads busy, slots = min(QUANT_MV_SLOTS,
//   threads / tpr) rows side by side: K = 576 keeps 216 of 256 threads busy). The host derives
//   the grid from the same formula (families/blocks.py matvec_rows).
// * K goes in chunks of QUANT_MV_ITEM * threads elements per row. Each chunk of all the block's
//   rows is copied global -> shared with 16-byte cp.async (no registers held, so the copies in
//   flight cost no occupancy), QUANT_MV_STAGES chunks ahead: a K = 4096 row is requested whole
//   before any of it is decoded. Rows need not start 16-byte aligned (K = 576: 324-byte Q4_0
//   rows): a row's copy starts at the 16-byte boundary below it and the decoder adds the offset.
// * Each thread owns one "item" per chunk row: 8 elements, two runs of 4 whose F32 activations it
//   loads as two float4 (a warp's loads cover whole lines) and reuses for all R rows, with their
//   sums (prep). For every row it decodes the same item from shared memory (Dq: 8 weights as
//   small exact floats plus the block's scales) and folds it in with 8 FMAs (apply).
// * No int -> float conversions: I2F issues at a quarter of the FMA rate, more than the whole
//   instruction budget per weight at HBM speed. A 4-bit q becomes the float 16 + q by one byte
//   permute of (0x80 | q << 3) under the exponent byte of 16.0 (6-bit: 64 + q), and the constant
//   comes back out through the activation sums: sum x (q - 8) = sum x (16 + q) - 24 sum x. Q8_0
//   is exact the same way (2^23 + (q + 128), minus 2^23 + 128 by one FADD).
// * K-quant scales (6-bit packed, int8) are decoded once per sub-block per row into a shared
//   table after a chunk lands, not by every thread that reads them.
// * Partial sums: one per thread and row, summed in a fixed order through shared memory (the
//   stage buffers, free by then): deterministic, no atomics.

#ifndef QUANT_MV_THREADS
#error "QUANT_MV_* come from the host as -D (families/blocks.py)"
#endif
static_assert(QUANT_MV_ITEM == 8, "an item is two runs of 4 elements (decoders below)");
static_assert(QUANT_MV_THREADS % 32 == 0 && QUANT_MV_STAGES >= 2, "mat-vec geometry");
#define MV_CHUNK (QUANT_MV_ITEM * QUANT_MV_THREADS)  // elements of a row per stage at full width

// Staged bytes at the alignment the rows give. AL 2: every row starts 4-byte aligned (then an
// offset the layout keeps 4-aligned, A4, is one word), 1: 2-aligned (F16 fields always are), 0: any.
template <int AL> __device__ __forceinline__ unsigned st_u16(const u8* p) {
    if (AL >= 1) return *(const unsigned short*)p;
    return (unsigned)p[0] | ((unsigned)p[1] << 8);
}
template <int AL, bool A4> __device__ __forceinline__ unsigned st_u32(const u8* p) {
    if (AL == 2 && A4) return *(const unsigned*)p;
    return __byte_perm(st_u16<AL>(p), st_u16<AL>(p + 2), 0x5410);
}

// Byte t of v (which holds 0x80 | m in each byte) under the exponent byte `e` of a power of two:
// the float e * (1 + m / 128) exactly, one PRMT. e = 0x41 (16.0): m = q << 3 gives 16 + q;
// e = 0x42 (64.0): m = q << 1 gives 64 + q.
template <unsigned E> __device__ __forceinline__ float mant_f(unsigned v, int t) {
    return __int_as_float(__byte_perm(v, E << 24, 0x7044 | (t << 8)));
}
// The 8 nibbles of w in element order (low nibbles of bytes 0-3, then high nibbles) as 16 + q.
__device__ __forceinline__ void nibbles16(unsigned w, float* f) {
    const unsigned lo = ((w << 3) & 0x78787878u) | 0x80808080u, hi = ((w >> 1) & 0x78787878u) | 0x80808080u;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        f[t] = mant_f<0x41>(lo, t);
        f[4 + t] = mant_f<0x41>(hi, t);
    }
}
// Signed byte t of w as a float, exactly: 2^23 + (q + 128) by PRMT, then one FADD.
__device__ __forceinline__ float s8_f(unsigned w_xor80, int t) {
    return __int_as_float(__byte_perm(w_xor80, 0x4B000000u, 0x7440 | t)) - 8388736.0f;
}
__device__ __forceinline__ float sum4(const float* x) { return (x[0] + x[1]) + (x[2] + x[3]); }

// One item of one row, decoded: 8 weights as exact small floats (offset per type) and scales.
struct Dq {
    float f[8];
    float a1, b1, a2, b2;
};

// Per type: TAB (floats of scale table per block, 0: none), SUB (table entries per block), ROWS
// (R for one column), BLOCKS (blocks per SM the one-column build is register-capped for: the
// largest that compiles without spills for sm_90; the registers, not shared memory, bound them),
// offs(i): the item's two runs of 4 elements (offsets in the chunk), prep(x, p): the sums of x
// the offsets need, decode<AL>(row, i, table of the row, q), apply(acc, q, x, p) -> acc.
template <class Q> struct MV;

// QX builds (`*_qx`: Q4_0, Q4_1 weights): the activations an item multiplies, quantized to
// int8 in the block as ggml's q8 activations are (per 32 elements: d = amax / 127, q = round(x / d)),
// so a weight word meets them in __dp4a: four products and their sum in one instruction, where the
// float path decodes every weight to a float first (~8 instructions per item and row instead of
// ~27; measured 5-9% faster on the H100, so the instructions were not what bound the kernel:
// docs/quantization.md). The integer sums are exact; the activations' rounding (relative ~1/254
// per element) is the error ggml's mmvq has.
struct XQ {
    int q0, q1;     // the item's 8 activations as int8: elements o1..o1+3, o2..o2+3
    float d;        // their block's scale
    float s;        // d * (sum of the 8 q): Q4_0's offset of 8
    float sum;      // the exact sum of the 8 floats: Q4_1's minimum
};

template <> struct MV<QQ8_0> {  // item i: elements 8m..8m+7 (m = i & 3) of block i >> 2, q exact
    static constexpr int TAB = 0, SUB = 1, ROWS = QUANT_MV_ROWS_Q8_0, ROWS1 = QUANT_MV1_ROWS_Q8_0, BLOCKS = 5;
    static __device__ __forceinline__ void offs(int i, int& o1, int& o2) {
        o1 = 32 * (i >> 2) + 8 * (i & 3);
        o2 = o1 + 4;
    }
    static __device__ __forceinline__ void prep(const float*, float*) {}
    template <int AL> static __device__ __forceinline__ void decode(const u8* rp, int i, const float*, Dq& q) {
        const u8* blk = rp + 34 * (i >> 2);
        const u8* qs = blk + 2 + 8 * (i & 3);
        const unsigned w0 = st_u32<AL, false>(qs) ^ 0x80808080u, w1 = st_u32<AL, false>(qs + 4) ^ 0x80808080u;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            q.f[t] = s8_f(w0, t);
            q.f[4 + t] = s8_f(w1, t);
        }
        q.a1 = h2f((u16)st_u16<AL>(blk));
    }
    static __device__ __forceinline__ float apply(float acc, const Dq& q, const float* x, const float*) {
        float s = 0.0f;
#pragma unroll
        for (int t = 0; t < 8; ++t) s = fmaf(x[t], q.f[t], s);
        return fmaf(q.a1, s, acc);
    }
};

template <> struct MV<QQ4_0> {  // item i: bytes 4m..4m+3 (m = i & 3) of block i >> 2: elements 4m.., 16+4m..
    static constexpr int TAB = 0, SUB = 1, ROWS = QUANT_MV_ROWS_Q4_0, ROWS1 = QUANT_MV1_ROWS_Q4_0, BLOCKS = 4;
    static __device__ __forceinline__ void offs(int i, int& o1, int& o2) {
        o1 = 32 * (i >> 2) + 4 * (i & 3);
        o2 = o1 + 16;
    }
    static __device__ __forceinline__ void prep(const float* x, float* p) { p[0] = -24.0f * (sum4(x) + sum4(x + 4)); }
    template <int AL> static __device__ __forceinline__ void decode(const u8* rp, int i, const float*, Dq& q) {
        const u8* blk = rp + 18 * (i >> 2);
        nibbles16(st_u32<AL, false>(blk + 2 + 4 * (i & 3)), q.f);
        q.a1 = h2f((u16)st_u16<AL>(blk));
    }
    static __device__ __forceinline__ float apply(float acc, const Dq& q, const float* x, const float* p) {
        float s = p[0];  // sum x (q - 8) = sum x (16 + q) - 24 sum x
#pragma unroll
        for (int t = 0; t < 8; ++t) s = fmaf(x[t], q.f[t], s);
        return fmaf(q.a1, s, acc);
    }
    template <int AL> static __device__ __forceinline__ float dot_q(const u8* rp, int i, const XQ& x, float acc) {
        const u8* blk = rp + 18 * (i >> 2);
        const unsigned w = st_u32<AL, false>(blk + 2 + 4 * (i & 3));  // low nibbles: o1.., high: o2..
        const int si = __dp4a((int)((w >> 4) & 0x0f0f0f0fu), x.q1, __dp4a((int)(w & 0x0f0f0f0fu), x.q0, 0));
        return fmaf(h2f((u16)st_u16<AL>(blk)), fmaf(x.d, (float)si, -8.0f * x.s), acc);  // sum (q - 8) x
    }
};

template <> struct MV<QQ4_1> {  // as Q4_0 in 20-byte blocks: x = d q + m
    static constexpr int TAB = 0, SUB = 1, ROWS = QUANT_MV_ROWS_Q4_1, ROWS1 = QUANT_MV1_ROWS_Q4_1, BLOCKS = 4;
    static __device__ __forceinline__ void offs(int i, int& o1, int& o2) {
        o1 = 32 * (i >> 2) + 4 * (i & 3);
        o2 = o1 + 16;
    }
    static __device__ __forceinline__ void prep(const float* x, float* p) {
        p[1] = sum4(x) + sum4(x + 4);
        p[0] = -16.0f * p[1];
    }
    template <int AL> static __device__ __forceinline__ void decode(const u8* rp, int i, const float*, Dq& q) {
        const u8* blk = rp + 20 * (i >> 2);
        nibbles16(st_u32<AL, true>(blk + 4 + 4 * (i & 3)), q.f);
        const unsigned dm = st_u32<AL, true>(blk);
        q.a1 = h2f((u16)(dm & 0xffffu));
        q.b1 = h2f((u16)(dm >> 16));
    }
    static __device__ __forceinline__ float apply(float acc, const Dq& q, const float* x, const float* p) {
        float s = p[0];  // sum x q = sum x (16 + q) - 16 sum x
#pragma unroll
        for (int t = 0; t < 8; ++t) s = fmaf(x[t], q.f[t], s);
        return fmaf(q.b1, p[1], fmaf(q.a1, s, acc));
    }
    template <int AL> static __device__ __forceinline__ float dot_q(const u8* rp, int i, const XQ& x, float acc) {
        const u8* blk = rp + 20 * (i >> 2);
        const unsigned w = st_u32<AL, true>(blk + 4 + 4 * (i & 3)), dm = st_u32<AL, true>(blk);
        const int si = __dp4a((int)((w >> 4) & 0x0f0f0f0fu), x.q1, __dp4a((int)(w & 0x0f0f0f0fu), x.q0, 0));
        return fmaf(h2f((u16)(dm >> 16)), x.sum, fmaf(h2f((u16)(dm & 0xffffu)) * x.d, (float)si, acc));  // d q + m
    }
};

template <> struct MV<QQ4_K> {
    // item i of block i >> 5: qs bytes 32g + 4m.. (j = i & 31, g = j >> 3, m = j & 7), whose low
    // nibbles are elements 64g + 4m.. (sub-block 2g) and high nibbles 64g + 32 + 4m.. (2g + 1).
    // Table per block: (a, b) = (d * sc, -(dmin * m) - 16 a) of sub-blocks 0..7 (an item's four
    // are one V16), so the row sum is a * sum x (16 + q) + b * sum x.
    static constexpr int TAB = 16, SUB = 8, ROWS = QUANT_MV_ROWS_Q4_K, ROWS1 = QUANT_MV1_ROWS_Q4_K, BLOCKS = 4;
    static __device__ __forceinline__ void offs(int i, int& o1, int& o2) {
        const int j = i & 31;
        o1 = 256 * (i >> 5) + 64 * (j >> 3) + 4 * (j & 7);
        o2 = o1 + 32;
    }
    static __device__ __forceinline__ void prep(const float* x, float* p) {
        p[0] = sum4(x);
        p[1] = sum4(x + 4);
    }
    template <int AL> static __device__ __forceinline__ void entry(const u8* blk, int s, float* tb) {
        unsigned scale, mn;
        QQ4_K::scale_min(blk + 4, s, scale, mn);
        // sum x ((d sc) q - dmin m) = a sum x (16 + q) + (-(dmin m) - 16 a) sum x
        const float a = __fmul_rn(h2f((u16)st_u16<AL>(blk)), (float)scale);
        tb[2 * s] = a;
        tb[2 * s + 1] = -__fmul_rn(h2f((u16)st_u16<AL>(blk + 2)), (float)mn) - 16.0f * a;
    }
    template <int AL> static __device__ __forceinline__ void decode(const u8* rp, int i, const float* tab, Dq& q) {
        const int j = i & 31;
        nibbles16(st_u32<AL, true>(rp + 144 * (i >> 5) + 16 + 32 * (j >> 3) + 4 * (j & 7)), q.f);
        const V16 t = *(const V16*)(tab + 16 * (i >> 5) + 4 * (j >> 3));
        q.a1 = __uint_as_float(t.w[0]);
        q.b1 = __uint_as_float(t.w[1]);
        q.a2 = __uint_as_float(t.w[2]);
        q.b2 = __uint_as_float(t.w[3]);
    }
    static __device__ __forceinline__ float apply(float acc, const Dq& q, const float* x, const float* p) {
        float s1 = x[0] * q.f[0], s2 = x[4] * q.f[4];
#pragma unroll
        for (int t = 1; t < 4; ++t) {
            s1 = fmaf(x[t], q.f[t], s1);
            s2 = fmaf(x[4 + t], q.f[4 + t], s2);
        }
        acc = fmaf(q.a1, s1, acc);
        acc = fmaf(q.b1, p[0], acc);
        acc = fmaf(q.a2, s2, acc);
        return fmaf(q.b2, p[1], acc);
    }
};

template <> struct MV<QQ6_K> {
    // item i of block i >> 5 (j = i & 31, n = j >> 4, c = (j >> 3) & 1, l = 4 (j & 7)): ql bytes
    // 64n + 32c + l.. (low nibbles: elements 128n + 32c + l.., k = c; high: + 64, k = c + 2) and
    // qh bytes 32n + l.. (bits 2k). Table per block: d * scales[0..15].
    static constexpr int TAB = 16, SUB = 16, ROWS = QUANT_MV_ROWS_Q6_K, ROWS1 = QUANT_MV1_ROWS_Q6_K, BLOCKS = 3;
    static __device__ __forceinline__ void offs(int i, int& o1, int& o2) {
        const int j = i & 31;
        o1 = 256 * (i >> 5) + 128 * (j >> 4) + 32 * ((j >> 3) & 1) + 4 * (j & 7);
        o2 = o1 + 64;
    }
    static __device__ __forceinline__ void prep(const float* x, float* p) {
        p[0] = -96.0f * sum4(x);  // sum x (v - 32) = sum x (64 + v) - 96 sum x
        p[1] = -96.0f * sum4(x + 4);
    }
    template <int AL> static __device__ __forceinline__ void entry(const u8* blk, int s, float* tb) {
        tb[s] = __fmul_rn(h2f((u16)st_u16<AL>(blk + 208)), (float)(signed char)blk[192 + s]);
    }
    template <int AL> static __device__ __forceinline__ void decode(const u8* rp, int i, const float* tab, Dq& q) {
        const int j = i & 31, n = j >> 4, c = (j >> 3) & 1, m = j & 7;
        const u8* blk = rp + 210 * (i >> 5);
        const unsigned L = st_u32<AL, false>(blk + 64 * n + 32 * c + 4 * m);
        const unsigned H = st_u32<AL, false>(blk + 128 + 32 * n + 4 * m) >> (2 * c);
        // byte = 0x80 | v << 1 with v = low 4 bits | high 2 bits << 4
        const unsigned lo = ((L << 1) & 0x1E1E1E1Eu) | ((H << 5) & 0x60606060u) | 0x80808080u;
        const unsigned hi = ((L >> 3) & 0x1E1E1E1Eu) | ((H << 1) & 0x60606060u) | 0x80808080u;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            q.f[t] = mant_f<0x42>(lo, t);
            q.f[4 + t] = mant_f<0x42>(hi, t);
        }
        const float* ts = tab + 16 * (i >> 5) + 8 * n + 2 * c + (m >> 2);
        q.a1 = ts[0];
        q.a2 = ts[4];
    }
    static __device__ __forceinline__ float apply(float acc, const Dq& q, const float* x, const float* p) {
        float s1 = p[0], s2 = p[1];
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            s1 = fmaf(x[t], q.f[t], s1);
            s2 = fmaf(x[4 + t], q.f[4 + t], s2);
        }
        return fmaf(q.a2, s2, fmaf(q.a1, s1, acc));
    }
};

template <class Q> struct MvGeom {
    static constexpr int CHUNK_BYTES = MV_CHUNK / Q::QK * Q::BYTES;  // a full chunk of one row
    static_assert(MV_CHUNK % 256 == 0 && CHUNK_BYTES % 16 == 0, "chunks of whole blocks, whole vectors");
    // A stage: rb = slots * R rows of (chunk bytes + up to 31) each; slots * chunk <= MV_CHUNK.
    static constexpr int stage_bytes(int R) { return R * (CHUNK_BYTES + 32 * QUANT_MV_SLOTS); }
};

// v / d for v < 2^20 and d < 2^12, given r = 1.0f / d: the float quotient is within 2^-9 / d of
// the exact one, which is at least 0.5 / d from an integer (a 32-bit division is ~20 instructions).
__device__ __forceinline__ int fdiv(int v, float r) { return (int)(((float)v + 0.5f) * r); }

// The 8 activations of an item (two runs of 4 at xc + o1, xc + o2).
__device__ __forceinline__ void mv_load_x(const float* xc, int o1, int o2, bool vec, float* xv) {
    if (vec) {
        const V16 a = *(const V16*)(xc + o1), b = *(const V16*)(xc + o2);
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            xv[t] = __uint_as_float(a.w[t]);
            xv[4 + t] = __uint_as_float(b.w[t]);
        }
    } else {
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            xv[t] = xc[o1 + t];
            xv[4 + t] = xc[o2 + t];
        }
    }
}

// The item's activations as XQ. Every thread of the block calls it (the 4 items of a 32-element
// block sit on 4 adjacent lanes and share its amax through two shuffles); dead items pass zeros.
__device__ __forceinline__ XQ mv_quantize_x(const float* xv) {
    float amax = 0.0f, sum = 0.0f;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        amax = fmaxf(amax, fabsf(xv[t]));
        sum += xv[t];
    }
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    XQ x;
    x.d = amax / 127.0f;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int q[8], qs = 0;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        q[t] = __float2int_rn(xv[t] * id);
        qs += q[t];
    }
    x.q0 = (int)__byte_perm(__byte_perm(q[0], q[1], 0x0040), __byte_perm(q[2], q[3], 0x0040), 0x5410);
    x.q1 = (int)__byte_perm(__byte_perm(q[4], q[5], 0x0040), __byte_perm(q[6], q[7], 0x0040), 0x5410);
    x.s = x.d * (float)qs;
    x.sum = sum;
    return x;
}

// What the sibling mat-vec (mul_mat_sibq_*, below) adds to the plain one, for one column:
// NORM: x is the raw row, y = rms_norm(x) * nw times the weights: every block reads the whole row
// anyway, so it sums x^2 on the way (slot 0's threads cover each element once) and scales its
// sums by 1 / sqrt(mean(x^2) + eps) as it writes (as kernels/norm.cu). ACT (SwiGLU): the block's
// rows are `no` rows of the gate (w) and the same `no` rows of up (w2), the output act(g) * u.
enum { MV_ACT_NONE = 0, MV_ACT_SILU = 1, MV_ACT_GELU = 2 };
struct MvExtra {
    const float* nw;
    float eps;
    const char* w2;  // ACT: up's weights, rows as far apart as the gate's
};

template <int ACT> __device__ __forceinline__ float mv_act(float v) {
    if (ACT == MV_ACT_SILU) return v / (1.0f + expf(-v));  // as unary.cu
    const float k = 0.7978845608028654f;                   // sqrt(2 / pi)
    return 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
}

// `res` (F32, y's shape, columns res_stride apart, or null) is added to every sum as it is
// written: the planner's mul_mat + add of a residual connection, one launch and one pass less.
// SIB: `blk` is the block's index among the product's blocks (a sibling launch runs several
// products), else blockIdx.x.
// EPI (sibling builds only): the rows go through the epilogue (epilogue.cuh) instead of into y: the
// block takes the rows epi_rows gives it, so that every rope pair is two of its rows.
template <class Q, int R, int NMAX, int AL, bool SIB, bool NORM, int ACT, bool QX = false, bool EPI = false>
__device__ __forceinline__ void mv_run(const char* w, i64 w_nb1, const float* x, i64 x_stride, float* y,
                                       i64 y_stride, const float* res, i64 res_stride, i64 n_rows, int K, int ncols,
                                       u8* smem, float* tab, float* fin, i64 blk, const MvExtra& e,
                                       const SibEpi* epi = nullptr, int member = 0, int pdl = 0) {
    typedef MV<Q> T;
    constexpr int NT = QUANT_MV_THREADS, S = QUANT_MV_STAGES, STAGE = MvGeom<Q>::stage_bytes(R);
    static_assert(ACT == MV_ACT_NONE || (R % 2 == 0 && NMAX == 1), "SwiGLU: gate and up rows in pairs, one column");
    static_assert(!NORM || NMAX == 1, "the norm prologue takes one column");
    static_assert(!QX || NMAX == 1, "quantized activations: one column");
    static_assert(!EPI || (SIB && ACT == MV_ACT_NONE), "the epilogue follows plain sibling products");
    constexpr bool SPLIT = ACT != MV_ACT_NONE || EPI;  // block rows in two runs (rowp below)
    const int tid = threadIdx.x;
    const int tpr = max(1, min(NT, K / QUANT_MV_ITEM)), slots = min(QUANT_MV_SLOTS, NT / tpr);
    const int rb = slots * R, ob = ACT ? rb / 2 : rb;  // weight rows, output rows per block
    const i64 b0 = (SIB ? blk : (i64)blockIdx.x) * ob;
    if (b0 >= n_rows) return;  // the whole block
    const int no = (int)min((i64)ob, n_rows - b0), nr = ACT ? 2 * no : no;
    // Block row j is row r0 + j, `up` bytes further for j >= split: SwiGLU's up rows (split = no),
    // or EPI's second run of rope partners (epi_rows).
    i64 r0 = b0, jump = 0;
    int split = no;
    if constexpr (EPI) epi_rows(*epi, member, b0, ob, r0, split, jump);
    if (K <= 0) {  // empty rows: every sum is 0 (the sibling kernels never get K = 0)
        gg_grid_sync();
        const int N0 = NMAX == 1 ? 1 : ncols;
        for (int e = tid; e < nr * N0; e += NT)
            y[(e / nr) * y_stride + r0 + e % nr] = res ? res[(e / nr) * res_stride + r0 + e % nr] : 0.0f;
        return;
    }
    const int slot = tid / tpr, item = tid - slot * tpr;
    const int chunk = min(K, MV_CHUNK), nchunks = (K + chunk - 1) / chunk;
    const int cbytes = chunk / Q::QK * Q::BYTES, nv = (cbytes + 15) / 16 + 1, rstride = 16 * nv;
    const int nbc = chunk / 256;  // K-quant blocks of a full chunk (the table's row pitch / 16)
    const float rnv = 1.0f / (float)nv;
    const char* wb = w + r0 * w_nb1;
    // ACT: up's row i (the block's row no + i) lies `up` bytes past where gate's row no + i would
    // (the host gives both the same row stride): one extra register, not a second row walk
    const i64 up = ACT ? (i64)(e.w2 - w) - (i64)no * w_nb1 : jump * w_nb1;
    // a row's offset from the 16-byte boundary below it (chunks are whole vectors: every chunk's too)
    const unsigned wlo = (unsigned)(unsigned long long)wb, nblo = (unsigned)w_nb1;
    auto rowp = [&](int j) -> const char* { return wb + (i64)j * w_nb1 + (j < split ? 0 : up); };
    auto rowoff = [&](int j) -> unsigned {
        if constexpr (SPLIT) return (wlo + (unsigned)j * nblo + (j < split ? 0u : (unsigned)up)) & 15u;
        else return (wlo + (unsigned)j * nblo) & 15u;
    };
    const bool xvec =
        (((unsigned long long)x | (unsigned long long)(x_stride * 4) | (NORM ? (unsigned long long)e.nw : 0ull)) & 15) == 0;
    float ss = 0.0f;  // NORM: this thread's sum of x^2
    const int N = NMAX == 1 ? 1 : ncols;
    int o1, o2;
    T::offs(item, o1, o2);

    // Chunk c of every row of the block into stage c % S: each row from the 16-byte boundary at
    // or below its start, the last vector cut to the row's end (cp.async reads only those bytes).
    auto issue = [&](int c) {
        u8* sb = smem + (c % S) * STAGE;
        const int bytes = min(chunk, K - c * chunk) / Q::QK * Q::BYTES;
#pragma unroll 1
        for (int v = tid; v < nr * nv; v += NT) {
            const int j = fdiv(v, rnv), k = v - j * nv;
            const char* p;  // (the plain mat-vec's code exactly: its registers are tuned)
            if constexpr (SPLIT) p = rowp(j) + (i64)c * cbytes;
            else p = wb + (i64)j * w_nb1 + (i64)c * cbytes;
            const int off = (int)((unsigned long long)p & 15u);
            const int have = off + bytes - 16 * k;
            if (have > 0) cp_async16(sb + j * rstride + 16 * k, p - off + 16 * k, min(have, 16));
        }
    };

    float acc[R][NMAX];
#pragma unroll
    for (int m = 0; m < R; ++m)
#pragma unroll
        for (int n = 0; n < NMAX; ++n) acc[m][n] = 0.0f;

    // The first S - 1 chunks of weights: with QUANT_MVS_EARLY in `pdl` (the host found no step of
    // the plan writing them) before waiting for the kernel before, so a block made resident while
    // its predecessor runs (PDL) has them on the way, as the streaming build does (mvs_impl).
    const bool early = pdl & QUANT_MVS_EARLY;
    auto prologue = [&]() {
#pragma unroll
        for (int c = 0; c < S - 1; ++c) {
            if (c < nchunks) issue(c);
            cp_async_commit();
        }
    };
    if (early) prologue();
    gg_grid_sync();  // nothing but those weights is read before this
    if (!early) prologue();
    for (int c = 0; c < nchunks; ++c) {
        if (c + S - 1 < nchunks) issue(c + S - 1);  // into the stage chunk c - 1 used (freed below)
        cp_async_commit();
        const int elems = min(chunk, K - c * chunk);
        const bool live = slot < slots && QUANT_MV_ITEM * item < elems;
        const float* xc = x + (i64)c * chunk;
        float xv[8], p[4];
        if (NMAX == 1 && live) {  // one column: the activations once, for all R rows
            mv_load_x(xc, o1, o2, xvec, xv);
            if constexpr (NORM) {
                float nv[8];
                mv_load_x(e.nw + (i64)c * chunk, o1, o2, xvec, nv);
#pragma unroll
                for (int t = 0; t < 8; ++t) {
                    ss = fmaf(xv[t], xv[t], ss);
                    xv[t] *= nv[t];
                }
            }
            if constexpr (!QX) T::prep(xv, p);
        } else if constexpr (QX) {
#pragma unroll
            for (int t = 0; t < 8; ++t) xv[t] = 0.0f;
        }
        XQ xq;
        if constexpr (QX) xq = mv_quantize_x(xv);  // every thread: the shuffles need all lanes
        cp_async_wait<S - 1>();  // chunk c has landed (this thread's copies) ...
        __syncthreads();         // ... and everyone's
        const u8* sb = smem + (c % S) * STAGE;
        if (T::TAB) {
            const int nbk = elems / Q::QK, total = nr * nbk * T::SUB;
            const float rn = 1.0f / (float)nbk;
#pragma unroll 1
            for (int e = tid; e < total; e += NT) {
                const int s = e % T::SUB, rbk = e / T::SUB, j = fdiv(rbk, rn), b = rbk - j * nbk;
                const u8* rp = sb + j * rstride + rowoff(j);
                if constexpr (T::TAB > 0) T::template entry<AL>(rp + b * Q::BYTES, s, tab + 16 * (j * nbc + b));
            }
            __syncthreads();
        }
        if (live) {
#pragma unroll
            for (int m = 0; m < R; ++m) {
                const int j = slot * R + m;
                if (QX && j < nr) {
                    if constexpr (QX) acc[m][0] = T::template dot_q<AL>(sb + j * rstride + rowoff(j), item, xq, acc[m][0]);
                } else if (j < nr) {
                    const u8* rp = sb + j * rstride + rowoff(j);
                    Dq q;
                    T::template decode<AL>(rp, item, tab + 16 * j * nbc, q);
                    if (NMAX == 1) {
                        acc[m][0] = T::apply(acc[m][0], q, xv, p);
                    } else {
#pragma unroll
                        for (int n = 0; n < NMAX; ++n) {
                            if (n < N) {
                                float xn[8], pn[4];
                                mv_load_x(xc + n * x_stride, o1, o2, xvec, xn);
                                T::prep(xn, pn);
                                acc[m][n] = T::apply(acc[m][n], q, xn, pn);
                            }
                        }
                    }
                }
            }
        }
        __syncthreads();  // stage c % S is free for chunk c + S
    }

    // EPI: the inputs of row tid's epilogue (position, frequencies, cache row) requested here, past
    // the wait for the kernel before, so they land while the row sums run instead of being a round
    // trip after them (as siblings.cu sib_impl): one row a thread.
    static_assert(!EPI || QUANT_MV_SLOTS * R <= NT, "the epilogue's inputs: one row a thread");
    SibPre pre;
    if constexpr (EPI)
        if (tid < nr) sib_epi_load(*epi, member, r0 + tid + (tid < split ? 0 : jump), pre);

    // Row sums: thread (slot, item) left row slot * R + m's part in red[m][tid].
    // NORM: slot 0's parts of sum(x^2) in red[R * NT + t], t < tpr.
    float* red = (float*)smem;  // (R + 1) * NT floats <= the stages, idle now (only empty copy groups remain)
    const int warp = tid >> 5, lane = tid & 31;
#pragma unroll
    for (int n = 0; n < NMAX; ++n) {
        if (n < N) {
#pragma unroll
            for (int m = 0; m < R; ++m) red[m * NT + tid] = acc[m][n];
            if constexpr (NORM) red[R * NT + tid] = ss;
            __syncthreads();
            float scale = 1.0f;
            if constexpr (NORM) {  // every warp sums the same parts in the same order
                float sq = 0.0f;
#pragma unroll 1
                for (int t = lane; t < tpr; t += 32) sq += red[R * NT + t];
                scale = 1.0f / sqrtf(warp_sum(sq) / (float)K + e.eps);  // as kernels/norm.cu
            }
            for (int j = warp; j < nr; j += NT / 32) {
                const float* pr = red + (j % R) * NT + (j / R) * tpr;
                float v = 0.0f;
#pragma unroll 1
                for (int t = lane; t < tpr; t += 32) v += pr[t];
                v = warp_sum(v);
                if constexpr (NORM) v *= scale;
                if constexpr (SPLIT) {
                    if (lane == 0) fin[j] = v;
                } else if (lane == 0) {
                    y[n * y_stride + r0 + j] = res ? v + res[n * res_stride + r0 + j] : v;
                }
            }
            __syncthreads();
        }
    }
    if constexpr (ACT != MV_ACT_NONE) {  // gate row i is fin[i], up row i fin[no + i]
        for (int i = tid; i < no; i += NT) y[r0 + i] = mv_act<ACT>(fin[i]) * fin[no + i];
    }
    if constexpr (EPI) {  // y: the product's own rows (null: nobody reads them after the step)
        if (tid < nr) {  // thread tid: row tid, whose inputs it requested (pre)
            const int j = tid;
            bool second;
            const int pj = epi_partner(j, split, ob, second);
            const float v = fin[j], o = pj < nr ? fin[pj] : 0.0f;  // no partner: the row is not roped
            const i64 m = r0 + j + (j < split ? 0 : jump);
            sib_epilogue(*epi, pre, member, y ? (char*)(y + m) : nullptr, m, v, second ? o : v, second ? v : o, second);
        }
    }
}

template <class Q, int R, int NMAX, bool SIB = false, bool NORM = false, int ACT = MV_ACT_NONE, bool QX = false,
          bool EPI = false>
__device__ __forceinline__ void mul_mat_vec_impl(const char* w, i64 w_nb1, const float* x, i64 x_stride, float* y,
                                                 i64 y_stride, const float* res, i64 res_stride, i64 n_rows, i64 ne0,
                                                 int ncols, i64 blk, const MvExtra& e, const SibEpi* epi = nullptr,
                                                 int member = 0, int pdl = 0) {
    constexpr int STAGE = MvGeom<Q>::stage_bytes(R);
    static_assert(QUANT_MV_STAGES * STAGE >= (R + NORM) * QUANT_MV_THREADS * 4, "the row sums reuse the stages");
    __shared__ __align__(16) u8 smem[QUANT_MV_STAGES * STAGE];
    __shared__ __align__(16) float tab[MV<Q>::TAB > 0 ? R * (MV_CHUNK / 256) * 16 : 4];
    __shared__ float fin[ACT != MV_ACT_NONE || EPI ? QUANT_MV_SLOTS * R : 1];
    unsigned long long a = (unsigned long long)w | (unsigned long long)w_nb1;
    if (ACT != MV_ACT_NONE) a |= (unsigned long long)e.w2;
    if ((a & 3) == 0)
        mv_run<Q, R, NMAX, 2, SIB, NORM, ACT, QX, EPI>(w, w_nb1, x, x_stride, y, y_stride, res, res_stride, n_rows,
                                              (int)ne0, ncols, smem, tab, fin, blk, e, epi, member, pdl);
    else if ((a & 1) == 0)
        mv_run<Q, R, NMAX, 1, SIB, NORM, ACT, QX, EPI>(w, w_nb1, x, x_stride, y, y_stride, res, res_stride, n_rows,
                                              (int)ne0, ncols, smem, tab, fin, blk, e, epi, member, pdl);
    else
        mv_run<Q, R, NMAX, 0, SIB, NORM, ACT, QX, EPI>(w, w_nb1, x, x_stride, y, y_stride, res, res_stride, n_rows,
                                              (int)ne0, ncols, smem, tab, fin, blk, e, epi, member, pdl);
}

// ---- streaming mat-vec: one column, every block type, int8 activations (`mul_mat_vecs_*_qx`) -------
// The mat-vec above spends ~20 instructions per weight byte on staging, addressing and decoding
// item by item (Nsight Compute: issue-bound, 0.37 of DRAM throughput; docs/performance.md). This
// one does per weight block and row only what the arithmetic needs:
// * Thread t of QUANT_MVS_THREADS owns item t (32 elements: a block of the 32-element types, an
//   eighth of a Q4_K / Q6_K block) of every chunk (QUANT_MVS_THREADS items of K) of all R rows of its
//   thread block: it quantizes those 32 activations to int8 in registers once (ggml's q8:
//   d = amax / 127), and each of its R rows costs the item's words from shared memory, 8 __dp4a
//   and two multiplies (Q6_K: its 6-bit values assembled from two runs of words, 8 __dp4a). No
//   shuffles, no shared memory for the activations.
// * Chunks of all R rows are copied global -> shared with 16-byte cp.async one chunk ahead of the
//   one being multiplied (two stages, dynamic shared memory; one when K is one chunk): a K = 4096
//   row group is requested whole before anything else happens. A row's copy starts at the 16-byte
//   boundary below it (rows of 18-byte blocks need not be 16-aligned).
// * Blocks are many and short-lived (R rows each): the hardware balances them and a next kernel's
//   blocks fill in as they drain (a persistent version measured faster alone but slower in a model).
// The sums per row meet in a fixed order (warp shuffles, then the warps through shared memory).
#ifndef QUANT_MVS_THREADS
#error "QUANT_MVS_* come from the host as -D (families/blocks.py)"
#endif
static_assert(QUANT_MVS_THREADS % 32 == 0 && QUANT_MVS_THREADS * 18 % 16 == 0, "streaming mat-vec geometry");
// sm_90 counts a stage's bulk-copied bytes on one mbarrier, whose transaction count holds less than
// 2^20: a stage holds R <= 16 rows of the block's QUANT_MVS_THREADS items (slots side by side share
// them), each item at most 34 bytes (Q8_0's).
static_assert(QUANT_MVS_THREADS * 34 * 16 < (1 << 20), "a stage's bytes fit an mbarrier's transaction count");
// a block's output rows (slots * R, R <= 16) are at most a row a thread: mvs_impl's carried norm
static_assert(QUANT_MVS_SLOTS * 16 <= QUANT_MVS_THREADS, "a block writes at most a row a thread");
// A dense stage's span (short rows back to back, mvs_impl) goes as bulk copies of this many bytes,
// one a lane of warp 0: a 49152 x 576 Q8_0 head's 112-row span (68.5 KB) is 17 copies.
constexpr int MVS_DENSE_PIECE = 4096;

// 32 activations as int8 (q[i]: elements 4i..4i+3) with their scale d, d * sum(q) (Q4_0's offset)
// and the exact float sum (Q4_1's minimum).
struct XB {
    int q[8];
    float d, d16, dsum, sum;  // d16 = d / 16 (exact): the scale of a dot over nibbles kept in place
    int qlo, qhi;  // the int8 values' sums over elements 0-15 and 16-31 (Q6_K's -32 offset, per half)
};

// NORM (the rms_norm prologue, x * nw / rms(x)): v = x * nw is quantized instead, and ss gains sum(x^2);
// the int8 quantization is scale invariant, so the row sums are scaled by 1 / rms(x) at the end.
__device__ __forceinline__ void mvs_load32(const float* x, bool vec, float* v) {
    if (vec) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const V16 a = *(const V16*)(x + 4 * i);
#pragma unroll
            for (int t = 0; t < 4; ++t) v[4 * i + t] = __uint_as_float(a.w[t]);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 32; ++i) v[i] = x[i];
    }
}
template <bool NORM>
__device__ __forceinline__ XB mvs_quantize(const float* x, const float* nw, bool vec, float& ss) {
    float v[32];
    mvs_load32(x, vec, v);
    if constexpr (NORM) {
        float n[32];
        mvs_load32(nw, vec, n);
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            ss = fmaf(v[i], v[i], ss);
            v[i] *= n[i];
        }
    }
    float amax = 0.0f, sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
        amax = fmaxf(amax, fabsf(v[i]));
        sum += v[i];
    }
    XB b;
    b.d = amax / 127.0f;
    b.d16 = b.d * 0.0625f;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int qs[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int q[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            q[t] = __float2int_rn(v[4 * i + t] * id);
            qs[i / 4] += q[t];
        }
        b.q[i] = (int)__byte_perm(__byte_perm(q[0], q[1], 0x0040), __byte_perm(q[2], q[3], 0x0040), 0x5410);
    }
    b.qlo = qs[0];
    b.qhi = qs[1];
    b.dsum = b.d * (float)(qs[0] + qs[1]);
    b.sum = sum;
    return b;
}

// One staged weight block at p (2-aligned: Q4_0's 18-byte blocks, Q8_0's 34, Q6_K's 210; Q4_1's 20
// are 4-aligned) times the activations of its item `sub` (32 elements; Q6_K has 8 a block), added
// to acc. Words are read 4-aligned and realigned by funnel shifts: a block at p = a + lo (lo = p & 3:
// 0 or 2, passed in because the caller knows it once for all its rows when they are aligned alike)
// has its F16 scale at byte lo and its quants from byte lo + 2.
template <class Q> struct MVS;
// N words from the 2-aligned p = a + lo (4-byte aligned reads realigned by funnel shifts; Q6_K's runs end
// at least 4 bytes before its block does).
template <int N> __device__ __forceinline__ void mvs_words_a2(const u8* p, unsigned lo, unsigned* w) {
    const unsigned* a = (const unsigned*)(p - lo);  // pointer arithmetic: p's address space (shared) is kept
    const unsigned sh = 8u * lo;
    unsigned r[N + 1];
#pragma unroll
    for (int i = 0; i <= N; ++i) r[i] = a[i];
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = __funnelshift_r(r[i], r[i + 1], sh);
}
// A 2-aligned block's N words of quants from byte 2 into q, its F16 scale (bytes 0-1) returned.
template <int N> __device__ __forceinline__ float mvs_block_a2(const u8* p, unsigned lo, unsigned* q) {
    const unsigned* a = (const unsigned*)(p - lo);
    const unsigned sh = 16u + 8u * lo;
    unsigned w[N + 1];
#pragma unroll
    for (int i = 0; i <= N; ++i) w[i] = a[i];
#pragma unroll
    for (int i = 0; i < N; ++i) q[i] = __funnelshift_rc(w[i], w[i + 1], sh);
    return h2f((u16)(__funnelshift_rc(w[0], w[1], sh - 16u) & 0xffffu));
}
// sum of the 4 unsigned bytes of a times the 4 signed bytes of b, plus c: a nibble kept in place
// (q & 0xf0f0f0f0 is 16 x the high nibbles) needs no shift, its sum is 16 x the nibbles' sum exactly.
__device__ __forceinline__ int dp4a_us(unsigned a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
// sum_i (low nibbles of q[i]) x[i] + (high nibbles of q[i]) x[4 + i], times 16 (exact: < 2^20)
__device__ __forceinline__ int mvs_nibbles16(const unsigned* q, const int* x) {
    int lo = 0, hi = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // byte j: element j (low nibble), 16 + j (high)
        lo = dp4a_us(q[i] & 0x0f0f0f0fu, x[i], lo);
        hi = dp4a_us(q[i] & 0xf0f0f0f0u, x[4 + i], hi);
    }
    return 16 * lo + hi;
}
template <> struct MVS<QQ4_0> {
    static __device__ __forceinline__ float dot(const u8* p, unsigned lo, int, const XB& x, float acc) {
        unsigned q[4];
        const float d = mvs_block_a2<4>(p, lo, q);
        return fmaf(d, fmaf(x.d16, (float)mvs_nibbles16(q, x.q), -8.0f * x.dsum), acc);  // sum (q - 8) x
    }
};
template <> struct MVS<QQ8_0> {  // 34-byte blocks (2-aligned): F16 scale, then 32 int8 quants in order
    static __device__ __forceinline__ float dot(const u8* p, unsigned lo, int, const XB& x, float acc) {
        unsigned q[8];
        const float d = mvs_block_a2<8>(p, lo, q);
        int s0 = 0, s1 = 0;  // two chains: the rows' products interleave better
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            s0 = __dp4a((int)q[i], x.q[i], s0);
            s1 = __dp4a((int)q[4 + i], x.q[4 + i], s1);
        }
        return fmaf(d * x.d, (float)(s0 + s1), acc);
    }
};
template <> struct MVS<QQ4_1> {
    static __device__ __forceinline__ float dot(const u8* p, unsigned, int, const XB& x, float acc) {
        const unsigned* a = (const unsigned*)p;  // 4-aligned (the host admits only such rows)
        const unsigned q[4] = {a[1], a[2], a[3], a[4]};
        const unsigned dm = a[0];
        return fmaf(h2f((u16)(dm >> 16)), x.sum, fmaf(h2f((u16)(dm & 0xffffu)) * x.d16, (float)mvs_nibbles16(q, x.q), acc));  // d q + m
    }
};
// Q4_K (144-byte blocks of 256, 2-aligned in a stage): item `sub` has a 6-bit scale and min
// (QQ4_K::scale_min) and its 4-bit values in the low (even sub) or high (odd) nibbles of
// qs[32 (sub / 2) ..]: x = d scale q - dmin min, so sum x_w x = d scale d_x sum q q_x - dmin min sum x.
template <> struct MVS<QQ4_K> {
    static __device__ __forceinline__ float dot(const u8* p, unsigned lo, int sub, const XB& x, float acc) {
        unsigned q[8];
        mvs_words_a2<8>(p + 16 + 32 * (sub >> 1), lo, q);
        // odd items' nibbles kept in place (16 x their value, exact), scaled back by x.d16
        const unsigned mask = sub & 1 ? 0xf0f0f0f0u : 0x0f0f0f0fu;
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            s0 = dp4a_us(q[i] & mask, x.q[i], s0);
            s1 = dp4a_us(q[4 + i] & mask, x.q[4 + i], s1);
        }
        unsigned scale, mn;
        QQ4_K::scale_min(p + 4, sub, scale, mn);
        return fmaf(sm_half(p) * (float)scale * (sub & 1 ? x.d16 : x.d), (float)(s0 + s1),
                    fmaf(-sm_half(p + 2) * (float)mn, x.sum, acc));
    }
};
// Q6_K (210-byte blocks of 256, 2-aligned): item `sub` is elements 32 sub .. + 31, i.e. quarter q of
// half h: low 4 bits in ql[64 h + 32 (q & 1) + l] (high nibble for q >= 2), high 2 bits at
// qh[32 h + l] >> 2q, value d * scale * (q6 - 32) with int8 scales[8 h + 2 q + (l >= 16)].
template <> struct MVS<QQ6_K> {
    static __device__ __forceinline__ float dot(const u8* p, unsigned al, int sub, const XB& x, float acc) {
        const int h = sub >> 2, q = sub & 3;
        unsigned lo[8], hi[8];
        mvs_words_a2<8>(p + 64 * h + 32 * (q & 1), al, lo);
        mvs_words_a2<8>(p + 128 + 32 * h, al, hi);
        const unsigned ns = 4u * (unsigned)(q >> 1), hs = 2u * (unsigned)q;
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int a = (int)(((lo[i] >> ns) & 0x0f0f0f0fu) | (((hi[i] >> hs) & 0x03030303u) << 4));
            const int b = (int)(((lo[4 + i] >> ns) & 0x0f0f0f0fu) | (((hi[4 + i] >> hs) & 0x03030303u) << 4));
            s0 = __dp4a(a, x.q[i], s0);
            s1 = __dp4a(b, x.q[4 + i], s1);
        }
        const unsigned sc = *(const u16*)(p + 192 + 8 * h + 2 * q);  // the halves' scales; x.qlo, x.qhi the -32's
        const int t = (int)(signed char)(sc & 0xffu) * (s0 - 32 * x.qlo) + (int)(signed char)(sc >> 8) * (s1 - 32 * x.qhi);
        return fmaf(sm_half(p + 208) * x.d, (float)t, acc);
    }
};

// The rows a block of the streaming mat-vec takes. A row of K is cut into `parts` parts (the
// blocks of one row block side by side: blockIdx.x = row block * parts + part) of `per` quant
// blocks; a part keeps tpr = min(NT, per * IPB) threads busy per row group; slots = NT / tpr groups of R
// rows side by side (short rows: K = 576 is 18 blocks, 7 groups of R rows a block); the host
// derives the same (blocks.Vecs). ACT (the sibling SwiGLU / GeGLU step): the block's rows are `no`
// rows of the gate (w) and the same rows of up (w2, rows as far apart).
template <class Q, int R, int ACT>
struct MvsRows {
    static constexpr int IPB = Q::QK / 32;  // a thread's items (32 elements) per quant block: 8 for the K-quants
    int part, nblk, tpr, slots, no, nr, kb0;  // nblk: this part's quant blocks from kb0; no: output rows, nr: weight rows
    i64 rb, r0, nb1, up;
    const char* wb;
    __device__ __forceinline__ MvsRows(const char* w, const char* w2, i64 w_nb1, i64 n_rows, int K, int parts) {
        const int all = K / Q::QK, per = (all + parts - 1) / parts;
        rb = (i64)(blockIdx.x / (unsigned)parts);
        part = (int)(blockIdx.x - (unsigned)rb * (unsigned)parts);
        kb0 = min(all, part * per);
        nblk = min(all, kb0 + per) - kb0;
        tpr = max(1, min(QUANT_MVS_THREADS, per * IPB));
        slots = min(QUANT_MVS_SLOTS, QUANT_MVS_THREADS / tpr);
        const int ob = ACT != MV_ACT_NONE ? slots * R / 2 : slots * R;
        r0 = rb * ob;
        no = (int)max((i64)0, min((i64)ob, n_rows - r0));
        nr = ACT != MV_ACT_NONE ? 2 * no : no;
        nb1 = w_nb1;
        wb = w + r0 * w_nb1 + (i64)kb0 * Q::BYTES;
        up = ACT != MV_ACT_NONE ? (i64)(w2 - w) - (i64)no * w_nb1 : 0;
    }
    // block row j: row r0 + j of w, or (ACT, j >= no) row r0 + j - no of w2, from this part's first block
    __device__ __forceinline__ const char* row(int j) const { return wb + (i64)j * nb1 + (j < no ? 0 : up); }
    // the row's index among all weight rows (ACT: up's after gate's n_rows)
    __device__ __forceinline__ i64 index(int j, i64 n_rows) const { return j < no ? r0 + j : n_rows + r0 + (j - no); }
};

// QUANT_STAMP_GRID > 0 (blocks.STAMP_GRID: a measuring build; scripts/stamps.py): thread 0 of
// each block of a streaming launch with that many blocks stamps (gg_stamp) its phases into
// mvs_stamps: 0 entry, 1 early copies issued, 2 wait over, 3 chunk 0's activations quantized, 4
// chunk 0 landed, 5 dot done, 6 sums written (a K part's last block: 7 the parts added up). The
// last such launch's stamps stay.
#if QUANT_STAMP_GRID > 0
__device__ unsigned long long mvs_stamps[QUANT_STAMP_GRID][QUANT_STAMP_PHASES][3];
__device__ __forceinline__ void mvs_stamp(int phase, float after = 0.0f) {
    if (threadIdx.x == 0 && gridDim.x == QUANT_STAMP_GRID) gg_stamp(mvs_stamps[blockIdx.x][phase], after);
}
#else
__device__ __forceinline__ void mvs_stamp(int, float = 0.0f) {}
#endif

// y[r] = sum_k W[r, k] x[k] (+ res[r]) for the block's rows (MvsRows); ACT: y[r] = act(gate row r)
// * (up row r). parts > 1: each block's sums go to partial[part][weight row], and the last block of
// a row block to take its ticket (tickets[row block]) adds them up in part order and writes y.
// The entry points call this first: it waits for the kernel before it itself (gg_grid_wait), and
// with QUANT_MVS_EARLY in `pdl` (the host found no step of the plan writing the weights) it copies
// its first chunk of weights into shared memory before that wait, so a block made resident while
// its predecessor runs (PDL) has its weights on the way. With QUANT_MVS_LATE (the next kernel
// streams too) it lets that one launch only once its last chunk has landed, so the next one's
// early copies fill this one's tail instead of competing with its loads.
// NORM: x is normalized on the way in (rms_norm(x, eps) * nw); with parts each part's sum(x^2)
// follows its row sums in `partial`.
// CARRY (the `_carry` builds; the others compile none of it): a norm carried across the step
// boundary (blocks.Vecs carry_out / carry_in: the planner's gg/graph/carry.py; the rms_norm step
// between two products leaves the plan). cw non-null: this product also writes its rows times the
// norm weight (cy[r] = y[r] * cw[r]) and each row block's sum of y^2 (css[row block], a fixed-order
// block sum). ncss > 0: x is such a producer's cy (the norm's weight already in) and the row sums
// are scaled by 1 / rms from the ncss sums in css, added up in a fixed order: the int8
// quantization is scale invariant, as for NORM.
template <class Q, int R, int ACT = MV_ACT_NONE, bool NORM = false, bool CARRY = false>
__device__ __forceinline__ void mvs_impl(const char* w, const char* w2, i64 w_nb1, const float* x, const float* nw,
                                         float eps, float* y, const float* res, i64 n_rows, int K, int parts,
                                         float* partial, int* tickets, int pdl, const float* cw, float* cy,
                                         float* css, int ncss) {
    constexpr int NT = QUANT_MVS_THREADS;
    extern __shared__ __align__(16) u8 mvs_smem[];
    __shared__ float red[R][NT / 32];
    __shared__ float ssw[NT / 32];
    __shared__ float fin[ACT != MV_ACT_NONE ? QUANT_MVS_SLOTS * R : 1];
    __shared__ unsigned char roff[QUANT_MVS_SLOTS * R];  // each weight row's offset from a 16-byte boundary
    const MvsRows<Q, R, ACT> g(w, w2, w_nb1, n_rows, K, parts);  // arithmetic only: nothing read yet
    if (g.no == 0) return;
    mvs_stamp(0);
    const int tid = threadIdx.x, nblk = g.nblk, tpr = g.tpr, slots = g.slots, no = g.no, nr = g.nr;
    const i64 r0 = g.r0;
    constexpr int IPB = MvsRows<Q, R, ACT>::IPB;
    const int items = nblk * IPB, nchunks = (items + tpr - 1) / tpr;
    const i64 wrows = ACT != MV_ACT_NONE ? 2 * n_rows : n_rows;
    const i64 stride = wrows + (NORM ? 1 : 0);  // of the partial sums, a part's (NORM: then its sum(x^2))
    const int slot = tid / tpr, item = tid - slot * tpr;
    const int cb = tpr / IPB * Q::BYTES, rs = (cb + 31) & ~15;  // a row's chunk, its stage pitch (+ 16 for alignment)
    // The copies: piece k (16 bytes) of row j for v = j * nv + k = tid, tid + NT, ..: (j, k) stepped
    // without a division and the row's pointer worked out once a piece (that arithmetic, with a
    // division per piece, had cost as many instructions as the products).
    const int nv = rs / 16, dj = NT / nv, dk = NT - dj * nv;
    // Rows, the up rows' distance and a chunk all multiples of 16 bytes: every row lands at the start
    // of its stage row in every chunk (the llama shapes: K = 4096 and the 14336 parts, every type).
    const bool aligned =
        (((unsigned long long)g.wb | (unsigned long long)g.nb1 | (unsigned long long)g.up | (unsigned)cb) & 15u) == 0;
    // ... and the last chunk too: sm_90 copies each row's chunk with one bulk copy (warp 0, a lane a
    // row) counted on mbar[c & 1], and only warp 0 waits on it (the __syncthreads after the wait
    // hands the stage to the others); the 16-byte cp.async loop cost ~50 instructions a piece.
    // Short rows of one chunk lying back to back (nb1 = a row's bytes: a model's head, 576-wide
    // rows of 612 / 360 / 324 bytes, off 16-byte boundaries) are one span of memory: it is copied
    // whole into the stage at its offset from a 16-byte boundary, row j nb1 * j bytes on. Pieces a
    // row (the path below) cost ~50 instructions each and left a 49152 x 576 Q8_0 head issue-bound
    // (Nsight Compute: DRAM 20% busy; docs/performance.md, thirtieth session).
    const bool dense = ACT == MV_ACT_NONE && !aligned && nchunks == 1 && g.nb1 == (i64)nblk * Q::BYTES;
    const int dlo = (int)((unsigned long long)g.wb & 15u), dspan = nr * (int)g.nb1;  // within the stage
    __shared__ __align__(8) unsigned long long mbar[2];
    const bool bulk = GG_BULK_COPY && (dense ? dlo == 0 && (dspan & 15) == 0 : aligned && ((nblk * Q::BYTES) & 15) == 0);
#if GG_BULK_COPY
    if (bulk && tid == 0) {
        mbar_init(&mbar[0], 1);
        mbar_init(&mbar[1], 1);
        async_proxy_fence();
    }
#endif
    auto issue = [&](int c) {
        u8* sb = mvs_smem + (c & 1) * (nr * rs);
        const int bytes = min(tpr, items - c * tpr) / IPB * Q::BYTES;
        const i64 cco = (i64)c * cb;
#if GG_BULK_COPY
        if (bulk) {
            if (tid < 32) {
                __syncwarp();  // the barriers' initialization (c = 0) or the stage's readers (c >= 2) first
                if (c >= 2) async_proxy_fence();  // the stage's reads before the copies' writes
                if (tid == 0) mbar_expect(&mbar[c & 1], (unsigned)(dense ? dspan : nr * bytes));
                __syncwarp();
                // QUANT_MVS_EVICT_FIRST: the weights' L2 lines first to go (l2_evict_first)
                const unsigned long long pol = QUANT_MVS_EVICT_FIRST ? l2_evict_first() : 0ull;
                auto copy = [&](void* d, const void* s, unsigned n, unsigned long long* b) {
                    if (QUANT_MVS_EVICT_FIRST) bulk_copy_hint(d, s, n, b, pol);
                    else bulk_copy(d, s, n, b);
                };
                if (dense)  // the span (c == 0) in MVS_DENSE_PIECE bytes a lane
                    for (int o = tid * MVS_DENSE_PIECE; o < dspan; o += 32 * MVS_DENSE_PIECE)
                        copy(sb + o, g.wb + o, (unsigned)min(MVS_DENSE_PIECE, dspan - o), &mbar[0]);
                else
                    for (int j = tid; j < nr; j += 32) copy(sb + j * rs, g.row(j) + cco, (unsigned)bytes, &mbar[c & 1]);
            }
            return;
        }
#endif
        if (dense) {  // the span in 16-byte pieces from the boundary at or below it: none reads a run the span misses
            const char* a = g.wb - dlo;
            for (int o = 16 * tid; o < dlo + dspan; o += 16 * NT) cp_async16(sb + o, a + o, min(16, dlo + dspan - o));
            cp_async_commit();
            return;
        }
        int j = tid / nv, k = tid - j * nv;
#pragma unroll 1
        while (j < nr) {
            const char* p = g.row(j) + cco;
            const int off = (int)((unsigned long long)p & 15u), have = off + bytes - 16 * k;
            if (have > 0) cp_async16(sb + j * rs + 16 * k, p - off + 16 * k, min(have, 16));
            k += dk;
            j += dj;
            if (k >= nv) {
                k -= nv;
                ++j;
            }
        }
        cp_async_commit();
    };
    // chunk c in place: its bytes counted on its barrier (bulk), or this thread's copies landed
    auto land = [&](int c) {
#if GG_BULK_COPY
        if (bulk) {
            if (tid < 32) mbar_wait(&mbar[c & 1], (unsigned)(c >> 1) & 1u);
            return;
        }
#endif
        if (c + 1 < nchunks) cp_async_wait<1>();
        else cp_async_wait<0>();
    };
    x += (i64)g.kb0 * Q::QK;  // this part's activations
    if constexpr (NORM) nw += (i64)g.kb0 * Q::QK;
    const bool xvec = ((unsigned long long)x & 15u) == 0 && (!NORM || ((unsigned long long)nw & 15u) == 0);
    float ss = 0.0f;  // NORM: sum(x^2) over slot 0's items
    float acc[R];
#pragma unroll
    for (int m = 0; m < R; ++m) acc[m] = 0.0f;
    const bool early = pdl & QUANT_MVS_EARLY, late = pdl & QUANT_MVS_LATE;
    // the dot loop reads row j's offset from here instead of redoing its 64-bit address arithmetic
    // (made visible by the loop's first __syncthreads)
    if (!aligned && !dense)
        for (int j = tid; j < nr; j += NT) roff[j] = (unsigned char)((unsigned long long)g.row(j) & 15u);
    if (early && nblk > 0) issue(0);
    mvs_stamp(1);
    gg_grid_wait();
    mvs_stamp(2);
    if (!late) gg_launch_dependents();
    if (!early && nblk > 0) issue(0);
    // CARRY, reading: the producer's sums of squares copied into shared memory (cp.async: no register
    // held across the loop; a thread's 16 bytes), landed with chunk 0, added up after the loop.
    // Writing: the norm weight of the row this thread writes (cwv), requested with chunk 0.
    __shared__ __align__(16) float css_s[CARRY ? QUANT_MVS_CARRY_LOADS * NT : 4];
    static_assert(QUANT_MVS_CARRY_LOADS == 4, "a thread copies one 16-byte piece of the sums");
    if (CARRY && ncss > 0) {
        if (4 * tid < ncss) cp_async16(css_s + 4 * tid, css + 4 * tid, 4 * min(4, ncss - 4 * tid));
        cp_async_commit();  // a group after chunk 0's and before chunk 1's: land(0) waits for it
    }
    float cwv = 0.0f;
    for (int c = 0; c < nchunks; ++c) {
        if (c + 1 < nchunks) issue(c + 1);  // into the stage chunk c - 1 used (freed below)
        const int b = c * tpr + item;
        const bool live = slot < slots && b < items;
        XB xb;
        if (live) {  // while the copies are in flight
            float s2 = 0.0f;
            xb = mvs_quantize<NORM>(x + (i64)b * 32, nw + (NORM ? (i64)b * 32 : 0), xvec, s2);
            if (slot == 0) ss += s2;
        }
        if (c == 0) mvs_stamp(3, live ? xb.d : 0.0f);  // once thread 0's activations are in (d needs them all)
        if (CARRY && c == 0 && cw && tid < no) cwv = cw[r0 + tid];  // after the activations: not to delay them
        land(c);
        if (late && c + 1 == nchunks) gg_launch_dependents();
        if (CARRY && c == 0 && ncss > 0 && bulk) cp_async_wait<0>();  // (the bulk path's chunks count no group)
        __syncthreads();
        if (c == 0) mvs_stamp(4);
        if (live) {
            const unsigned ib = (unsigned)(item / IPB * Q::BYTES);  // the item's block in a stage row
            const u8* sb = mvs_smem + (c & 1) * (nr * rs) + slot * R * rs + ib;
            if (dense) {  // row j of the span at dlo + nb1 * j (a Q4_1 row 4-aligned: the host's rule)
#pragma unroll
                for (int m = 0; m < R; ++m) {
                    const int j = slot * R + m, o = dlo + (int)ib + j * (int)g.nb1;  // its item's block in the stage
                    if (j < nr) acc[m] = MVS<Q>::dot(mvs_smem + o, (unsigned)o & 3u, item % IPB, xb, acc[m]);
                }
            } else if (aligned) {  // every row at the start of its stage row: the same alignment, no guard, no
                // offsets (rows past nr read stale stage bytes into sums that are never written)
#pragma unroll
                for (int m = 0; m < R; ++m) acc[m] = MVS<Q>::dot(sb + m * rs, ib & 3u, item % IPB, xb, acc[m]);
            } else {
                const unsigned cc = (unsigned)c * (unsigned)cb;  // chunk c of row j starts (roff[j] + cc) & 15 off
#pragma unroll
                for (int m = 0; m < R; ++m) {
                    const int j = slot * R + m;
                    const unsigned o = (roff[j] + cc) & 15u;
                    if (j < nr) acc[m] = MVS<Q>::dot(sb + m * rs + o, (ib + o) & 3u, item % IPB, xb, acc[m]);
                }
            }
        }
        __syncthreads();  // stage c & 1 is free for chunk c + 2
    }
    mvs_stamp(5);
    float scale = 1.0f;  // NORM: 1 / rms(x) from this block's sum(x^2) (the whole row when parts == 1)
    if constexpr (NORM) {
        ss = warp_sum(ss);
        if ((tid & 31) == 0) ssw[tid >> 5] = ss;
        __syncthreads();
        ss = 0.0f;
#pragma unroll
        for (int i = 0; i < NT / 32; ++i) ss += ssw[i];
        if (parts > 1 && tid == 0) partial[g.part * stride + wrows] = ss;  // every row block writes the same
        scale = rsqrtf(ss / (float)K + eps);
    }
    if (CARRY && ncss > 0) {  // the producer's sums in a fixed order (not NORM: ssw is free)
        float cs = 0.0f;
#pragma unroll
        for (int k = 0; k < QUANT_MVS_CARRY_LOADS; ++k)
            if (tid + k * NT < ncss) cs += css_s[tid + k * NT];
        scale = rsqrtf(block_sum(cs, ssw) / (float)K + eps);
    }
    // Row j's sum v goes to y (plain: + res), for ACT to fin[j] for the gate/up pairing, or with
    // parts to the partial sums (unscaled: the scale needs every part's sum(x^2)). A thread writes
    // at most one row (tid: nr <= slots * R <= NT), so its carried y^2 is one value.
    float hs = 0.0f;
    auto out = [&](int j, float h) {
        y[r0 + j] = h;
        if (CARRY && cw) {
            cy[r0 + j] = h * cwv;
            hs = h * h;
        }
    };
    auto finish = [&](int j, float v) {
        if (parts > 1) partial[g.part * stride + g.index(j, n_rows)] = v;
        else if constexpr (ACT != MV_ACT_NONE) fin[j] = v * scale;
        else out(j, res ? v * scale + res[r0 + j] : v * scale);
    };
    if (slots == 1) {  // a row's NT partial sums: shuffles, then the warps' sums
        const int warp = tid >> 5, lane = tid & 31;
#pragma unroll
        for (int m = 0; m < R; ++m) {
            const float v = warp_sum(acc[m]);
            if (lane == 0) red[m][warp] = v;
        }
        __syncthreads();
        if (tid < nr) {
            float v = 0.0f;
#pragma unroll
            for (int i = 0; i < NT / 32; ++i) v += red[tid][i];
            finish(tid, v);
        }
    } else {  // short rows: each thread's R sums through the stages (idle now), a thread per row
        float* part = (float*)mvs_smem;  // R * NT floats (the host sizes the stages for it)
#pragma unroll
        for (int m = 0; m < R; ++m) part[m * NT + tid] = acc[m];
        __syncthreads();
        for (int j = tid; j < nr; j += NT) {
            const float* pr = part + (j % R) * NT + (j / R) * tpr;
            float v = 0.0f;
#pragma unroll 1
            for (int i = 0; i < tpr; ++i) v += pr[i];
            finish(j, v);
        }
    }
    mvs_stamp(6);
    if (parts > 1) {  // the last block of the row block adds the parts' sums
        if (!gg_last_block<QUANT_MVS_RELEASE != 0>(tickets + g.rb, parts)) return;
        if constexpr (NORM) {
            ss = 0.0f;
            for (int p = 0; p < parts; ++p) ss += __ldcg(partial + p * stride + wrows);
            scale = rsqrtf(ss / (float)K + eps);
        }
        for (int i = tid; i < no; i += NT) {
            float v = 0.0f, u = 0.0f;
            for (int p = 0; p < parts; ++p) {
                v += __ldcg(partial + p * stride + r0 + i);
                if constexpr (ACT != MV_ACT_NONE) u += __ldcg(partial + p * stride + n_rows + r0 + i);
            }
            v *= scale;
            if constexpr (ACT != MV_ACT_NONE) y[r0 + i] = mv_act<ACT>(v) * (u * scale);
            else out(i, res ? v + res[r0 + i] : v);
        }
        if (tid == 0) tickets[g.rb] = 0;  // ready for the next run
        mvs_stamp(7);
    } else if constexpr (ACT != MV_ACT_NONE) {  // gate row i is fin[i], up row i fin[no + i]
        __syncthreads();
        for (int i = tid; i < no; i += NT) y[r0 + i] = mv_act<ACT>(fin[i]) * fin[no + i];
    }
    if (CARRY && ACT == MV_ACT_NONE && cw) {  // the row block's sum of y^2 (every thread, or the last block's)
        hs = block_sum(hs, ssw);
        if (tid == 0) css[g.rb] = hs;
    }
}

// mul_mat_vecs<R>[_norm|_carry]_<t>_f32_qx(w, w_nb1, x, nw, eps, y, res, n_rows, K, parts, partial, tickets,
// pdl, cw, cy, css, ncss) (_carry: cw .. ncss a carried norm, mvs_impl CARRY; the others ignore them):
// the streaming mat-vec with R rows per row group (res: null or the residual added as y is
// written; _norm: x normalized on the way in, rms_norm(x, eps) * nw; else nw null). Dynamic shared
// memory: the host's blocks.Vecs.launch bytes.
// mul_mat_sibs<R>[_norm|_carry]_<act>_<t>_f32_qx(wg, wu, nb1, x, nw, eps, y, n_rows, K, parts, partial,
// tickets, pdl, cw, cy, css, ncss): the sibling SwiGLU / GeGLU step on the same blocks (y[r] =
// act(Wg x)[r] * (Wu x)[r]; gate and up rows nb1 bytes apart). cw .. ncss: a carried norm (mvs_impl;
// null / 0: none).
// QUANT_MVS_BLOCKS_SM > 0 asks ptxas for registers that let that many blocks share an SM (the
// plain builds; QUANT_MVS_NORM_BLOCKS_SM the same for the _norm ones; 0: no minimum). NVRTC 13.0
// gives the streaming builds 87-168 registers, 3-5 blocks of 128 threads an SM (scripts/regs.py).
#if QUANT_MVS_BLOCKS_SM > 0
#define GG_MVS_BOUNDS __launch_bounds__(QUANT_MVS_THREADS, QUANT_MVS_BLOCKS_SM)
#else
#define GG_MVS_BOUNDS __launch_bounds__(QUANT_MVS_THREADS)
#endif
#if QUANT_MVS_NORM_BLOCKS_SM > 0
#define GG_MVS_NORM_BOUNDS __launch_bounds__(QUANT_MVS_THREADS, QUANT_MVS_NORM_BLOCKS_SM)
#else
#define GG_MVS_NORM_BOUNDS GG_MVS_BOUNDS
#endif
// The _carry builds ask for registers that fit MvsCarryBlocks<Q, R>::N blocks an SM (blocks.py
// MVS_CARRY_BLOCKS_SM*: 4, at most 128 registers; Q8_0's 16-row builds 3, at most 170, whose
// stages allow 3 an SM anyway; the builds of 8 rows or fewer, every type, their own bound).
template <class Q> struct MvsCarryWide { static constexpr int N = QUANT_MVS_CARRY_BLOCKS_SM; };
template <> struct MvsCarryWide<QQ8_0> { static constexpr int N = QUANT_MVS_CARRY_BLOCKS_SM_Q8_0; };
template <class Q, int R> struct MvsCarryBlocks {
    static constexpr int N = R <= 8 ? QUANT_MVS_CARRY_BLOCKS_SM_R8 : MvsCarryWide<Q>::N;
};
// by (NORM, CARRY) of the build
#define GG_MVS_BOUNDS_false_false(Q, R) GG_MVS_BOUNDS
#define GG_MVS_BOUNDS_true_false(Q, R) GG_MVS_NORM_BOUNDS
#define GG_MVS_BOUNDS_false_true(Q, R) __launch_bounds__(QUANT_MVS_THREADS, MvsCarryBlocks<Q, R>::N)
#define GG_QUANT_SIBS_ACT(Q, S, R, NAME, ACT, NORM, CARRY, N)                                                      \
    extern "C" __global__ void GG_MVS_BOUNDS_##NORM##_##CARRY(Q, R)                                               \
        mul_mat_sibs##R##N##_##NAME##_##S##_f32_qx(const char* wg, const char* wu, i64 nb1, const float* x,       \
                                                   const float* nw, float eps, float* y, i64 n_rows, i64 K,       \
                                                   int parts, float* partial, int* tickets, int pdl,              \
                                                   const float* cw, float* cy, float* css, int ncss) {            \
        mvs_impl<Q, R, ACT, NORM, CARRY>(wg, wu, nb1, x, nw, eps, y, nullptr, n_rows, (int)K, parts, partial,     \
                                         tickets, pdl, cw, cy, css, ncss);                                        \
    }
#define GG_QUANT_VECS_RN(Q, S, R, NORM, CARRY, N)                                                                 \
    extern "C" __global__ void GG_MVS_BOUNDS_##NORM##_##CARRY(Q, R)                                               \
        mul_mat_vecs##R##N##_##S##_f32_qx(const char* w, i64 w_nb1, const float* x, const float* nw, float eps,   \
                                          float* y, const float* res, i64 n_rows, i64 K, int parts,               \
                                          float* partial, int* tickets, int pdl, const float* cw, float* cy,      \
                                          float* css, int ncss) {                                                 \
        mvs_impl<Q, R, MV_ACT_NONE, NORM, CARRY>(w, nullptr, w_nb1, x, nw, eps, y, res, n_rows, (int)K, parts,    \
                                                 partial, tickets, pdl, cw, cy, css, ncss);                       \
    }                                                                                                             \
    GG_QUANT_SIBS_ACT(Q, S, R, silu, MV_ACT_SILU, NORM, CARRY, N)                                                 \
    GG_QUANT_SIBS_ACT(Q, S, R, gelu, MV_ACT_GELU, NORM, CARRY, N)
#define GG_QUANT_VECS_R(Q, S, R)                                                                                  \
    GG_QUANT_VECS_RN(Q, S, R, false, false, )                                                                     \
    GG_QUANT_VECS_RN(Q, S, R, true, false, _norm) GG_QUANT_VECS_RN(Q, S, R, false, true, _carry)
#define GG_QUANT_VECS(Q, S) GG_QUANT_VECS_R(Q, S, 4) GG_QUANT_VECS_R(Q, S, 8) GG_QUANT_VECS_R(Q, S, 16)

// ---- sibling mat-vecs (gg/graph/siblings.py, families/siblings.py) ---------------------------
// Up to QUANT_SIB_MAX products W_j · x of one F32 row, all of one block type, in one launch: the
// grid is the products' blocks one after another (QSibMember.block0: a product's first block),
// each block the one-column mat-vec above over its product's rows (NORM: x normalized on the way
// in; ACT: two products, gate and up, a block takes the same rows of both and writes act(g) * u
// to the gate entry's `out`; EPI: every row through the epilogue of epilogue.cuh, rope(q), rope(k)
// and the K/V cache writes). All fields 8 bytes: the host packs the set as words.
struct QSibMember {
    const char* a;  // the weights: rows of K elements, nb1 bytes apart
    i64 nb1;
    char* out;      // F32, contiguous
    i64 rows;
    i64 block0;
};
struct QSibSet {
    i64 n, K;
    QSibMember m[QUANT_SIB_MAX];
};

// R: rows of each slot (MV<Q>::ROWS, or the small builds' QUANT_SIB_SMALL_ROWS).
template <class Q, bool NORM, int ACT, bool QX = false, bool EPI = false, int R = MV<Q>::ROWS>
__device__ __forceinline__ void sibq_impl(const QSibSet& s, const float* x, const float* nw, float eps, int pdl,
                                          const SibEpi* epi = nullptr) {
    // the block's product, with constant indices only (a parameter indexed at run time is copied
    // to local memory first)
    QSibMember p = s.m[0];
    int member = 0;
#pragma unroll
    for (int i = 1; i < QUANT_SIB_MAX; ++i) {
        if (i < s.n && (i64)blockIdx.x >= s.m[i].block0) {
            p = s.m[i];
            member = i;
        }
    }
    const MvExtra e{nw, eps, ACT != MV_ACT_NONE ? s.m[1].a : nullptr};
    mul_mat_vec_impl<Q, R, 1, true, NORM, ACT, QX, EPI>(p.a, p.nb1, x, 0, (float*)p.out, 0, nullptr, 0, p.rows,
                                                        s.K, 1, (i64)blockIdx.x - p.block0, e, epi, member, pdl);
}

// ---- entry points -----------------------------------------------------------------------------
// mul_mat_sibq[_norm][_silu|_gelu]_<t>_f32<SUF>(QSibSet, x, nw, eps, pdl): the sibling mat-vecs above
// with R rows a slot (pdl as mul_mat_vec1's).
#define GG_SIBQ_X(Q, S, NORM, ACT, QX, NAME, SUF, R)                                                               \
    extern "C" __global__ void __launch_bounds__(QUANT_MV_THREADS, QUANT_SIB_BLOCKS)                               \
        mul_mat_sibq##NAME##_##S##_f32##SUF(QSibSet s, const float* x, const float* nw, float eps, int pdl) {     \
        sibq_impl<Q, NORM, ACT, QX, false, R>(s, x, nw, eps, pdl);                                                \
    }
// Without/with the norm: plain, SwiGLU and GeGLU.
#define GG_SIBQ_ACTS(Q, S, QX, SUF, R)                                                                            \
    GG_SIBQ_X(Q, S, false, MV_ACT_NONE, QX, , SUF, R)                                                             \
    GG_SIBQ_X(Q, S, true, MV_ACT_NONE, QX, _norm, SUF, R)                                                         \
    GG_SIBQ_X(Q, S, false, MV_ACT_SILU, QX, _silu, SUF, R)                                                        \
    GG_SIBQ_X(Q, S, true, MV_ACT_SILU, QX, _norm_silu, SUF, R)                                                    \
    GG_SIBQ_X(Q, S, false, MV_ACT_GELU, QX, _gelu, SUF, R)                                                        \
    GG_SIBQ_X(Q, S, true, MV_ACT_GELU, QX, _norm_gelu, SUF, R)
// mul_mat_sibq[_norm]_epi_<t>_f32<SUF>(QSibSet, x, nw, eps, SibEpi, pdl): with the epilogue (epilogue.cuh).
#define GG_SIBQ_EPI(Q, S, NORM, QX, NAME, SUF, R)                                                                  \
    extern "C" __global__ void __launch_bounds__(QUANT_MV_THREADS, QUANT_SIB_BLOCKS)                               \
        mul_mat_sibq##NAME##_epi_##S##_f32##SUF(QSibSet s, const float* x, const float* nw, float eps, SibEpi epi, \
                                                int pdl) {                                                        \
        sibq_impl<Q, NORM, MV_ACT_NONE, QX, true, R>(s, x, nw, eps, pdl, &epi);                                    \
    }
// Every sibling build of a type and R rows a slot: without/with the norm, plain, SwiGLU and GeGLU,
// with the epilogue.
#define GG_SIBQ_SET(Q, S, QX, SUF, R)                                                                             \
    GG_SIBQ_EPI(Q, S, false, QX, , SUF, R)                                                                        \
    GG_SIBQ_EPI(Q, S, true, QX, _norm, SUF, R)                                                                    \
    GG_SIBQ_ACTS(Q, S, QX, SUF, R)
// mul_mat_vec1_<t>_f32<SUF>: the one-column mat-vec (QX: int8 activations).
#define GG_QUANT_VEC1(Q, S, QX, SUF)                                                                              \
    extern "C" __global__ void __launch_bounds__(QUANT_MV_THREADS, MV<Q>::BLOCKS)                                 \
        mul_mat_vec1_##S##_f32##SUF(const char* w, i64 w_nb1, const float* x, i64 x_stride, float* y,            \
                                    i64 y_stride, const float* res, i64 res_stride, i64 n_rows, i64 ne0,         \
                                    int ncols, int pdl) {                                                         \
        mul_mat_vec_impl<Q, MV<Q>::ROWS1, 1, false, false, MV_ACT_NONE, QX>(                                      \
            w, w_nb1, x, x_stride, y, y_stride, res, res_stride, n_rows, ne0, ncols, blockIdx.x, MvExtra{}, nullptr, \
            0, pdl);                                                                                              \
    }

// dequant_rows_<t>_<o>: dst row r (o = f32 | f16) = source row r dequantized.
// get_rows_<t>_<o>: dst row r = source row ids[r].
// mul_mat_vec_<t>_f32: ncols 1..8; mul_mat_vec1_<t>_f32: one column (ncols ignored), fewer
// registers for decode proper. Both add `res` (null: nothing) as they write (mv_run); `pdl`:
// QUANT_MVS_EARLY copies the first chunks of weights before the wait (mv_run).
#define GG_QUANT_KERNELS(Q, S)                                                                                    \
    extern "C" __global__ void dequant_rows_##S##_f32(const char* src, i64 src_nb1, char* dst, i64 dst_nb1,        \
                                                      i64 n_rows, i64 ne0) {                                      \
        gg_grid_sync();                                                                                           \
        dequant_rows_impl<Q, float, false>(src, src_nb1, dst, dst_nb1, n_rows, ne0, nullptr, 0, nullptr, 0);      \
    }                                                                                                             \
    extern "C" __global__ void dequant_rows_##S##_f16(const char* src, i64 src_nb1, char* dst, i64 dst_nb1,        \
                                                      i64 n_rows, i64 ne0) {                                      \
        gg_grid_sync();                                                                                           \
        dequant_rows_impl<Q, f16, false>(src, src_nb1, dst, dst_nb1, n_rows, ne0, nullptr, 0, nullptr, 0);        \
    }                                                                                                             \
    extern "C" __global__ void get_rows_##S##_f32(const char* src, i64 src_nb1, char* dst, i64 dst_nb1,            \
                                                  i64 n_rows, i64 ne0, const int* ids, i64 n_src_rows, int* err,  \
                                                  int code) {                                                     \
        gg_grid_sync();                                                                                           \
        dequant_rows_impl<Q, float, true>(src, src_nb1, dst, dst_nb1, n_rows, ne0, ids, n_src_rows, err, code);   \
    }                                                                                                             \
    extern "C" __global__ void get_rows_##S##_f16(const char* src, i64 src_nb1, char* dst, i64 dst_nb1,            \
                                                  i64 n_rows, i64 ne0, const int* ids, i64 n_src_rows, int* err,  \
                                                  int code) {                                                     \
        gg_grid_sync();                                                                                           \
        dequant_rows_impl<Q, f16, true>(src, src_nb1, dst, dst_nb1, n_rows, ne0, ids, n_src_rows, err, code);     \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(QUANT_MV_THREADS, 3)                                                \
        mul_mat_vec_##S##_f32(const char* w, i64 w_nb1, const float* x, i64 x_stride, float* y, i64 y_stride,     \
                              const float* res, i64 res_stride, i64 n_rows, i64 ne0, int ncols, int pdl) {        \
        mul_mat_vec_impl<Q, QUANT_MV_ROWS_N, QUANT_MV_NMAX>(w, w_nb1, x, x_stride, y, y_stride, res, res_stride,  \
                                                            n_rows, ne0, ncols, blockIdx.x, MvExtra{}, nullptr, 0, \
                                                            pdl);                                                 \
    }                                                                                                             \
    GG_QUANT_VEC1(Q, S, false, )                                                                                  \
    GG_SIBQ_SET(Q, S, false, , MV<Q>::ROWS)

// The QX builds (quantized activations, __dp4a): mul_mat_vec1_<t>_f32_qx and the sibling builds
// mul_mat_sibq*_<t>_f32_qx, for the 4-bit types (Q8_0's measured no faster: blocks.QX_TYPES), and
// mul_mat_sibq*_<t>_f32_qx_small (the epilogue builds too), QUANT_SIB_SMALL_ROWS rows a slot, for
// matrices too small to fill the GPU with MV<Q>::ROWS (SmolLM2's; blocks.SIB_SMALL_ROWS).
#define GG_QUANT_QX(Q, S)                                                                                         \
    GG_QUANT_VEC1(Q, S, true, _qx)                                                                                \
    GG_SIBQ_SET(Q, S, true, _qx, MV<Q>::ROWS)                                                                     \
    GG_SIBQ_SET(Q, S, true, _qx_small, QUANT_SIB_SMALL_ROWS)

GG_QUANT_KERNELS(QQ8_0, q8_0)
GG_QUANT_KERNELS(QQ4_0, q4_0)
GG_QUANT_KERNELS(QQ4_1, q4_1)
GG_QUANT_QX(QQ4_0, q4_0)
GG_QUANT_QX(QQ4_1, q4_1)
GG_QUANT_VECS(QQ8_0, q8_0)
GG_QUANT_VECS(QQ4_0, q4_0)
GG_QUANT_VECS(QQ4_1, q4_1)
GG_QUANT_VECS(QQ4_K, q4_k)
GG_QUANT_VECS(QQ6_K, q6_k)
GG_QUANT_KERNELS(QQ4_K, q4_k)
GG_QUANT_KERNELS(QQ6_K, q6_k)
