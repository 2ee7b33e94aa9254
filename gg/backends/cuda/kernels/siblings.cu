// Sibling mat-vecs (gg/graph/siblings.py): up to SIB_MAX products W_j · x of the same F32 row x in
// one launch, each written to its own output, optionally normalizing x on the way in and, for two
// products, writing act(W_g · x) * (W_u · x) instead of either product (the SwiGLU epilogue).
//
// The structure is the wide mat-vec's (mul_mat.cu mmvw_impl): a block of up to SIB_THREADS
// threads per SIB_ROWS weight rows (SIB_ACT_ROWS rows of each of the two for SwiGLU), 16-byte
// streamed loads of the weights, SIB_BATCH loads of each row in flight per thread, partial sums meeting in shared memory. The grid is the products'
// blocks one after another (SibMember.block0: a product's first block); a SwiGLU block takes the
// same row of the gate and of the up weights, so both sums meet in the block that writes the row.
//
// NORM: x is the raw row and nw the norm's weight; every block computes sum(x^2) over the
// elements it reads anyway and scales its sums by 1 / sqrt(mean(x^2) + eps) (as norm.cu): the
// rms_norm -> mul step that made the products' input disappears. Several rows per block share
// every x (and nw) element loaded: the vector traffic from L2 shrinks with them.
//
// EPI (the planner's epilogue fusion over a sibling step: llama.cpp's separate Wq/Wk/Wv of a decode
// token with rope(q), rope(k) and the K/V cache writes): each finished row also goes through
// sib_epilogue (epilogue.cuh), and a product with no reader after the step is never stored. A
// rotated pair is always two rows of the block, laid out by epi_rows: NORMAL's (2i, 2i + 1) are
// adjacent rows anyway; NEOX's (i, i + n_dims/2) are given to the block of pair slot i. The
// 256-thread build takes SIB_EPI_ROWS rows a block (the x and norm-weight loads serve all of
// them), the `_narrow` build 2 (short rows have few blocks to lose); the host picks per step.
// `early` (host: launch.early_loads): the first batch of weight loads before the wait for the
// kernel before, as mul_mat.cu's mat-vecs (bit-identical values either way).
// The epilogue's inputs (position, frequencies, cache rows: sib_epi_load) are requested before the
// block's barrier, while the other warps finish their sums (0.2-0.6 us of the 8-row F16 QKV step
// of bench_forms' llama.cpp forms, H200).
// The same epilogue also runs as a step of its own (sib_epilogue_rows_f32, at the end) over rows a
// product's step wrote, where that step has none (block-quantized weights).
// SIB_MAX, SIB_EPI_MAX, SIB_ROWS, SIB_ACT_ROWS, SIB_EPI_ROWS, SIB_THREADS, SIB_BATCH,
// SIB_EPI_STEP_THREADS, SIB_ROPES and SIB_WRITES come from the host (families/siblings.py, as -D).
#include "epilogue.cuh"

// All fields 8 bytes: the host packs the set as words.
struct SibMember {
    const char* a;   // the weights: rows of K elements, nb1 bytes apart
    i64 nb1;
    char* out;       // F32, contiguous (SwiGLU: the gate's entry holds the result's address)
    i64 rows;
    i64 block0;      // this product's first block
};
// N member slots: SIB_MAX for the plain builds, SIB_EPI_MAX for the epilogue builds (a QKV is 3
// products; every slot is a step of sib_pick and five parameter words before the first load).
template <int N> struct SibSetN {
    i64 n, K;
    SibMember m[N];
};
using SibSet = SibSetN<SIB_MAX>;
using SibEpiSet = SibSetN<SIB_EPI_MAX>;

enum { SIB_NONE = 0, SIB_SILU = 1, SIB_GELU = 2 };

template <int ACT> __device__ __forceinline__ float sib_act(float v) {
    if (ACT == SIB_SILU) return v / (1.0f + expf(-v));  // as unary.cu
    const float k = 0.7978845608028654f;               // sqrt(2 / pi)
    return 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
}

// The product this block works on, with constant indices only: a kernel parameter indexed by a
// run-time value would be copied to local memory first.
struct SibPick {
    const char* a;
    i64 nb1, rows, m0;
    char* out;
    int member;
};
template <int N> __device__ __forceinline__ SibPick sib_pick(const SibSetN<N>& s, int per_block) {
    SibPick p{s.m[0].a, s.m[0].nb1, s.m[0].rows, 0, s.m[0].out, 0};
    i64 b0 = 0;
#pragma unroll
    for (int i = 1; i < N; ++i) {
        if (i < s.n && (i64)blockIdx.x >= s.m[i].block0) {
            p = SibPick{s.m[i].a, s.m[i].nb1, s.m[i].rows, 0, s.m[i].out, i};
            b0 = s.m[i].block0;
        }
    }
    p.m0 = ((i64)blockIdx.x - b0) * per_block;
    return p;
}

// A block's row layout: block row rr is member row r0 + rr, plus `jump` for rr >= split (epi_rows;
// without the epilogue the R rows from m0).
struct SibRows {
    i64 r0, jump;
    int split;
    __device__ __forceinline__ i64 row(int rr) const { return r0 + rr + (rr >= split ? jump : 0); }
};
template <int R, bool EPI>
__device__ __forceinline__ SibRows sib_rows(const SibPick& p, const SibEpi* epi) {
    SibRows l{p.m0, 0, R};
    if constexpr (EPI) epi_rows(*epi, p.member, p.m0, R, l.r0, l.split, l.jump);
    return l;
}

// Before the wait for the predecessor: the block's weight rows into L2 (nothing else is read),
// where the host asks for it (siblings.L2_PREFETCH: off since it measured slower on the H200).
// Not in the epilogue builds (the stacked norm_epi mat-vec of mul_mat.cu never had one either):
// with it bench_forms' llama.cpp form took 77.7 us, without 72.4 (docs/performance.md,
// twenty-fifth session).
template <class TA, int ACT, int R>
__device__ __forceinline__ void sib_l2_prefetch(const SibSet& s, int pre) {
    if (!pre) return;
    constexpr int W = ACT ? 2 : 1;
    const SibPick p = sib_pick(s, R);
    const i64 bytes = s.K * (i64)sizeof(TA);
    for (int rr = 0; rr < R && p.m0 + rr < p.rows; ++rr) {
        gg_l2_prefetch(p.a + (p.m0 + rr) * p.nb1, bytes);
        if (W == 2) gg_l2_prefetch(s.m[1].a + (p.m0 + rr) * s.m[1].nb1, bytes);
    }
}

// Rows of each weight matrix a block of the build without the epilogue reads.
__host__ __device__ constexpr int sib_plain_rows(int act) { return act ? SIB_ACT_ROWS : SIB_ROWS; }

// R: rows of each weight matrix a block reads.
template <class TA, bool NORM, int ACT, int R, bool EPI = false, int N>
__device__ __forceinline__ void sib_impl(const SibSetN<N>& s, const char* x, const char* nw, float eps, int early,
                                         const SibEpi* epi = nullptr) {
    static_assert(!EPI || (ACT == SIB_NONE && R % 2 == 0), "the epilogue ropes pairs of the block's rows");
    constexpr int G = 16 / (int)sizeof(TA);  // elements per 16-byte load of the weights
    constexpr int W = ACT ? 2 : 1;           // weight matrices a block reads (gate and up)
    __shared__ float part[W * R + NORM][SIB_THREADS / 32];
    const SibPick p = sib_pick(s, R);
    const int nrows = (int)min((i64)R, p.rows - p.m0);
    const SibRows l = sib_rows<R, EPI>(p, epi);
    const char* arow[W];
    i64 nb1[W], jstep[W];
    arow[0] = p.a + l.r0 * p.nb1;
    nb1[0] = p.nb1;
    jstep[0] = l.jump * p.nb1;
    if constexpr (W == 2) {
        arow[1] = s.m[1].a + p.m0 * s.m[1].nb1;
        nb1[1] = s.m[1].nb1;
        jstep[1] = 0;
    }
    const int chunks = (int)(s.K / G), nt = (int)blockDim.x;
    float acc[W][R], ss = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w)
#pragma unroll
        for (int rr = 0; rr < R; ++rr) acc[w][rr] = 0.0f;
    V16 av[W][R][SIB_BATCH];
    auto load = [&](int c0) {
#pragma unroll
        for (int w = 0; w < W; ++w)
#pragma unroll
            for (int rr = 0; rr < R; ++rr)
#pragma unroll
                for (int u = 0; u < SIB_BATCH; ++u) {
                    const int c = c0 + u * nt;
                    if (c < chunks && rr < nrows)
                        av[w][rr][u] = ld16_cs(arow[w] + rr * nb1[w] + (rr >= l.split ? jstep[w] : 0) + (i64)c * 16);
                }
    };
    const int first = threadIdx.x;
    if (early) load(first);
    gg_grid_sync();  // nothing but those weights is read before this
    for (int c0 = first; c0 < chunks; c0 += SIB_BATCH * nt) {
        if (!early || c0 != first) load(c0);
#pragma unroll
        for (int u = 0; u < SIB_BATCH; ++u) {
            const int c = c0 + u * nt;
            if (c >= chunks) break;
            float xv[G];
            if constexpr (G == 8) ld8<float>(x + (i64)c * 32, xv);
            else ldg<float, 4>(x + (i64)c * 16, xv);
            if constexpr (NORM) {
                float nv[G];
                if constexpr (G == 8) ld8<float>(nw + (i64)c * 32, nv);
                else ldg<float, 4>(nw + (i64)c * 16, nv);
#pragma unroll
                for (int i = 0; i < G; ++i) {
                    ss += xv[i] * xv[i];
                    xv[i] *= nv[i];
                }
            }
#pragma unroll
            for (int w = 0; w < W; ++w)
#pragma unroll
                for (int rr = 0; rr < R; ++rr) {
                    if (rr < nrows) {
                        float wv[G];
                        unpack16<TA>(av[w][rr][u], wv);
#pragma unroll
                        for (int i = 0; i < G; ++i) acc[w][rr] += wv[i] * xv[i];
                    }
                }
        }
    }
#pragma unroll
    for (int w = 0; w < W; ++w)
#pragma unroll
        for (int rr = 0; rr < R; ++rr) acc[w][rr] = warp_sum(acc[w][rr]);
    if constexpr (NORM) ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int w = 0; w < W; ++w)
#pragma unroll
            for (int rr = 0; rr < R; ++rr) part[w * R + rr][threadIdx.x >> 5] = acc[w][rr];
        if constexpr (NORM) part[W * R][threadIdx.x >> 5] = ss;
    }
    SibPre pre;  // (EPI) requested while the other warps finish, as mul_mat.cu's MvPre
    if constexpr (EPI)
        if ((int)threadIdx.x < nrows) sib_epi_load(*epi, p.member, l.row(threadIdx.x), pre);
    __syncthreads();
    if ((int)threadIdx.x < nrows) {  // thread rr writes row m0 + rr
        const int rr = threadIdx.x, warps = nt >> 5;
        float v[W], sq = 0.0f;
#pragma unroll
        for (int w = 0; w < W; ++w) v[w] = 0.0f;
        for (int i = 0; i < warps; ++i) {
#pragma unroll
            for (int w = 0; w < W; ++w) v[w] += part[w * R + rr][i];
            if constexpr (NORM) sq += part[W * R][i];
        }
        float scale = 1.0f;
        if constexpr (NORM) scale = 1.0f / sqrtf(sq / (float)s.K + eps);  // as kernels/norm.cu
        float y = v[0] * scale;
        const i64 m = l.row(rr);
        if constexpr (EPI) {  // the pair partner's sum, in the same order as its own thread's
            bool second;
            const int partner = epi_partner(rr, l.split, R, second);
            float o = 0.0f;
            for (int i = 0; i < warps; ++i) o += part[partner][i];
            o *= scale;
            sib_epilogue(*epi, pre, p.member, p.out ? p.out + m * (i64)sizeof(float) : nullptr, m, y, second ? o : y,
                         second ? y : o, second);
            return;
        }
        if constexpr (ACT != SIB_NONE) y = sib_act<ACT>(y) * (v[W - 1] * scale);
        if (p.out) *(float*)(p.out + m * (i64)sizeof(float)) = y;
    }
}

#define GG_SIB(TA, SA, NORM, ACT, NAME)                                                                  \
    extern "C" __global__ void __launch_bounds__(SIB_THREADS)                                            \
        mul_mat_sib##NAME##_##SA##_f32(SibSet s, const char* x, const char* nw, float eps, int pre,     \
                                       int early) {                                                      \
        sib_l2_prefetch<TA, ACT, sib_plain_rows(ACT)>(s, pre);                                           \
        sib_impl<TA, NORM, ACT, sib_plain_rows(ACT)>(s, x, nw, eps, early);                              \
    }

// With the epilogue (no activation), R rows a block: see EPI above.
#define GG_SIB_EPI(TA, SA, NORM, NAME, R, WIDTH)                                                          \
    extern "C" __global__ void __launch_bounds__(SIB_THREADS)                                            \
        mul_mat_sib##NAME##_epi_##SA##_f32##WIDTH(SibEpiSet s, const char* x, const char* nw, float eps,  \
                                                  SibEpi epi, int early) {                                \
        sib_impl<TA, NORM, SIB_NONE, R, true>(s, x, nw, eps, early, &epi);                               \
    }

#define GG_SIB_ALL(TA, SA)                          \
    GG_SIB_EPI(TA, SA, false, , SIB_EPI_ROWS, )     \
    GG_SIB_EPI(TA, SA, true, _norm, SIB_EPI_ROWS, ) \
    GG_SIB_EPI(TA, SA, false, , 2, _narrow)         \
    GG_SIB_EPI(TA, SA, true, _norm, 2, _narrow)     \
    GG_SIB(TA, SA, false, SIB_NONE, )               \
    GG_SIB(TA, SA, true, SIB_NONE, _norm)           \
    GG_SIB(TA, SA, false, SIB_SILU, _silu)          \
    GG_SIB(TA, SA, true, SIB_SILU, _norm_silu)      \
    GG_SIB(TA, SA, false, SIB_GELU, _gelu)          \
    GG_SIB(TA, SA, true, SIB_GELU, _norm_gelu)
GG_SIB_ALL(float, f32)
GG_SIB_ALL(f16, f16)
GG_SIB_ALL(bf16, bf16)

// ---- the epilogue as a step of its own (families/siblings.py EpiRows) ------------------------------
// The rope and K/V cache writes of rows an earlier step computed (a product whose step has no
// epilogue: block-quantized weights), in one launch instead of one a node: a thread a row, which
// reads its value and its rope partner's from the member vector and sends them through
// sib_epilogue as the products' own epilogue would. Members: up to SIB_EPI_MAX F32 vectors.
struct EpiSrcs {
    const float* p[SIB_EPI_MAX];
    i64 n[SIB_EPI_MAX];
};
// `early`: the position, frequencies and set_rows indices may be read before the wait (the host
// found nothing in the plan writing them).
__device__ __forceinline__ void epi_rows_impl(const EpiSrcs& s, const SibEpi& e, int early) {
    i64 m = (i64)blockIdx.x * SIB_EPI_STEP_THREADS + threadIdx.x;
    const float* src = s.p[0];
    i64 n = s.n[0];
    int member = 0;
#pragma unroll
    for (int k = 1; k < SIB_EPI_MAX; ++k)  // constant indices only (see sibq_impl)
        if (member == k - 1 && m >= n) {
            m -= n;
            src = s.p[k];
            n = s.n[k];
            member = k;
        }
    const bool live = m < n;
    SibPre pre;
    if (live && early) sib_epi_load(e, member, m, pre);
    gg_grid_wait();
    gg_launch_dependents();
    if (!live) return;
    if (!early) sib_epi_load(e, member, m, pre);
    const float v = src[m];
    float x0 = v, x1 = v;
    bool second = false;
#pragma unroll
    for (int k = 0; k < SIB_ROPES; ++k) {  // the rope holding row m (ropes of a vector hold disjoint rows)
        const SibRope& r = e.r[k];
        const i64 j = m - r.lo;
        if (!r.n || r.member != member || j < 0 || j >= r.n) continue;
        const int c = (int)j % (int)r.hd, half = (int)r.n_dims / 2;
        if (c >= (int)r.n_dims) continue;
        second = r.neox ? c >= half : (c & 1);
        const i64 other = r.neox ? (second ? m - half : m + half) : (second ? m - 1 : m + 1);
        (second ? x0 : x1) = src[other];
    }
    sib_epilogue(e, pre, member, nullptr, m, v, x0, x1, second);
}

extern "C" __global__ void __launch_bounds__(SIB_EPI_STEP_THREADS) sib_epilogue_rows_f32(EpiSrcs s, SibEpi e,
                                                                                        int early) {
    epi_rows_impl(s, e, early);
}
