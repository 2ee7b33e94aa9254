// Fused attention over a KV cache (flash-decoding): out = softmax(post * (cx * K·q + mask)) · V in
// one kernel, for the planner's chains  mul_mat -> scale -> add|diag_mask_inf -> soft_max -> mul_mat
// and  mul_mat -> soft_max_ext -> mul_mat  with few query tokens (decode). The KQ scores never
// reach device memory, and two launches (softmax, second product) disappear.
//
// Shapes (ggml): K (hd, n_kv, n_kv_head), q (hd, T, n_head), V (n_kv, hd, n_kv_head) (the
// transposed cache), out (hd, T, n_head); query head h reads K/V head h / (n_head / n_kv_head).
// One block of FA_THREADS threads per (chunk of positions, NH query heads sharing a K/V head,
// token). The fast builds (flash_attn_*_h<NH>_d<HD>: F16/BF16 caches of head size 64 or 128, K
// and V rows contiguous and 16-byte aligned, as cache views are) know every size at compile
// time: the block copies its K and V tiles of FA_CHUNK positions into shared memory with
// cp.async, all in flight at once (one memory round trip per block), and its loops unroll with
// no index arithmetic left (a first version with run-time sizes was issue-bound at 40% of the
// memory bandwidth). The generic build (flash_attn_*_h1) reads any strides from global memory.
// A block computes its chunk's scores, their max m and sum l, and the unnormalized sum
// o = Σ e^(s - m) V, and writes (m, l, o) to a workspace; flash_combine, launched right after,
// combines the chunks of each row (query head of a token):
//     out = Σ_c e^(m_c - M) o_c / Σ_c e^(m_c - M) l_c,  M = max_c m_c.
// (Combining in the last block of each head group, found with an atomic counter, left a tail of
// a few blocks reading every chunk's o: 20-55% of the kernel's time in ncu.) Heads sharing a K/V
// head are done by one block (GQA), so each cache byte is read once per token.
//
// A chunk whose every position is masked (mask -inf, or past n_past + t) reads neither K nor V:
// an indexed decode graph spans the whole context, and early in a sequence most of it is empty.
// So NaN or inf stored at such positions cannot reach the output (in the unfused chain
// NaN + -inf would poison the row). A fully masked row gives zeros, like the unfused softmax.
#include "common.cuh"

#define FA_THREADS 128
#define FA_WARPS (FA_THREADS / 32)
#define FA_CHUNK 64        // positions per block on the fast path (support.py FLASH_FAST_CHUNK)
#define FA_MAX_CHUNK 256   // support.py FLASH_CHUNKS
#define FA_MAX_HD 256      // support.py FLASH_MAX_HD
#define FA_MAX_SPLITS 1024 // support.py FLASH_MAX_SPLITS: chunks per row (flash_combine keeps their weights)
#define FA_BATCH 16        // chunk results a flash_combine thread loads at once

// Sum acc[0..NH) over an aligned group of W lanes (a power of two >= NH). Reduce-scatter: each
// halving step trades half of the remaining partial sums with the partner lane, so NH sums cost
// NH - 1 + log2(W / NH) shuffles instead of NH * log2(W). A lane ends up with the total of one
// head, returned in `head`; the lanes whose bits below W / NH are zero hold each head once.
template <int NH, int W>
__device__ __forceinline__ float group_sum_scatter(float* acc, int lane, int& head) {
    int base = 0;
#pragma unroll
    for (int n = NH, o = W / 2; n > 1; n >>= 1, o >>= 1) {
        const bool up = (lane & o) != 0;
#pragma unroll
        for (int i = 0; i < n / 2; ++i) {
            const float send = up ? acc[i] : acc[i + n / 2];
            const float keep = up ? acc[i + n / 2] : acc[i];
            acc[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
        if (up) base += n / 2;
    }
    float v = acc[0];
#pragma unroll
    for (int o = W / NH / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    head = base;
    return v;
}

// ---- tensor-core pieces of the fast path (mma.sync m16n8k16, f32 accumulate; sm_80+) ----------
// The fast path computes K·q and P·V as tensor-core products: a warp-wide instruction does 2048
// multiply-adds, so a block's arithmetic shrinks to a few dozen instructions per warp and the
// block spends its time waiting on memory, not issuing (the FMA version issued on ~half of all
// cycles, and its blocks held their shared memory while computing: 70% of DRAM bandwidth).
// The single-row operands (q, and the softmax weights p) are F32; each goes in as two rows of
// the A matrix, hi = TK(x) and lo = TK(x - hi), whose products add up to ~22 bits (F16) or
// ~16 bits (BF16) of x: K and V are exact in TK, so the scores keep F32-level accuracy.
template <class TK> struct Mma;
template <> struct Mma<f16> {
    static __device__ __forceinline__ void run(float* c, const unsigned* a, unsigned b0, unsigned b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ u16 enc(float x) { return f2h(x); }
    static __device__ __forceinline__ float dec(u16 x) { return h2f(x); }
};
template <> struct Mma<bf16> {
    static __device__ __forceinline__ void run(float* c, const unsigned* a, unsigned b0, unsigned b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ u16 enc(float x) { return f2bf(x); }
    static __device__ __forceinline__ float dec(u16 x) { return bf2f(x); }
};

// Row `part` (0: hi, 1: lo) of x as TK bits.
template <class TK> __device__ __forceinline__ unsigned split_part(float x, int part) {
    const u16 hi = Mma<TK>::enc(x);
    return part ? Mma<TK>::enc(x - Mma<TK>::dec(hi)) : hi;
}
template <class TK> __device__ __forceinline__ unsigned split_pair(float x0, float x1, int part) {
    return split_part<TK>(x0, part) | (split_part<TK>(x1, part) << 16);
}

// A fragment of one k-step for the lane's rows g (values x_g) and g + 8 (x_g8; null: zero rows),
// part 0/1 = hi/lo: the step's columns are elements e0 + {0,1} (k = 2t, 2t+1) and e0 + {2,3}
// (k = 2t+8, 2t+9) - the permuted k order that matches one LDS.128 of B per two steps.
template <class TK>
__device__ __forceinline__ void a_frag(unsigned* a, const float* x_g, const float* x_g8, int part, int e0) {
    a[0] = x_g ? split_pair<TK>(x_g[e0], x_g[e0 + 1], part) : 0u;
    a[2] = x_g ? split_pair<TK>(x_g[e0 + 2], x_g[e0 + 3], part) : 0u;
    a[1] = x_g8 ? split_pair<TK>(x_g8[e0], x_g8[e0 + 1], part) : 0u;
    a[3] = x_g8 ? split_pair<TK>(x_g8[e0 + 2], x_g8[e0 + 3], part) : 0u;
}

// Tiles in shared memory: 16-byte piece c of tile row r lives at piece c ^ 4 (r & 1), so the 8
// lanes of an LDS.128 phase (two rows, four pieces each) hit 8 different bank quads.
__device__ __forceinline__ int swz(int r, int c) { return c ^ ((r & 1) << 2); }

struct FaArgs {
    float cx, post;   // score = post * (cx * K·q + mask)
    int n_past;       // >= 0: diag_mask_inf(n_past) instead of a mask tensor
    int chunk;        // positions per block (the generic path; the fast path uses FA_CHUNK)
    int r2, r3;       // query heads (dim-3 batches) per K/V head: n_head / n_kv_head (host-divided)
};

// HD > 0: the fast path for head size HD; HD == 0: the generic path (any head size <= FA_MAX_HD).
template <class TK, int NH, int HD>
__device__ __forceinline__ void flash_impl(char* dst, const TDesc& d, const char* q, const TDesc& qd,
                                           const char* k, const TDesc& kd, const char* v, const TDesc& vd,
                                           const char* mask, const TDesc& md, int mdt, const FaArgs& p,
                                           float* ws) {
    constexpr bool FAST = HD > 0;
    constexpr int SC = FAST ? FA_CHUNK : FA_MAX_CHUNK;
    // dynamic: the K tile [FA_CHUNK][HD] and the V tile [HD][FA_CHUNK] (fast path)
    extern __shared__ __align__(16) char dyn[];
    __shared__ __align__(16) float qs[NH][FAST ? HD : FA_MAX_HD];  // q
    __shared__ __align__(16) float sc[NH][SC];   // the mask, then the scores, then e^(s - m)
    const float NEG_INF = -__int_as_float(0x7f800000);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hd = FAST ? HD : (int)kd.ne[0];
    const int chunk = FAST ? FA_CHUNK : p.chunk;
    const i64 n_kv = kd.ne[1];
    const int T = (int)d.ne[1];
    // 32-bit index arithmetic: a 64-bit division is a ~70-instruction routine.
    const int t = (int)blockIdx.z % T, i3 = (int)blockIdx.z / T;
    const int h0 = (int)blockIdx.y * NH;
    const char* kb = k + (h0 / p.r2) * kd.nb[2] + (i3 / p.r3) * kd.nb[3];
    const char* vb = v + (h0 / p.r2) * vd.nb[2] + (i3 / p.r3) * vd.nb[3];
    const char* qb = q + t * qd.nb[1] + (i64)h0 * qd.nb[2] + i3 * qd.nb[3];
    const int S = (int)gridDim.x, split = (int)blockIdx.x;
    const i64 j0 = (i64)split * chunk;
    const int len = (int)min((i64)chunk, n_kv - j0);
    // workspace: (m, l) per (row, split), then o[hd] per (row, split); row = query head of a token
    const i64 R = (i64)gridDim.z * d.ne[2];
    float* ws_ml = ws;
    float* ws_o = ws + 2 * R * S;
    auto row_of = [&](int hh) -> i64 { return (i64)blockIdx.z * d.ne[2] + h0 + hh; };
    auto diag = [&](i64 j) -> bool { return p.n_past >= 0 && j > (i64)p.n_past + t; };

    for (int e = tid; e < NH * hd; e += FA_THREADS) {
        const int hh = e / hd, c = e - hh * hd;
        qs[hh][c] = ld<float>(qb + c * qd.nb[0] + hh * qd.nb[2]);
    }
    // the chunk's mask values (masks broadcast over heads: usually one row), and whether any
    // position is visible at all
    const char* mbase = mask ? mask + (t % md.ne[1]) * md.nb[1] + (i3 % md.ne[3]) * md.nb[3] : nullptr;
    int visible = !(p.post > 0.0f);  // post <= 0 turns -inf into +inf or NaN: never skip then
    for (int jj = tid; jj < len; jj += FA_THREADS) {
        const i64 j = j0 + jj;
#pragma unroll
        for (int hh = 0; hh < NH; ++hh) {
            const float m = mbase ? ld_dt(mbase + ((unsigned)(h0 + hh) % (unsigned)md.ne[2]) * md.nb[2] + j * md.nb[0],
                                          mdt)
                                  : 0.0f;
            sc[hh][jj] = m;
            visible |= m != NEG_INF && !diag(j);
        }
    }
    visible = __syncthreads_or(visible);

    if (visible) {
        auto score = [&](int hh, int jj, float dot) -> float {
            const float x = diag(j0 + jj) ? NEG_INF : p.cx * dot + sc[hh][jj];
            return p.post * x;
        };
        constexpr int KROW = HD * (int)sizeof(TK), VROW = FA_CHUNK * (int)sizeof(TK);  // tile row bytes
        char* Ks = dyn;
        char* Vs = dyn + FA_CHUNK * KROW;
        // Fast path, mma fragments (PTX ISA, m16n8k16): lane = 4 g + t holds A rows g, g + 8 and
        // B/C columns g (B) / 2t, 2t + 1 (C). A row 2 hh + part is head hh's hi or lo part. The
        // k order inside each 16-wide step is permuted (the sum does not care) so that one LDS.128
        // of 8 consecutive elements feeds the B operand of two steps.
        const int g = lane >> 2, tq = lane & 3;
        if constexpr (FAST) {
            // every K and V byte of the chunk in flight at once (V positions past len zero-filled)
            constexpr int KP = KROW / 16, VP = VROW / 16;  // 16-byte pieces per tile row
#pragma unroll
            for (int i = 0; i < FA_CHUNK * KP / FA_THREADS; ++i) {
                const int e = tid + i * FA_THREADS, r = e / KP, c = e % KP;
                if (r < len) cp_async16(Ks + r * KROW + swz(r, c) * 16, kb + (j0 + r) * kd.nb[1] + c * 16, 16);
            }
            cp_async_commit();
            const char* v0 = vb + j0 * (i64)sizeof(TK);
            const int vlen = len * (int)sizeof(TK);
#pragma unroll
            for (int i = 0; i < HD * VP / FA_THREADS; ++i) {
                const int e = tid + i * FA_THREADS, dd = e / VP, c = e % VP;
                const int n = max(0, min(16, vlen - c * 16));
                cp_async16(Vs + dd * VROW + swz(dd, c) * 16, v0 + dd * vd.nb[1] + (n ? c * 16 : 0), n);
            }
            cp_async_commit();
            // q's A fragments for every step, built while the tiles are in flight
            constexpr int KSTEPS = HD / 16;
            unsigned qa[KSTEPS][4];
            {
                const float* q_lo = (g >> 1) < NH ? qs[g >> 1] : nullptr;
                const float* q_hi = NH > 4 && 4 + (g >> 1) < NH ? qs[(4 + (g >> 1)) % NH] : nullptr;
#pragma unroll
                for (int k = 0; k < KSTEPS; ++k) a_frag<TK>(qa[k], q_lo, q_hi, g & 1, (k >> 1) * 32 + tq * 8 + (k & 1) * 4);
            }
            cp_async_wait<1>();  // the K tile
            __syncthreads();
            // scores: warp w takes positions [16 w, 16 w + 16) as two 8-column tiles
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                const int r = warp * 16 + nt * 8 + g;  // this lane's K row (B column g)
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int k2 = 0; k2 < KSTEPS / 2; ++k2) {
                    const V16 kw = *(const V16*)(Ks + r * KROW + swz(r, k2 * 4 + tq) * 16);
                    Mma<TK>::run(c, qa[2 * k2], kw.w[0], kw.w[1]);
                    Mma<TK>::run(c, qa[2 * k2 + 1], kw.w[2], kw.w[3]);
                }
                // hi + lo rows: lanes g and g ^ 1
#pragma unroll
                for (int i = 0; i < 4; ++i) c[i] += __shfl_xor_sync(0xffffffffu, c[i], 4);
                if ((g & 1) == 0) {
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int hh = (g >> 1) + (i >> 1) * 4, jj = warp * 16 + nt * 8 + tq * 2 + (i & 1);
                        if (hh < NH && jj < len) sc[hh][jj] = score(hh, jj, c[i]);
                    }
                }
            }
        } else {  // any strides, straight from global memory: a warp per K row, lanes over it
            for (int jj = warp; jj < len; jj += FA_WARPS) {
                float acc[NH];
#pragma unroll
                for (int hh = 0; hh < NH; ++hh) acc[hh] = 0.0f;
                const char* kr = kb + (j0 + jj) * kd.nb[1];
                for (int c = lane; c < hd; c += 32) {
                    const float kx = ld<TK>(kr + c * kd.nb[0]);
#pragma unroll
                    for (int hh = 0; hh < NH; ++hh) acc[hh] += kx * qs[hh][c];
                }
                int hh;
                const float dot = group_sum_scatter<NH, 32>(acc, lane, hh);
                if ((lane & (32 / NH - 1)) == 0) sc[hh][jj] = score(hh, jj, dot);
            }
        }
        __syncthreads();

        // ---- the chunk's softmax statistics, one warp per head; sc becomes e^(s - m), 0 past len
        // (up to chunk: the fast P·V step reads whole groups of 8)
        for (int hh = warp; hh < NH; hh += FA_WARPS) {
            float m = NEG_INF;
            for (int jj = lane; jj < len; jj += 32) m = max_nan(m, sc[hh][jj]);
            m = warp_max(m);
            float l = 0.0f;
            for (int jj = lane; jj < chunk; jj += 32) {
                const float e = (jj < len && m != NEG_INF) ? expf(sc[hh][jj] - m) : 0.0f;
                sc[hh][jj] = e;
                l += e;
            }
            l = warp_sum(l);
            if (lane == 0) {
                ws_ml[(row_of(hh) * S + split) * 2] = m;
                ws_ml[(row_of(hh) * S + split) * 2 + 1] = l;
            }
        }
        if (FAST) cp_async_wait<0>();  // the V tile
        __syncthreads();

        // ---- o[d] = Σ_j e_j V[d, j]: V rows run over positions (the transposed cache)
        if constexpr (FAST) {  // warp w takes dims [w HD/4, (w + 1) HD/4) as 8-column tiles
            constexpr int NT = HD / 32;
            unsigned pa[FA_CHUNK / 16][4];
            {
                const float* p_lo = (g >> 1) < NH ? sc[g >> 1] : nullptr;
                const float* p_hi = NH > 4 && 4 + (g >> 1) < NH ? sc[(4 + (g >> 1)) % NH] : nullptr;
#pragma unroll
                for (int k = 0; k < FA_CHUNK / 16; ++k) a_frag<TK>(pa[k], p_lo, p_hi, g & 1, (k >> 1) * 32 + tq * 8 + (k & 1) * 4);
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const int dd = warp * (HD / 4) + nt * 8 + g;  // this lane's V row (B column g)
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int k2 = 0; k2 < FA_CHUNK / 32; ++k2) {
                    const V16 vw = *(const V16*)(Vs + dd * VROW + swz(dd, k2 * 4 + tq) * 16);
                    Mma<TK>::run(c, pa[2 * k2], vw.w[0], vw.w[1]);
                    Mma<TK>::run(c, pa[2 * k2 + 1], vw.w[2], vw.w[3]);
                }
#pragma unroll
                for (int i = 0; i < 4; ++i) c[i] += __shfl_xor_sync(0xffffffffu, c[i], 4);
                if ((g & 1) == 0) {
                    const int d0 = warp * (HD / 4) + nt * 8 + tq * 2;
#pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        const int hh = (g >> 1) + half * 4;
                        if (hh < NH)
                            *(float2*)(ws_o + (row_of(hh) * S + split) * HD + d0) = make_float2(c[2 * half], c[2 * half + 1]);
                    }
                }
            }
        } else {  // any strides: a warp per row, lanes over positions
            for (int dd = warp; dd < hd; dd += FA_WARPS) {
                float acc[NH];
#pragma unroll
                for (int hh = 0; hh < NH; ++hh) acc[hh] = 0.0f;
                for (int jj = lane; jj < len; jj += 32) {
                    const float x = ld<TK>(vb + dd * vd.nb[1] + (j0 + jj) * vd.nb[0]);
#pragma unroll
                    for (int hh = 0; hh < NH; ++hh) acc[hh] += sc[hh][jj] * x;
                }
                int hh;
                const float o = group_sum_scatter<NH, 32>(acc, lane, hh);
                if ((lane & (32 / NH - 1)) == 0) ws_o[(row_of(hh) * S + split) * hd + dd] = o;
            }
        }
    } else {  // nothing visible: m = -inf marks the chunk empty (weight 0, o = 0)
        if (tid < NH) {
            ws_ml[(row_of(tid) * S + split) * 2] = NEG_INF;
            ws_ml[(row_of(tid) * S + split) * 2 + 1] = 0.0f;
        }
        for (int e = tid; e < NH * hd; e += FA_THREADS) ws_o[(row_of(e / hd) * S + split) * hd + e % hd] = 0.0f;
    }
}

// The chunks of each row (query head of a token) combined: block (row, FC_OUT outputs), threads
// = FC_OUT outputs x slices of the chunks. A thread issues its o loads first, so they are in
// flight while the block reads (m, l) and reduces them: the kernel is latency, not bytes.
#define FC_THREADS 128
#define FC_OUT 32
extern "C" __global__ void __launch_bounds__(FC_THREADS)
    flash_combine(char* dst, TDesc d, const float* ws, int S, int hd) {
    gg_grid_sync();
    constexpr int SLICES = FC_THREADS / FC_OUT;
    __shared__ float w[FA_MAX_SPLITS];
    __shared__ float part[SLICES][FC_OUT];
    __shared__ float red[32];
    const float NEG_INF = -__int_as_float(0x7f800000);
    const int tid = threadIdx.x;
    const i64 row = blockIdx.x, R = d.ne[1] * d.ne[2] * d.ne[3];
    const float* ml = ws + row * S * 2;
    const float* o = ws + 2 * R * S + row * S * hd;
    const int dd = blockIdx.y * FC_OUT + tid % FC_OUT, slice = tid / FC_OUT;
    float acc = 0.0f;
    for (int s0 = 0; s0 < S; s0 += SLICES * FA_BATCH) {  // one pass for S <= SLICES * FA_BATCH
        float ov[FA_BATCH];
#pragma unroll
        for (int u = 0; u < FA_BATCH; ++u) {
            const int s = s0 + u * SLICES + slice;
            ov[u] = s < S && dd < hd ? o[(i64)s * hd + dd] : 0.0f;
        }
        if (s0 == 0) {  // the weights, while the first loads are in flight
            float M = NEG_INF;
            for (int s = tid; s < S; s += FC_THREADS) {
                w[s] = ml[2 * s];
                M = max_nan(M, w[s]);
            }
            M = block_max(M, red);
            float L = 0.0f;
            for (int s = tid; s < S; s += FC_THREADS) {
                const float e = w[s] == NEG_INF ? 0.0f : expf(w[s] - M);  // an empty chunk: weight 0
                L += e * ml[2 * s + 1];
                w[s] = e;
            }
            L = block_sum(L, red);  // its barriers also publish w
            if (tid == 0) part[0][0] = L;  // read back after the barrier below
        }
#pragma unroll
        for (int u = 0; u < FA_BATCH; ++u) {
            const int s = s0 + u * SLICES + slice;
            acc += s < S ? w[s] * ov[u] : 0.0f;
        }
    }
    __syncthreads();
    const float L = part[0][0];
    __syncthreads();
    part[slice][tid % FC_OUT] = acc;
    __syncthreads();
    if (slice == 0 && dd < hd) {
        for (int i = 1; i < SLICES; ++i) acc += part[i][tid];
        const int h = (int)(row % d.ne[2]), z = (int)(row / d.ne[2]);
        const int t = z % (int)d.ne[1], i3 = z / (int)d.ne[1];
        *(float*)(dst + dd * d.nb[0] + t * d.nb[1] + h * d.nb[2] + i3 * d.nb[3]) =
            L == 0.0f ? 0.0f : acc / L;  // fully masked: zeros
    }
}

#define GG_FA(T, S, NH, HD, NAME)                                                                          \
    extern "C" __global__ void __launch_bounds__(FA_THREADS)                                               \
        NAME(char* dst, TDesc d, const char* q, TDesc qd, const char* k, TDesc kd, const char* v, TDesc vd, \
             const char* mask, TDesc md, int mdt, FaArgs p, float* ws) {                                   \
        gg_grid_sync();                                                                                    \
        flash_impl<T, NH, HD>(dst, d, q, qd, k, kd, v, vd, mask, md, mdt, p, ws);                          \
    }
// Fast builds for the F16 and BF16 caches of head size 64 and 128, every head grouping; one
// generic build per dtype (one query head per block), for the rest. Compile time grows with
// every variant (this file: ~20 s with NVRTC).
#define GG_FA_FAST(T, S, NH) GG_FA(T, S, NH, 64, flash_attn_##S##_h##NH##_d64) GG_FA(T, S, NH, 128, flash_attn_##S##_h##NH##_d128)
#define GG_FA_H(T, S) GG_FA_FAST(T, S, 1) GG_FA_FAST(T, S, 2) GG_FA_FAST(T, S, 4) GG_FA_FAST(T, S, 8)
GG_FA(float, f32, 1, 0, flash_attn_f32_h1)
GG_FA(f16, f16, 1, 0, flash_attn_f16_h1)
GG_FA(bf16, bf16, 1, 0, flash_attn_bf16_h1)
GG_FA_H(f16, f16)
GG_FA_H(bf16, bf16)
