// Block-quantized weights (ggml's Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) read in place: row dequantization
// (get_rows, and F16 weights for a cuBLAS prefill GEMM) and the decode mat-vec with F32
// activations. Layouts and launch geometry: docs/quantization.md.
//
// Every kernel stages a "tile" of a row (a whole number of blocks, a multiple of 16 bytes) from
// global memory into its warp's slice of shared memory with coalesced 16-byte streaming loads
// (blocks of 34, 18 or 210 bytes straddle any 16-byte grid, so decoding straight from registers
// would need unaligned loads), then each lane decodes "units" of 16 elements from there. The
// mat-vec fetches the next tile into registers before decoding the current one: a warp keeps up
// to 1.7 KB of weights in flight while it computes, and each weight byte is read exactly once.
//
// Dequantization is bit-identical to gg.quant.dequantize (and gguf's numpy code): each value is
// computed with the same float32 operations in the same order, every rounding explicit (__fmul_rn
// and __fadd_rn are never contracted into an FMA). The mat-vec uses FMAs (F32 accumulation).
#include "common.cuh"

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
    static __device__ __forceinline__ void unit(const u8* blk, int u, float* q, float& a, float& b, int& o1, int& o2) {
        // 8 sub-blocks of 32 with a 6-bit scale and min each, packed in 12 bytes: sub-blocks 0-3
        // in the low 6 bits of bytes 0-3 (scale) and 4-7 (min), 4-7 in the nibbles of bytes
        // 8-11 plus the top 2 bits of bytes 0-3 (scale) and 4-7 (min).
        const int s = u >> 1, lh = u & 1;
        const u8* sc = blk + 4;
        unsigned scale, mn;
        if (s < 4) {
            scale = sc[s] & 63u;
            mn = sc[s + 4] & 63u;
        } else {
            scale = (sc[s + 4] & 15u) | ((unsigned)(sc[s - 4] >> 6) << 4);
            mn = (unsigned)(sc[s + 4] >> 4) | ((unsigned)(sc[s] >> 6) << 4);
        }
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

// ---- mat-vec: y[c * y_stride + r] = sum_k W[r, k] * x[c * x_stride + k], c < ncols <= NMAX ------
// One warp per weight row (QUANT_WARPS rows per thread block); lanes take units of 16 elements
// of the staged tile in turn and accumulate a * dot(q, x) (+ b * sum(x)); one warp reduction per
// column at the end.
template <class Q, int NMAX>
__device__ __forceinline__ void mul_mat_vec_impl(const char* w, i64 w_nb1, const float* x, i64 x_stride, float* y,
                                                 i64 y_stride, i64 n_rows, i64 ne0, int ncols) {
    typedef TileOf<Q> TL;
    __shared__ __align__(16) u8 sm_all[QUANT_WARPS][TL::BYTES];
    u8* sm = sm_all[threadIdx.y];
    const int lane = threadIdx.x;
    const i64 r = (i64)blockIdx.x * QUANT_WARPS + threadIdx.y;
    if (r >= n_rows) return;  // a whole warp: nothing below syncs the block
    const char* row = w + r * w_nb1;
    const i64 nblk = ne0 / Q::QK, ntiles = (nblk + Q::TILE - 1) / Q::TILE;
    const bool wal = aligned16(w, w_nb1), xal = aligned16(x, x_stride * (i64)sizeof(float));
    const int N = NMAX == 1 ? 1 : ncols;
    float acc[NMAX];
#pragma unroll
    for (int c = 0; c < NMAX; ++c) acc[c] = 0.0f;
    V16 buf[TL::VPL];
    if (ntiles > 0) tile_fetch<TL::VPL>(buf, row, (int)min((i64)Q::TILE, nblk) * Q::BYTES, wal, lane);
    for (i64 t = 0; t < ntiles; ++t) {
        const int nb = (int)min((i64)Q::TILE, nblk - t * Q::TILE);
        tile_store<TL::BYTES, TL::VPL>(sm, buf, lane);
        __syncwarp();
        if (t + 1 < ntiles)  // the next tile's loads go out before this one is decoded
            tile_fetch<TL::VPL>(buf, row + (t + 1) * TL::BYTES,
                                (int)min((i64)Q::TILE, nblk - (t + 1) * Q::TILE) * Q::BYTES, wal, lane);
        const float* xt = x + t * (i64)(Q::TILE * Q::QK);
        for (int u = lane; u < nb * Q::UNITS; u += 32) {
            const int blk = u / Q::UNITS;
            float q[16], a, b;
            int o1, o2;
            Q::unit(sm + blk * Q::BYTES, u % Q::UNITS, q, a, b, o1, o2);
#pragma unroll
            for (int c = 0; c < NMAX; ++c) {
                if (c < N) {
                    const float* x1 = xt + c * x_stride + blk * Q::QK + o1;
                    const float* x2 = xt + c * x_stride + blk * Q::QK + o2;
                    float xv[16];
                    if (xal) {
                        ld8<float>((const char*)x1, xv);
                        ld8<float>((const char*)x2, xv + 8);
                    } else {
#pragma unroll
                        for (int i = 0; i < 8; ++i) {
                            xv[i] = x1[i];
                            xv[8 + i] = x2[i];
                        }
                    }
                    float dot = 0.0f, sx = 0.0f;
#pragma unroll
                    for (int i = 0; i < 16; ++i) {
                        dot = fmaf(q[i], xv[i], dot);
                        if (Q::MIN) sx += xv[i];
                    }
                    acc[c] = fmaf(a, dot, acc[c]);
                    if (Q::MIN) acc[c] = fmaf(b, sx, acc[c]);
                }
            }
        }
        __syncwarp();  // every lane is done with the tile before the next one overwrites it
    }
#pragma unroll
    for (int c = 0; c < NMAX; ++c) {
        if (c < N) {
            const float v = warp_sum(acc[c]);
            if (lane == 0) y[c * y_stride + r] = v;
        }
    }
}

// ---- entry points -----------------------------------------------------------------------------
// dequant_rows_<t>_<o>: dst row r (o = f32 | f16) = source row r dequantized.
// get_rows_<t>_<o>: dst row r = source row ids[r].
// mul_mat_vec_<t>_f32: ncols 1..8; mul_mat_vec1_<t>_f32: one column (ncols ignored), fewer
// registers for decode proper.
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
    extern "C" __global__ void mul_mat_vec_##S##_f32(const char* w, i64 w_nb1, const float* x, i64 x_stride,       \
                                                     float* y, i64 y_stride, i64 n_rows, i64 ne0, int ncols) {    \
        gg_grid_sync();                                                                                           \
        mul_mat_vec_impl<Q, 8>(w, w_nb1, x, x_stride, y, y_stride, n_rows, ne0, ncols);                           \
    }                                                                                                             \
    extern "C" __global__ void mul_mat_vec1_##S##_f32(const char* w, i64 w_nb1, const float* x, i64 x_stride,      \
                                                      float* y, i64 y_stride, i64 n_rows, i64 ne0, int ncols) {   \
        gg_grid_sync();                                                                                           \
        mul_mat_vec_impl<Q, 1>(w, w_nb1, x, x_stride, y, y_stride, n_rows, ne0, ncols);                           \
    }

GG_QUANT_KERNELS(QQ8_0, q8_0)
GG_QUANT_KERNELS(QQ4_0, q4_0)
GG_QUANT_KERNELS(QQ4_1, q4_1)
GG_QUANT_KERNELS(QQ4_K, q4_k)
GG_QUANT_KERNELS(QQ6_K, q6_k)
