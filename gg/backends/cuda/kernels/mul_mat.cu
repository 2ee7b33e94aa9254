// mul_mat: dst[n, m] = sum_k a[m, k] * b[n, k] per batch (i2, i3), a broadcast over b's dims 2, 3
// by division (GQA: head i2 of b reads head i2 / (b.ne2 / a.ne2) of a). dst is F32 and contiguous.
// Both kernels read arbitrary byte strides, so permuted views of an F16 KV cache work directly.
#include "common.cuh"

// ---- mat-vec (decode): b.ne1 <= 8. `tpr` threads (a power of two <= 32, set by the host from K)
// share one row m of a, so a warp covers 32 / tpr rows: short rows (the K = head_dim rows of an
// attention product over a KV cache) keep every lane busy, long rows (weights) get a whole warp.
// The row is read once and all (up to 8) dot products accumulate from it, so the weights stream
// through exactly once. With `vec` (rows contiguous, 16-byte aligned, K % 8 == 0; checked by the
// host) each thread reads 8 elements per 16-byte load, MMV_BATCH loads in flight.
// Two builds: mul_mat_vec1_* for one column (decode proper: few registers, so the batched loads
// fit at full occupancy) and mul_mat_vec_* for up to 8 columns (one load at a time).
// `r` (F32, dst's shape, or null) is added to the result: the fused mul_mat -> add of a residual
// connection, one launch and one pass over dst less.
// `early` (host: launch.early_loads): the first batch of weight loads goes out before the wait for
// the kernel before (gg_grid_sync), which no step of the plan lets write them: a latency-bound
// product (a small model's) has its first weights on the way while its predecessor finishes, as
// the quantized mat-vecs do (quant.cu mv_run). The same loads and sums in the same order: the
// values are bit-identical either way.
// MMV_NMAX, MMV_BATCH, MMVW_THREADS, MMVW_BATCH, MMVW_NORM_ROWS, MMVW_EPI_ROWS, MMVW_EPI_NARROW_ROWS, MMVW_SHORT_ROWS, MV_SCATTERS, MM_BM and MM_BN come from the
// host (families/matmul.py, as -D).

template <class TA, class TB, int NMAX, int BATCH>
__device__ __forceinline__ void mmv_impl(char* dst, const TDesc& d, const char* a, const TDesc& ad,
                                         const char* b, const TDesc& bd, const char* r, const TDesc& rd, int vec,
                                         int early) {
    const int tpr = blockDim.x, lane = threadIdx.x;
    const i64 m = (i64)blockIdx.x * blockDim.y + threadIdx.y;
    const i64 i2 = blockIdx.y % d.ne[2], i3 = blockIdx.y / d.ne[2];
    // Rows past the end still run (with no loads) so every lane reaches the shuffles below.
    const bool live = m < d.ne[0];
    const i64 r2 = bd.ne[2] / ad.ne[2], r3 = bd.ne[3] / ad.ne[3];
    const char* arow = a + (live ? m : 0) * ad.nb[1] + (i2 / r2) * ad.nb[2] + (i3 / r3) * ad.nb[3];
    const char* bb = b + i2 * bd.nb[2] + i3 * bd.nb[3];
    const int N = (int)d.ne[1];
    const i64 K = live ? ad.ne[0] : 0;
    float acc[NMAX];
#pragma unroll
    for (int n = 0; n < NMAX; ++n) acc[n] = 0.0f;
    if (vec) {
        // BATCH loads of a are issued before any of them is used: that many 16-byte requests
        // per thread in flight is what keeps HBM busy (rows are short, warps are short-lived).
        const i64 chunks = K / 8;
        float av[BATCH][8];
        auto load = [&](i64 c0) {
#pragma unroll
            for (int u = 0; u < BATCH; ++u) {
                const i64 c = c0 + (i64)u * tpr;
                if (c < chunks) ld8_cs<TA>(arow + c * 8 * (i64)sizeof(TA), av[u]);
            }
        };
        if (early) load(lane);
        gg_grid_sync();  // nothing but those weights is read before this
        for (i64 c0 = lane; c0 < chunks; c0 += BATCH * tpr) {
            if (!early || c0 != lane) load(c0);
#pragma unroll
            for (int u = 0; u < BATCH; ++u) {
                const i64 c = c0 + (i64)u * tpr;
                if (c >= chunks) break;
#pragma unroll
                for (int n = 0; n < NMAX; ++n) {
                    if (n < N) {
                        float bv[8];
                        ld8<TB>(bb + n * bd.nb[1] + c * 8 * (i64)sizeof(TB), bv);
#pragma unroll
                        for (int i = 0; i < 8; ++i) acc[n] += av[u][i] * bv[i];
                    }
                }
            }
        }
    } else {
        gg_grid_sync();
#pragma unroll 4
        for (i64 k = lane; k < K; k += tpr) {
            const float av = ld<TA>(arow + k * ad.nb[0]);
#pragma unroll
            for (int n = 0; n < NMAX; ++n) {
                if (n < N) acc[n] += av * ld<TB>(bb + n * bd.nb[1] + k * bd.nb[0]);
            }
        }
    }
#pragma unroll
    for (int n = 0; n < NMAX; ++n) {
        if (n < N) {
            float v = acc[n];
            for (int o = tpr >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (live && lane == 0) {
                if (r) v += *(const float*)(r + m * rd.nb[0] + n * rd.nb[1] + i2 * rd.nb[2] + i3 * rd.nb[3]);
                *(float*)(dst + m * d.nb[0] + n * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]) = v;
            }
        }
    }
}

// ---- wide mat-vec (decode on weights): one column, contiguous 16-byte aligned rows of K >= 8 *
// MMVW_THREADS elements. A block of MMVW_THREADS threads per row, each with MMVW_BATCH 16-byte
// loads in flight, kept as raw words until used (with 2, a K = 4096 F16 row was one round of
// loads; since the first load goes out before the wait, 1 is faster on the H200: families/matmul.py);
// partial sums meet in shared memory. Against mmv_impl's warp per row (scripts/kexp.py, H100):
// [14336 x 4096] F16 44.0 -> 40.6 us; the decode step's wo (4096 x 4096, + residual) 19.8 ->
// 16.9 us in ncu: short rows of work per thread and a whole row's loads at once fill the
// machine even on a short wave of rows. `pre` (no batches): the block's weight row is requested
// into L2 before the wait for the predecessor (the decode step's wo, behind the latency-bound
// flash_combine: wo's step 13.3 -> 12.3 us inside the replayed graph on the H100).

//
// NORM (the planner's rms_norm -> mul -> mul_mat, a decode step's normalized input): b is the raw
// row x, and every block computes W·(x * w) and sum(x^2) over the elements it reads anyway, then
// scales by 1 / sqrt(mean(x^2) + eps): the rms_norm launch and its round trip through memory
// disappear. Reading x and w (32 KB per 4096-row) for every weight row made the vector traffic
// from L2 the limit (44 us instead of 33 for wqkv, H100), so that build takes several weight
// rows per block (MMVW_NORM_ROWS; MMVW_EPI_ROWS / _NARROW_ROWS with the epilogue): each x and w element loaded
// serves all of them.
//
// EPI (the planner's epilogue fusion: a decode step's QKV product with the rope and the KV-cache
// writes that read it): the rows are finished by mv_epilogue below instead of a plain store.
//
// Epilogue of a one-token product (all fields 8 bytes: lower.py packs it as words). Product rows
// [lo, lo + n) are roped in heads of hd into `rope`; a rotated pair is always two rows of one block
// (MMVW_EPI_ROWS rows, MMVW_EPI_NARROW_ROWS in the narrow builds): NORMAL's (2i, 2i + 1) are adjacent rows anyway, and with `neox` the block
// that owns pair slots i.. of a head computes rows i.. and i + n_dims/2.. of it instead (mv_rows), so both modes
// rotate in registers with no exchange between blocks. Each scatter s is a set_rows of product rows [s.lo, s.lo + s.n), raw or
// roped: element e goes to row idx[e / per], column e % per of s.dst (a KV cache). An index out of
// range writes nothing and reports `code` through `err`, as rows.cu's set_rows does.
struct MvScatter {
    char* dst;
    const char* idx;
    i64 lo, n, per, roped, dt, nrows, nb0, nb1;
};
struct MvEpi {
    char* rope;
    const char* pos;
    const double* freqs;
    i64 lo, n, hd, n_dims, neox;
    int* err;
    i64 code;
    MvScatter s[MV_SCATTERS];
};

// The inputs of row m's epilogue (position, frequency, cache rows), all requested at once before
// the block's partial sums meet: each was a separate round trip at the end of every block, which
// holds the block's slot on the SM with one warp and no weight load in flight.
struct MvPre {
    double f;
    int p, t[2];
};

// The rows of the block of R (even) rows starting at m0 (a multiple of R), as epilogue.cuh's
// epi_rows lays out a sibling block: block row rr is product row r0 + rr, plus `jump` for rr >=
// split. NORMAL (and no rope): m0 .. m0 + R - 1, whose pairs (2i, 2i + 1) are rows rr, rr ^ 1
// (split = R). In a NEOX rope's first n_dims dims of a head the block at column c takes pair slots
// c/2 .. c/2 + R/2 - 1 and their partners n_dims/2 further (split = R/2): a bijection on those dims
// when R divides head_dim and n_dims (families/matmul.py _epi_rope); the dims past n_dims keep
// their adjacent pairs.
__device__ __forceinline__ void mv_rows(const MvEpi& e, i64 m0, int R, i64& r0, int& split, i64& jump) {
    const i64 j = m0 - e.lo;
    if (!e.neox || !e.rope || j < 0 || j >= e.n) return;
    const int c = (int)j % (int)e.hd;  // 32-bit: a 64-bit modulo is a ~70-instruction routine
    if (c < (int)e.n_dims) {
        r0 = m0 - c + c / 2;
        split = R / 2;
        jump = e.n_dims / 2 - R / 2;
    }
}

__device__ __forceinline__ void mv_epi_load(const MvEpi& e, i64 m, MvPre& r) {
    const i64 j = m - e.lo;
    if (e.rope && j >= 0 && j < e.n) {
        const int c = (int)j % (int)e.hd, half = (int)e.n_dims / 2;
        r.p = *(const int*)e.pos;
        // theta index: NORMAL's pair (2i, 2i + 1) and NEOX's (i, i + half) both rotate by freqs[i]
        r.f = c < e.n_dims ? e.freqs[e.neox ? (c < half ? c : c - half) : c / 2] : 0.0;
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const MvScatter& s = e.s[k];
        const i64 i = m - s.lo;
        if (s.dst && i >= 0 && i < s.n) r.t[k] = *(const int*)(s.idx + ((int)i / (int)s.per) * (i64)sizeof(int));
    }
}

// Row m's value v (x0, x1: the raw values of its rope pair, odd: m is the pair's second row).
__device__ __forceinline__ void mv_epilogue(const MvEpi& e, const MvPre& pre, char* raw, i64 m, float v, float x0,
                                            float x1, bool odd) {
    if (raw) *(float*)raw = v;  // the product itself, where a step after this one reads it
    float y = v;
    const i64 j = m - e.lo;
    if (e.rope && j >= 0 && j < e.n) {
        if ((int)j % (int)e.hd < e.n_dims) {
            float sn, cs;
            rope_sincos((double)pre.p, pre.f, sn, cs);
            y = rope_rotate(x0, x1, sn, cs, odd);
        }
        *(float*)(e.rope + j * (i64)sizeof(float)) = y;
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const MvScatter& s = e.s[k];
        const i64 i = m - s.lo;
        if (!s.dst || i < 0 || i >= s.n) continue;
        const i64 t = pre.t[k];  // (set by mv_epi_load for exactly these rows)
        if (t < 0 || t >= s.nrows) {
            report_error(e.err, (int)e.code);
            continue;
        }
        st_dt(s.dst + t * s.nb1 + ((int)i % (int)s.per) * s.nb0, s.roped ? y : v, (int)s.dt);
    }
}

// THREADS: the block (MMVW_THREADS, or fewer for the normalizing builds of short rows such as a
// 576-element embedding, where 256 threads would mostly idle: every thread keeps at least one load).
template <class TA, class TB, bool NORM, int ROWS, bool EPI = false, int THREADS = MMVW_THREADS>
__device__ __forceinline__ void mmvw_impl(char* dst, const TDesc& d, const char* a, const TDesc& ad, const char* b,
                                          const TDesc& bd, const char* r, const TDesc& rd, const char* nw = nullptr,
                                          float eps = 0.0f, const MvEpi* epi = nullptr, int early = 0) {
    static_assert(!EPI || (NORM && ROWS % 2 == 0), "the epilogue ropes pairs of the block's rows");
    constexpr int G = 16 / (int)sizeof(TA);  // elements per 16-byte load of a
    __shared__ float part[ROWS + NORM][THREADS / 32];
    const i64 m0 = (i64)blockIdx.x * ROWS;
    const int nrows = ROWS == 1 ? 1 : (int)min((i64)ROWS, d.ne[0] - m0);
    i64 r0 = m0, jump = 0;  // block row rr is product row r0 + rr (+ jump for rr >= split)
    int split = ROWS;
    if constexpr (EPI) mv_rows(*epi, m0, ROWS, r0, split, jump);
    auto row_of = [&](int rr) -> i64 { return r0 + rr + (rr >= split ? jump : 0); };
    // 32-bit index math, and none without batches: four 64-bit divisions (software, ~70
    // instructions each) ahead of the first load cost a short wave of rows 3.5 us (4096 rows).
    unsigned i2 = 0, i3 = 0, j2 = 0, j3 = 0;
    if (gridDim.y > 1) {
        i2 = blockIdx.y % (unsigned)d.ne[2];
        i3 = blockIdx.y / (unsigned)d.ne[2];
        j2 = i2 / ((unsigned)bd.ne[2] / (unsigned)ad.ne[2]);
        j3 = i3 / ((unsigned)bd.ne[3] / (unsigned)ad.ne[3]);
    }
    const char* arow = a + r0 * ad.nb[1] + j2 * ad.nb[2] + j3 * ad.nb[3];
    const i64 jstep = jump * ad.nb[1];
    const char* brow = b + i2 * bd.nb[2] + i3 * bd.nb[3];
    const int chunks = (int)(ad.ne[0] / G);
    float acc[ROWS], ss = 0.0f;
#pragma unroll
    for (int rr = 0; rr < ROWS; ++rr) acc[rr] = 0.0f;
    V16 av[ROWS][MMVW_BATCH];
    auto load = [&](int c0) {
#pragma unroll
        for (int rr = 0; rr < ROWS; ++rr)
#pragma unroll
            for (int u = 0; u < MMVW_BATCH; ++u) {
                const int c = c0 + u * THREADS;
                if (c < chunks && rr < nrows) av[rr][u] = ld16_cs(arow + rr * ad.nb[1] + (rr >= split ? jstep : 0) + (i64)c * 16);
            }
    };
    const int first = threadIdx.x;
    if (early) load(first);  // as mmv_impl's `early`
    gg_grid_sync();
    for (int c0 = first; c0 < chunks; c0 += MMVW_BATCH * THREADS) {
        if (!early || c0 != first) load(c0);
#pragma unroll
        for (int u = 0; u < MMVW_BATCH; ++u) {
            const int c = c0 + u * THREADS;
            if (c < chunks) {
                float x[G];
                if (G == 8) ld8<TB>(brow + (i64)c * 8 * (i64)sizeof(TB), x);
                else ldg<TB, 4>(brow + (i64)c * 4 * (i64)sizeof(TB), x);
                if constexpr (NORM) {
                    float nv[G];
                    if constexpr (G == 8) ld8<float>(nw + (i64)c * 32, nv);
                    else ldg<float, 4>(nw + (i64)c * 16, nv);
#pragma unroll
                    for (int i = 0; i < G; ++i) {
                        ss += x[i] * x[i];
                        x[i] *= nv[i];
                    }
                }
#pragma unroll
                for (int rr = 0; rr < ROWS; ++rr) {
                    if (rr < nrows) {
                        float w[G];
                        unpack16<TA>(av[rr][u], w);
#pragma unroll
                        for (int i = 0; i < G; ++i) acc[rr] += w[i] * x[i];
                    }
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < ROWS; ++rr) acc[rr] = warp_sum(acc[rr]);
    if constexpr (NORM) ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int rr = 0; rr < ROWS; ++rr) part[rr][threadIdx.x >> 5] = acc[rr];
        if constexpr (NORM) part[ROWS][threadIdx.x >> 5] = ss;
    }
    MvPre pre;
    float res = 0.0f;  // the residual, requested before the barrier too (one round trip less at the end)
    if ((int)threadIdx.x < nrows) {
        if constexpr (EPI) mv_epi_load(*epi, row_of(threadIdx.x), pre);
        if (r) res = *(const float*)(r + row_of(threadIdx.x) * rd.nb[0] + i2 * rd.nb[2] + i3 * rd.nb[3]);
    }
    __syncthreads();
    if ((int)threadIdx.x < nrows) {  // thread rr writes row row_of(rr)
        const int rr = threadIdx.x;
        const i64 m = row_of(rr);
        float v = 0.0f, sq = 0.0f;
#pragma unroll
        for (int i = 0; i < THREADS / 32; ++i) {
            v += part[rr][i];
            if constexpr (NORM) sq += part[ROWS][i];
        }
        float scale = 1.0f;
        if constexpr (NORM) scale = 1.0f / sqrtf(sq / (float)ad.ne[0] + eps);  // as kernels/norm.cu
        v *= scale;
        if constexpr (EPI) {  // the pair partner's sum, in the same order as its own thread's
            const bool odd = split == ROWS ? (rr & 1) : rr >= split;
            const int partner = split == ROWS ? rr ^ 1 : odd ? rr - split : rr + split;
            float w = 0.0f;
#pragma unroll
            for (int i = 0; i < THREADS / 32; ++i) w += part[partner][i];
            w *= scale;
            mv_epilogue(*epi, pre, dst ? dst + m * d.nb[0] : nullptr, m, v, odd ? w : v, odd ? v : w, odd);
            return;
        }
        if (r) v += res;
        *(float*)(dst + m * d.nb[0] + i2 * d.nb[2] + i3 * d.nb[3]) = v;
    }
}

// ---- tiled GEMM for everything else without cuBLAS (attention products on strided cache
// views, GQA, or no nvmath): 64x64 output tile per block of 256 threads, 4x4 per thread, K in
// steps of 16 through shared memory, fp32 accumulation.
#define MM_BK 16

template <class TA, class TB>
__device__ __forceinline__ void mm_impl(char* dst, const TDesc& d, const char* a, const TDesc& ad,
                                        const char* b, const TDesc& bd) {
    __shared__ float As[MM_BK][MM_BM + 4];
    __shared__ float Bs[MM_BK][MM_BN + 4];
    const int tid = threadIdx.x;
    const i64 m0 = (i64)blockIdx.x * MM_BM, n0 = (i64)blockIdx.y * MM_BN;
    const i64 i2 = blockIdx.z % d.ne[2], i3 = blockIdx.z / d.ne[2];
    const i64 r2 = bd.ne[2] / ad.ne[2], r3 = bd.ne[3] / ad.ne[3];
    const char* ab = a + (i2 / r2) * ad.nb[2] + (i3 / r3) * ad.nb[3];
    const char* bbase = b + i2 * bd.nb[2] + i3 * bd.nb[3];
    const i64 M = d.ne[0], N = d.ne[1], K = ad.ne[0];
    const int tx = tid % 16, ty = tid / 16;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (i64 k0 = 0; k0 < K; k0 += MM_BK) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {  // 64 x 16 elements of each operand, 4 per thread
            const int e = tid + 256 * j;
            const int kk = e % MM_BK, rr = e / MM_BK;
            const i64 k = k0 + kk;
            const i64 m = m0 + rr, n = n0 + rr;
            As[kk][rr] = (m < M && k < K) ? ld<TA>(ab + m * ad.nb[1] + k * ad.nb[0]) : 0.0f;
            Bs[kk][rr] = (n < N && k < K) ? ld<TB>(bbase + n * bd.nb[1] + k * bd.nb[0]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < MM_BK; ++kk) {
            float av[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) av[i] = As[kk][tx + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][ty + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const i64 m = m0 + tx + 16 * i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const i64 n = n0 + ty + 16 * j;
            if (m < M && n < N)
                *(float*)(dst + m * d.nb[0] + n * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]) = acc[i][j];
        }
    }
}

#define GG_MM(TA, SA, TB, SB)                                                                             \
    extern "C" __global__ void mul_mat_vec_##SA##_##SB(char* dst, TDesc d, const char* a, TDesc ad,       \
                                                       const char* b, TDesc bd, const char* r, TDesc rd,  \
                                                       int vec, int early) {                              \
        mmv_impl<TA, TB, MMV_NMAX, 1>(dst, d, a, ad, b, bd, r, rd, vec, early);                           \
    }                                                                                                     \
    extern "C" __global__ void mul_mat_vec1_##SA##_##SB(char* dst, TDesc d, const char* a, TDesc ad,      \
                                                        const char* b, TDesc bd, const char* r, TDesc rd, \
                                                        int vec, int early) {                             \
        mmv_impl<TA, TB, 1, MMV_BATCH>(dst, d, a, ad, b, bd, r, rd, vec, early);                          \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(MMVW_THREADS)                                            \
        mul_mat_vecw_##SA##_##SB(char* dst, TDesc d, const char* a, TDesc ad, const char* b, TDesc bd,   \
                                 const char* r, TDesc rd, int pre, int early) {                           \
        gg_l2_prefetch(pre ? a + blockIdx.x * ad.nb[1] : nullptr, ad.ne[0] * (i64)sizeof(TA));          \
        mmvw_impl<TA, TB, false, 1>(dst, d, a, ad, b, bd, r, rd, nullptr, 0.0f, nullptr, early);          \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(256)                                                     \
        mul_mat_tiled_##SA##_##SB(char* dst, TDesc d, const char* a, TDesc ad, const char* b, TDesc bd) { \
        gg_grid_sync();                                                                                   \
        mm_impl<TA, TB>(dst, d, a, ad, b, bd);                                                            \
    }

// W (any float dtype) · (rms_norm(x) * w) for an F32 row x: see mmvw_impl's NORM. FN: the symbol,
// T threads, R weight rows per block.
#define GG_MM_NORM_FN(FN, TA, T, R)                                                                       \
    extern "C" __global__ void __launch_bounds__(T)                                                       \
        FN(char* dst, TDesc d, const char* a, TDesc ad, const char* x, TDesc xd, const char* nw, float eps, \
           int early) {                                                                                   \
        mmvw_impl<TA, float, true, R, false, T>(dst, d, a, ad, x, xd, nullptr, d, nw, eps, nullptr, early); \
    }
// NAME is mul_mat_vecw (MMVW_THREADS threads) or mul_mat_vecw<T> (T threads, short rows); with the
// epilogue too.
#define GG_MM_NORM_T(TA, SA, NAME, T)                                                                     \
    GG_MM_NORM_FN(NAME##_norm_##SA##_f32, TA, T, MMVW_NORM_ROWS)                                          \
    extern "C" __global__ void __launch_bounds__(T)                                                       \
        NAME##_norm_epi_##SA##_f32(char* dst, TDesc d, const char* a, TDesc ad, const char* x, TDesc xd,  \
                                   const char* nw, float eps, MvEpi epi, int early) {                     \
        mmvw_impl<TA, float, true, (T >= MMVW_THREADS ? MMVW_EPI_ROWS : MMVW_EPI_NARROW_ROWS), true, T>(       \
            dst, d, a, ad, x, xd, nullptr, d, nw, eps, &epi, early);                                      \
    }
// Short rows without an epilogue (a small model's output head: 49152 rows of 576): MMVW_SHORT_ROWS
// weight rows per block, so the x and w loads every block repeats stay well below the weights'.
#define GG_MM_NORM_SHORT(TA, SA, NAME, T) GG_MM_NORM_FN(NAME##_norm_rows_##SA##_f32, TA, T, MMVW_SHORT_ROWS)
#define GG_MM_NORM(TA, SA)                                                                                \
    GG_MM_NORM_T(TA, SA, mul_mat_vecw, MMVW_THREADS)                                                      \
    GG_MM_NORM_T(TA, SA, mul_mat_vecw128, 128)                                                            \
    GG_MM_NORM_T(TA, SA, mul_mat_vecw64, 64)                                                              \
    GG_MM_NORM_T(TA, SA, mul_mat_vecw32, 32)                                                              \
    GG_MM_NORM_SHORT(TA, SA, mul_mat_vecw128, 128)                                                        \
    GG_MM_NORM_SHORT(TA, SA, mul_mat_vecw64, 64)                                                          \
    GG_MM_NORM_SHORT(TA, SA, mul_mat_vecw32, 32)

#define GG_MM_B(TA, SA) GG_MM(TA, SA, float, f32) GG_MM(TA, SA, f16, f16) GG_MM(TA, SA, bf16, bf16) GG_MM_NORM(TA, SA)
GG_MM_B(float, f32)
GG_MM_B(f16, f16)
GG_MM_B(bf16, bf16)
