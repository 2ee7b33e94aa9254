// Fused attention over a KV cache (flash-decoding): out = softmax(post * (cx * K·q + mask)) · V in
// one kernel, for the planner's chains  mul_mat -> scale -> add|diag_mask_inf -> soft_max -> mul_mat
// and  mul_mat -> soft_max_ext -> mul_mat  with few query tokens (decode). The KQ scores never
// reach device memory, and two launches (softmax, second product) disappear.
//
// Shapes (ggml): K (hd, n_kv, n_kv_head), q (hd, T, n_head), V (n_kv, hd, n_kv_head), out (hd, T,
// n_head); query head h reads K/V head h / (n_head / n_kv_head). V comes in two layouts: the
// transposed cache (positions contiguous, gg.llama's) or position-major like K (V^T of a
// (hd, n_ctx, n_kv_head) cache, llama.cpp's with flash attention: V nb[0] is a row of hd values,
// the head dim contiguous). The host decides which at plan time: the fast builds have one
// variant per layout (*_vpos: V tiles staged exactly like K tiles), the generic build a flag.
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
// Combining in the last block of each head group, found with an atomic counter, left a tail of
// a few blocks reading every chunk's o when rows have many chunks (20-55% of the kernel's time in
// ncu, llama-7B dims); with few chunks (at most FA_FUSE_SPLITS: a small model's short context)
// that tail is short and saves the combine's launch, so the host passes `cnt` (a counter per head
// group, zero between runs: the last block resets it) and the kernel finishes the rows itself
// (flash_finish). Heads sharing a K/V head are done by one block (GQA), so each cache byte is read
// once per token.
//
// A chunk whose every position is masked (mask -inf, or past n_past + t) reads neither K nor V:
// an indexed decode graph spans the whole context, and early in a sequence most of it is empty.
// So NaN or inf stored at such positions cannot reach the output (in the unfused chain
// NaN + -inf would poison the row). A fully masked row gives zeros, like the unfused softmax.
#include "common.cuh"

// FA_THREADS, FA_CHUNK (positions per block of the fast builds; their *_c<N> builds: N), FA_MAX_CHUNK, FA_MAX_HD,
// FA_MAX_SPLITS (chunks per row: flash_combine keeps their weights), FC_THREADS, FC_OUT,
// FA_FUSE_SPLITS (chunks per row the last block combines), FA_O_ALIGN (the workspace o's alignment) and the
// fast builds' lists GG_FOR_FA_FAST and GG_FOR_FA_SHORT come from the host (families/attention.py, as -D).
#define FA_WARPS (FA_THREADS / 32)
#define FA_BATCH 16        // chunk results a flash_combine thread loads at once

// FA_STAMPS (attention.STAMPS: a measuring build the planner never asks for; scripts/stamps.py
// reads it): thread 0 of each block stamps (gg_stamp) each phase of the flash builds it passes
// into the module's fa_stamps.
#if FA_STAMPS
__device__ unsigned long long fa_stamps[FA_STAMP_BLOCKS][FA_STAMP_PHASES][3];
__device__ __forceinline__ void fa_stamp(int phase) {
    const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    if (threadIdx.x == 0 && b < FA_STAMP_BLOCKS) gg_stamp(fa_stamps[b][phase]);
}
#else
__device__ __forceinline__ void fa_stamp(int) {}
#endif

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

struct FaArgs {
    float cx, post;   // score = post * (cx * K·q + mask)
    int n_past;       // >= 0: diag_mask_inf(n_past) instead of a mask tensor
    int chunk;        // positions per block (the generic path; a fast build's is its CH)
    int r2, r3;       // query heads (dim-3 batches) per K/V head: n_head / n_kv_head (host-divided)
    int pre;          // fast path: prefetch the block's K and V tiles into L2 before the wait
    int vpos;         // V position-major (head dim contiguous): the generic path's P·V loop order
    int cl;           // fast path, sm_90: the gridDim.x chunks of a head group are one cluster and
                      // combine through their shared memory (flash_cluster_finish); no workspace
    int early;        // with cl: the K and V copies go out with the q and mask loads, before the
                      // mask says whether the chunk is visible (its tiles are read either way)
};

// Sum acc[0..N) over the lanes lane ^ o, o = 16, 8, .., G (the lanes of a warp G apart), by a
// reduce-scatter: each level trades half of the remaining partial sums with the partner lane.
// A lane ends up with N / (32 / G) totals, acc[0..) holding sums N_base.. (the return value).
template <int N, int G>
__device__ __forceinline__ int lanes_sum_scatter(float* acc, int lane) {
    int base = 0;
#pragma unroll
    for (int n = N, o = 16; o >= G; n >>= 1, o >>= 1) {
        const bool up = (lane & o) != 0;
#pragma unroll
        for (int i = 0; i < n / 2; ++i) {
            const float send = up ? acc[i] : acc[i + n / 2];
            const float keep = up ? acc[i + n / 2] : acc[i];
            acc[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
        if (up) base += n / 2;
    }
    return base;
}

// Where 16-byte piece c of row r of a tile with ROWB-byte rows is staged for the tensor-core
// build: swizzled so that ldmatrix's 8 rows at one piece fall in 8 different bank groups (rows a
// power of two apart would all hit the same 4 banks, an 8-way conflict).
template <int ROWB> __device__ __forceinline__ int fa_swz(int r, int c) {
    static_assert(ROWB >= 64 && ROWB % 64 == 0, "tile rows of 64 or a multiple of 128 bytes");
    if constexpr (ROWB >= 128) return c ^ (r & 7);
    else return c ^ ((r >> 1) & 3);
}

// Where piece c of row r of a tile with ROWB-byte rows goes (SWZ: fa_swz's place).
template <int ROWB, bool SWZ> __device__ __forceinline__ char* fa_piece(char* tile, int r, int c) {
    if constexpr (SWZ) return tile + r * ROWB + fa_swz<ROWB>(r, c) * 16;
    else return tile + r * ROWB + c * 16;
}

// A chunk's K tile ([CH][HD]) and V tile ([HD][CH], or VP [CH][HD]) of the fast builds into shared
// memory, every byte in flight at once, as two cp.async groups (K, then V): K rows past len are
// not copied, V's are zero-filled (their weight is 0, and 0 * NaN is not). SWZ: pieces placed by
// fa_swz (the tensor-core build's ldmatrix).
template <class TK, int HD, bool VP, int CH, bool SWZ>
__device__ __forceinline__ void fa_copy_tiles(char* Ks, char* Vs, const char* kb, const TDesc& kd, const char* vb,
                                              const TDesc& vd, i64 j0, int len) {
    if constexpr (HD > 0) {
        constexpr int KROW = HD * (int)sizeof(TK), VROW = CH * (int)sizeof(TK);  // tile row bytes
        constexpr int KP = KROW / 16, VPc = VROW / 16;                          // 16-byte pieces a row
        const int tid = threadIdx.x;
#pragma unroll
        for (int i = 0; i < CH * KP / FA_THREADS; ++i) {
            const int e = tid + i * FA_THREADS, r = e / KP, c = e % KP;
            if (r < len) cp_async16(fa_piece<KROW, SWZ>(Ks, r, c), kb + (j0 + r) * kd.nb[1] + c * 16, 16);
        }
        cp_async_commit();
        if constexpr (VP) {
#pragma unroll
            for (int i = 0; i < CH * KP / FA_THREADS; ++i) {
                const int e = tid + i * FA_THREADS, r = e / KP, c = e % KP;
                const bool in = r < len;
                cp_async16(fa_piece<KROW, SWZ>(Vs, r, c), vb + (j0 + (in ? r : 0)) * vd.nb[0] + c * 16, in ? 16 : 0);
            }
        } else {
            const char* v0 = vb + j0 * (i64)sizeof(TK);
            const int vlen = len * (int)sizeof(TK);
#pragma unroll
            for (int i = 0; i < HD * VPc / FA_THREADS; ++i) {
                const int e = tid + i * FA_THREADS, dd = e / VPc, c = e % VPc;
                const int n = max(0, min(16, vlen - c * 16));
                cp_async16(fa_piece<VROW, SWZ>(Vs, dd, c), v0 + dd * vd.nb[1] + (n ? c * 16 : 0), n);
            }
        }
        cp_async_commit();
    }
}

// HD > 0: the fast path for head size HD; HD == 0: the generic path (any head size <= FA_MAX_HD).
// VP (fast path): V position-major, its tile staged like K's ([CH][HD]). CH: the fast path's
// positions per block (FA_CHUNK, or the host's short chunk).
template <class TK, int NH, int HD, int CH>
__device__ __forceinline__ void flash_finish(char* dst, const TDesc& d, float* ws, int* cnt, char* smem);
template <int NH, int HD>
__device__ __forceinline__ void flash_cluster_finish(char* dst, const TDesc& d, const float* ml, const float* o);

// Where the workspace's o (per row and chunk) starts, after the (m, l) pairs: FA_O_ALIGN-byte
// aligned so a head group's o can be copied with 16-byte cp.async (the host's scratch has
// FA_O_ALIGN bytes to spare).
__device__ __forceinline__ i64 fa_o_base(i64 R, int S) {
    constexpr i64 A = FA_O_ALIGN / 4;  // floats
    static_assert(FA_O_ALIGN % 16 == 0, "cp.async copies 16 bytes");
    return (2 * R * S + A - 1) & ~(A - 1);
}

template <class TK, int NH, int HD, bool VP, int CH>
__device__ __forceinline__ void flash_impl(char* dst, const TDesc& d, const char* q, const TDesc& qd,
                                           const char* k, const TDesc& kd, const char* v, const TDesc& vd,
                                           const char* mask, const TDesc& md, int mdt, const FaArgs& p,
                                           float* ws, int* cnt) {
    constexpr bool FAST = HD > 0;
    constexpr int SC = FAST ? CH : FA_MAX_CHUNK;
    // dynamic: the K tile [CH][HD] and the V tile [HD][CH] ([CH][HD] if VP) (fast path)
    extern __shared__ __align__(16) char dyn[];
    __shared__ float qs[NH][FAST ? 1 : FA_MAX_HD];  // q (generic path; the fast path keeps it in registers)
    __shared__ float sc[NH][SC];                  // the mask, then the scores, then e^(s - m)
    __shared__ float cml[NH][2];                  // cluster combine: this chunk's (m, l) and o per head
    __shared__ __align__(16) float co[FAST ? NH * HD : 1];
    const float NEG_INF = -__int_as_float(0x7f800000);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hd = FAST ? HD : (int)kd.ne[0];
    const int chunk = FAST ? CH : p.chunk;
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
    float* ws_o = ws + fa_o_base(R, S);
    auto row_of = [&](int hh) -> i64 { return (i64)blockIdx.z * d.ne[2] + h0 + hh; };
    // this chunk's (m, l) and o[i] of head hh: to the workspace, or (cl) to shared memory (each
    // store names its state space: a pointer that may be either would make it a generic one)
    const bool cl = GG_CLUSTERS && FAST && p.cl;
    auto put_ml = [&](int hh, float m, float l) {
        if (cl) {
            cml[hh][0] = m;
            cml[hh][1] = l;
        } else {
            ws_ml[(row_of(hh) * S + split) * 2] = m;
            ws_ml[(row_of(hh) * S + split) * 2 + 1] = l;
        }
    };
    auto put_o = [&](int hh, int i, float v) {
        if (cl) co[hh * hd + i] = v;
        else ws_o[(row_of(hh) * S + split) * hd + i] = v;
    };
    auto diag = [&](i64 j) -> bool { return p.n_past >= 0 && j > (i64)p.n_past + t; };

    // fast path: the chunk's K and V tiles, every byte in flight at once (fa_copy_tiles)
    constexpr int KROW = FAST ? HD * (int)sizeof(TK) : 16, VROW = CH * (int)sizeof(TK);  // tile row bytes
    char* Ks = dyn;
    char* Vs = dyn + CH * KROW;
    auto copy_tiles = [&]() { fa_copy_tiles<TK, HD, VP, CH, false>(Ks, Vs, kb, kd, vb, vd, j0, len); };
    // short contexts (cl): the tiles' round trip overlaps the mask's, at the price of reading the
    // tiles of chunks nobody sees (at most the cluster's 8 chunks a head group)
    const bool early = FAST && cl && p.early;
    if constexpr (FAST)
        if (early) copy_tiles();

    // fast path: lane gl of a K-row group of TPP lanes owns q elements [8 gl, 8 gl + 8) of each head
    constexpr int TPP = FAST ? (HD / 8 > NH ? HD / 8 : NH) : 32;
    const int grp = tid / TPP, gl = tid % TPP;
    float qr[NH][8];
    // (q rows of contiguous floats, 16-byte aligned, as a model's are: two vector loads a head
    // instead of 8 loads, each with its 64-bit address, a head)
    const bool qvec = FAST && qd.nb[0] == 4 && (((unsigned long long)qb | (unsigned long long)qd.nb[2]) & 15u) == 0;
    if (FAST && qvec) {
#pragma unroll
        for (int hh = 0; hh < NH; ++hh) {
            const float4 a = gl * 8 < hd ? *(const float4*)(qb + hh * qd.nb[2] + gl * 32) : make_float4(0, 0, 0, 0);
            const float4 b = gl * 8 < hd ? *(const float4*)(qb + hh * qd.nb[2] + gl * 32 + 16) : make_float4(0, 0, 0, 0);
            qr[hh][0] = a.x, qr[hh][1] = a.y, qr[hh][2] = a.z, qr[hh][3] = a.w;
            qr[hh][4] = b.x, qr[hh][5] = b.y, qr[hh][6] = b.z, qr[hh][7] = b.w;
        }
    } else if (FAST) {
#pragma unroll
        for (int hh = 0; hh < NH; ++hh)
#pragma unroll
            for (int i = 0; i < 8; ++i)
                qr[hh][i] = gl * 8 < hd ? ld<float>(qb + (gl * 8 + i) * qd.nb[0] + hh * qd.nb[2]) : 0.0f;
    } else {
        for (int e = tid; e < NH * hd; e += FA_THREADS) {
            const int hh = e / hd, c = e - hh * hd;
            qs[hh][c] = ld<float>(qb + c * qd.nb[0] + hh * qd.nb[2]);
        }
    }
    // the chunk's mask values (masks broadcast over heads: usually one row), and whether any
    // position is visible at all
    const char* mbase = mask ? mask + (t % md.ne[1]) * md.nb[1] + (i3 % md.ne[3]) * md.nb[3] : nullptr;
    int visible = !(p.post > 0.0f);  // post <= 0 turns -inf into +inf or NaN: never skip then
    const bool mrow = md.ne[2] == 1;  // one mask row for every head: loaded once
    auto mask_at = [&](int jj) {
        const i64 j = j0 + jj;
        float m0 = 0.0f;
#pragma unroll
        for (int hh = 0; hh < NH; ++hh) {
            const float m = !mbase ? 0.0f
                            : hh > 0 && mrow ? m0
                            : ld_dt(mbase + ((unsigned)(h0 + hh) % (unsigned)md.ne[2]) * md.nb[2] + j * md.nb[0], mdt);
            if (hh == 0) m0 = m;
            sc[hh][jj] = m;
            visible |= m != NEG_INF && !diag(j);
        }
    };
    if constexpr (FAST && CH <= FA_THREADS) {  // a position a thread (the loop's bound unknown to the compiler)
        if (tid < len) mask_at(tid);
    } else {
        for (int jj = tid; jj < len; jj += FA_THREADS) mask_at(jj);
    }
    visible = __syncthreads_or(visible);
    fa_stamp(2);

    if (visible) {
        auto score = [&](int hh, int jj, float dot) -> float {
            const float x = diag(j0 + jj) ? NEG_INF : p.cx * dot + sc[hh][jj];
            return p.post * x;
        };
        // ---- scores: TPP lanes per K row, reduced by a reduce-scatter over the group
        const int writer = (gl & (TPP / NH - 1)) == 0;
        if constexpr (FAST) {
            if (!early) copy_tiles();
            cp_async_wait<1>();  // the K tile
            __syncthreads();
            fa_stamp(3);
            constexpr int GROUPS = FA_THREADS / TPP;
#pragma unroll
            for (int u = 0; u < CH / GROUPS; ++u) {
                const int jj = u * GROUPS + grp;
                float kv[8];
                if (jj < len && gl * 8 < HD) {
                    ld8<TK>(Ks + jj * KROW + gl * 8 * (int)sizeof(TK), kv);
                } else {
#pragma unroll
                    for (int i = 0; i < 8; ++i) kv[i] = 0.0f;
                }
                float acc[NH];
#pragma unroll
                for (int hh = 0; hh < NH; ++hh) {
                    acc[hh] = 0.0f;
#pragma unroll
                    for (int i = 0; i < 8; ++i) acc[hh] += kv[i] * qr[hh][i];
                }
                int hh;
                const float dot = group_sum_scatter<NH, TPP>(acc, lane, hh);
                if (jj < len && writer) sc[hh][jj] = score(hh, jj, dot);
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
                if (writer) sc[hh][jj] = score(hh, jj, dot);
            }
        }
        __syncthreads();
        fa_stamp(4);

        // ---- the chunk's softmax statistics, one warp per head; sc becomes e^(s - m), 0 past len
        // (up to chunk: the fast P·V step reads whole groups of 8). The short builds (CH <= 32) hold
        // one position a lane: the loops over positions, whose bound the compiler cannot know,
        // had unrolled into ~800 instructions of a 4,600-instruction build that each block runs
        // once, its time going to fetching its own code (docs/performance.md, thirty-fifth
        // session); the same operations in the same order, so the same bits.
        if constexpr (FAST && CH <= 32) {
#pragma unroll 1
            for (int hh = warp; hh < NH; hh += FA_WARPS) {
                const float s = lane < len ? sc[hh][lane] : NEG_INF;
                const float m = warp_max(max_nan(NEG_INF, s));
                const float e = (lane < len && m != NEG_INF) ? expf(s - m) : 0.0f;
                if (lane < CH) sc[hh][lane] = e;
                const float l = warp_sum(lane < CH ? e : 0.0f);
                if (lane == 0) put_ml(hh, m, l);
            }
        } else {
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
                if (lane == 0) put_ml(hh, m, l);
            }
        }
        if (FAST) cp_async_wait<0>();  // the V tile
        __syncthreads();
        fa_stamp(5);

        // ---- o[d] = Σ_j e_j V[d, j]
        if constexpr (FAST && VP) {
            // V rows run over the head dim, like K's: G lanes cover a row, 8 values each; a warp's
            // LS lane slices take every LS-th position. With NH >= FA_WARPS heads the warps split
            // the heads and see every position (no exchange between warps); with fewer, they
            // split the positions and add their sums in shared memory (the K tile's bytes,
            // unused since the scores). The lane slices' sums: a reduce-scatter over the warp.
            constexpr int G = HD / 8, LS = 32 / G;
            constexpr int WH = NH >= FA_WARPS ? FA_WARPS : 1, HPW = NH / WH, PW = FA_WARPS / WH;
            constexpr int KEEP = HPW * 8 / LS;
            static_assert(NH % WH == 0 && HPW * 8 >= LS, "heads split evenly over the warps");
            static_assert(PW == 1 || PW * NH * HD * 4 <= CH * KROW, "the warps' sums fit in the K tile");
            const int hw = WH > 1 ? warp : 0, pw = WH > 1 ? 0 : warp;
            const int dg = lane % G, ls = lane / G;
            float acc[HPW * 8];
#pragma unroll
            for (int i = 0; i < HPW * 8; ++i) acc[i] = 0.0f;
#pragma unroll
            for (int u = 0; u < CH / (PW * LS); ++u) {
                const int jj = (u * PW + pw) * LS + ls;
                float vv[8];
                ld8<TK>(Vs + jj * KROW + dg * 8 * (int)sizeof(TK), vv);
#pragma unroll
                for (int h = 0; h < HPW; ++h) {
                    const float e = sc[hw * HPW + h][jj];
#pragma unroll
                    for (int i = 0; i < 8; ++i) acc[h * 8 + i] += e * vv[i];
                }
            }
            const int base = lanes_sum_scatter<HPW * 8, G>(acc, lane);
            if constexpr (PW == 1) {
#pragma unroll
                for (int i = 0; i < KEEP; ++i) {
                    const int x = base + i;
                    put_o(hw * HPW + x / 8, dg * 8 + x % 8, acc[i]);
                }
            } else {
                float* red = (float*)Ks;  // [PW][NH][HD]
#pragma unroll
                for (int i = 0; i < KEEP; ++i) {
                    const int x = base + i;
                    red[(pw * NH + x / 8) * HD + dg * 8 + x % 8] = acc[i];
                }
                __syncthreads();
                for (int e = tid; e < NH * HD; e += FA_THREADS) {
                    float o = 0.0f;
#pragma unroll
                    for (int w = 0; w < PW; ++w) o += red[w * NH * HD + e];
                    put_o(e / HD, e % HD, o);
                }
            }
        } else if constexpr (FAST) {  // V rows run over positions: VL lanes cover a tile row, 8 positions each
            constexpr int VL = CH / 8, ROWS = 32 / VL;
            const int lr = lane % VL, rw = lane / VL;
            const int vwriter = (lr & (VL / NH - 1)) == 0;
            float pr[NH][8];
#pragma unroll
            for (int hh = 0; hh < NH; ++hh)
#pragma unroll
                for (int i = 0; i < 8; ++i) pr[hh][i] = sc[hh][lr * 8 + i];
#pragma unroll
            for (int u = 0; u < HD / (FA_WARPS * ROWS); ++u) {
                const int dd = (u * FA_WARPS + warp) * ROWS + rw;
                float vv[8];
                ld8<TK>(Vs + dd * VROW + lr * 8 * (int)sizeof(TK), vv);
                float acc[NH];
#pragma unroll
                for (int hh = 0; hh < NH; ++hh) {
                    acc[hh] = 0.0f;
#pragma unroll
                    for (int i = 0; i < 8; ++i) acc[hh] += pr[hh][i] * vv[i];
                }
                int hh;
                const float o = group_sum_scatter<NH, VL>(acc, lane, hh);
                if (vwriter) put_o(hh, dd, o);
            }
        } else if (p.vpos) {  // any strides, the head dim contiguous: a thread per dd, positions in turn
            for (int dd = tid; dd < hd; dd += FA_THREADS) {
                float acc[NH];
#pragma unroll
                for (int hh = 0; hh < NH; ++hh) acc[hh] = 0.0f;
                const char* vc = vb + dd * vd.nb[1] + j0 * vd.nb[0];
                for (int jj = 0; jj < len; ++jj) {
                    const float x = ld<TK>(vc + jj * vd.nb[0]);
#pragma unroll
                    for (int hh = 0; hh < NH; ++hh) acc[hh] += sc[hh][jj] * x;
                }
#pragma unroll
                for (int hh = 0; hh < NH; ++hh) put_o(hh, dd, acc[hh]);
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
                if ((lane & (32 / NH - 1)) == 0) put_o(hh, dd, o);
            }
        }
    } else {  // nothing visible: m = -inf marks the chunk empty (weight 0, o = 0)
        if (tid < NH) put_ml(tid, NEG_INF, 0.0f);
        for (int e = tid; e < NH * hd; e += FA_THREADS) put_o(e / hd, e % hd, 0.0f);
        if (early) cp_async_wait<0>();  // no copy may land in a block that has left
    }
    fa_stamp(6);
    if (cl) flash_cluster_finish<NH, HD>(dst, d, &cml[0][0], co);
    else if (cnt) flash_finish<TK, NH, HD, CH>(dst, d, ws, cnt, dyn);
}

// The chunk weights of a head group's rows, thread i < n (= heads * S) taking entry i = (head,
// chunk): on entry w[i] is the chunk's max m and lw[i] its sum l (published by a barrier), on
// return w[i] = e^(m - M) with M the head's max over its S chunks (0 for an empty chunk) and lw[i]
// = l * w[i]; the caller's next barrier publishes them. MAXS > 0: S <= MAXS (the cluster's), the
// loop over the chunks unrolled to that bound (the same maxima in the same order: a runtime
// bound had unrolled into ~190 instructions).
template <int MAXS = 0>
__device__ __forceinline__ void chunk_weights(float* w, float* lw, int n, int S) {
    const float NEG_INF = -__int_as_float(0x7f800000);
    const int tid = threadIdx.x;
    float M = NEG_INF;
    if (tid < n) {
        const float* wh = w + tid / S * S;  // the head's chunks
        if constexpr (MAXS > 0) {
#pragma unroll
            for (int c = 0; c < MAXS; ++c)
                if (c < S) M = max_nan(M, wh[c]);
        } else {
            for (int c = 0; c < S; ++c) M = max_nan(M, wh[c]);
        }
    }
    __syncthreads();  // every maximum taken before the weights replace the m
    if (tid < n) {
        const float m = w[tid], e = m == NEG_INF ? 0.0f : expf(m - M);  // an empty chunk: weight 0
        w[tid] = e;
        lw[tid] *= e;
    }
}

// The fused combine: every block publishes its chunk's (m, l, o) and takes a ticket; the last of a
// head group's S blocks combines the group's rows as flash_combine does (out = Σ e^(m_c - M) o_c /
// Σ e^(m_c - M) l_c) and resets the counter for the next run. The group's rows are adjacent in the
// workspace, so their (m, l) and o are two contiguous runs: the o of PH heads at a time go to
// shared memory (the K and V tiles, unused now) with 16-byte cp.async while the (m, l) are loaded,
// all in flight at once: the tail is one round trip a pass (one pass for NH <= PH), where a loop
// over the heads with its loads inside had cost one round trip a head. Loads bypass L1 (the other
// blocks wrote on other SMs). Fast builds only (HD > 0): S <= FA_FUSE_SPLITS.
template <class TK, int NH, int HD, int CH>
__device__ __forceinline__ void flash_finish(char* dst, const TDesc& d, float* ws, int* cnt, char* smem) {
    if constexpr (HD > 0) {
        constexpr int TILES = 2 * CH * HD * (int)sizeof(TK);  // the block's dynamic shared memory
        constexpr int PH = TILES / (FA_FUSE_SPLITS * HD * 4) < NH ? TILES / (FA_FUSE_SPLITS * HD * 4) : NH;
        static_assert(PH >= 1 && NH % PH == 0 && NH * FA_FUSE_SPLITS <= FA_THREADS, "combine passes");
        __shared__ float w[NH * FA_FUSE_SPLITS], lw[NH * FA_FUSE_SPLITS];
        const int tid = threadIdx.x, S = (int)gridDim.x, g = (int)(blockIdx.y + gridDim.y * blockIdx.z);
        if (!gg_last_block<false>(&cnt[g], S)) return;  // every block's (m, l, o) written and visible
        if (tid == 0) cnt[g] = 0;  // every block of the group has its ticket: zero for the next run
        const i64 R = (i64)gridDim.z * d.ne[2];
        const int T = (int)d.ne[1], t = (int)blockIdx.z % T, i3 = (int)blockIdx.z / T;
        const i64 row0 = (i64)blockIdx.z * d.ne[2] + (i64)blockIdx.y * NH;  // the group's first row
        const float* ml = ws + row0 * S * 2;                  // [NH][S][2]
        const float* o = ws + fa_o_base(R, S) + row0 * S * HD;  // [NH][S][HD], 16-byte aligned
        float* os = (float*)smem;
        auto fetch = [&](int h0) {  // the o of heads h0 .. h0 + PH
            const int n4 = PH * S * HD / 4;
            for (int e = tid; e < n4; e += FA_THREADS) cp_async16(os + 4 * e, o + (i64)h0 * S * HD + 4 * e, 16);
            cp_async_commit();
        };
        fetch(0);
        if (tid < NH * S) {  // thread i: chunk i % S of head i / S
            w[tid] = __ldcg(ml + 2 * tid);
            lw[tid] = __ldcg(ml + 2 * tid + 1);
        }
        __syncthreads();
        chunk_weights(w, lw, NH * S, S);
#pragma unroll 1
        for (int h0 = 0; h0 < NH; h0 += PH) {
            cp_async_wait<0>();
            __syncthreads();  // the o in shared memory, the weights published
            for (int e = tid; e < PH * HD; e += FA_THREADS) {
                const int hp = e / HD, dd = e - hp * HD, hh = h0 + hp;
                float acc = 0.0f, L = 0.0f;
                for (int c = 0; c < S; ++c) {
                    acc += w[hh * S + c] * os[(hp * S + c) * HD + dd];
                    L += lw[hh * S + c];
                }
                const int h = (int)blockIdx.y * NH + hh;
                *(float*)(dst + dd * d.nb[0] + t * d.nb[1] + h * d.nb[2] + i3 * d.nb[3]) =
                    L == 0.0f ? 0.0f : acc / L;  // fully masked: zeros
            }
            if (h0 + PH < NH) {
                __syncthreads();  // os read before the next heads' o replace it
                fetch(h0 + PH);
            }
        }
    }
}

// The cluster's combine (cl): the gridDim.x blocks of a head group are one cluster, each holding
// its chunk's (m, l) per head in `ml` ([NH][2]) and o in `o` ([NH][HD]) in its shared memory. After
// a cluster barrier every block reads all chunks' (m, l) and combines a 1/gridDim.x slice of the
// group's NH * HD outputs from the chunks' o (loads of the other blocks' shared memory, no
// workspace, fence or ticket); a second barrier keeps each block's shared memory alive until the
// others have read it.
template <int NH, int HD>
__device__ __forceinline__ void flash_cluster_finish(char* dst, const TDesc& d, const float* ml, const float* o) {
#if GG_CLUSTERS
    if constexpr (HD > 0) {
        constexpr int MAXC = FA_CLUSTER_MAX;
        __shared__ float w[NH * MAXC], lw[NH * MAXC];
        const int tid = threadIdx.x, S = (int)gridDim.x;
        const unsigned me = cluster_rank();
        cluster_sync();  // every chunk's (m, l, o) in its block's shared memory
        fa_stamp(7);
        if (tid < NH * S) {  // thread i: chunk i % S of head i / S
            const int hh = tid / S, c = tid - hh * S;
            w[tid] = ld_cluster(ml + 2 * hh, (unsigned)c);
            lw[tid] = ld_cluster(ml + 2 * hh + 1, (unsigned)c);
        }
        __syncthreads();
        chunk_weights<MAXC>(w, lw, NH * S, S);
        __syncthreads();
        const int T = (int)d.ne[1], t = (int)blockIdx.z % T, i3 = (int)blockIdx.z / T;
        const int per = (NH * HD + S - 1) / S, e0 = (int)me * per, e1 = min(NH * HD, e0 + per);
        for (int e = e0 + tid; e < e1; e += FA_THREADS) {
            const int hh = e / HD, dd = e - hh * HD;
            float ov[MAXC];
#pragma unroll
            for (int c = 0; c < MAXC; ++c) ov[c] = c < S ? ld_cluster(o + e, (unsigned)c) : 0.0f;  // all in flight
            float acc = 0.0f, L = 0.0f;
#pragma unroll
            for (int c = 0; c < MAXC; ++c)
                if (c < S) {
                    acc += w[hh * S + c] * ov[c];
                    L += lw[hh * S + c];
                }
            const int h = (int)blockIdx.y * NH + hh;
            *(float*)(dst + dd * d.nb[0] + t * d.nb[1] + h * d.nb[2] + i3 * d.nb[3]) =
                L == 0.0f ? 0.0f : acc / L;  // fully masked: zeros
        }
        fa_stamp(8);
        cluster_sync();  // the others are done reading this block's shared memory
    }
#endif
}

// The chunks of each row (query head of a token) combined: block (row, FC_OUT outputs), threads
// = FC_OUT outputs x slices of the chunks. A thread issues its o loads first, so they are in
// flight while the block reads (m, l) and reduces them: the kernel is latency, not bytes.
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
    const float* o = ws + fa_o_base(R, S) + row * S * hd;
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

// Tensor cores (sm_80+; here while attention is their only user): ldmatrix loads 8x8 tiles of
// 16-bit values from shared memory into the fragments mma.sync multiplies (lane l gives the
// address of row l % 8 of tile l / 8; lane t gets the pair at row t / 4, columns 2 (t % 4) .. +1,
// or with .trans the pair at rows 2 (t % 4) .. +1, column t / 4). mma16816: c (16x8 f32) += a
// (16x16 f16, row-major) * b (16x8 f16, column-major).
__device__ __forceinline__ void ldsm_x4(unsigned* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)) : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)) : "memory");
}
__device__ __forceinline__ void mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two floats as an f16 pair (x in the low half), and the pair of what rounding left of them: a
// float x is hi + lo to about 22 bits, so a product with an f16 operand keeps float accuracy
// through two tensor-core rows.
__device__ __forceinline__ void f16_split2(float x, float y, unsigned& hi, unsigned& lo) {
    const u16 hx = f2h(x), hy = f2h(y);
    hi = (unsigned)hx | ((unsigned)hy << 16);
    lo = (unsigned)f2h(x - h2f(hx)) | ((unsigned)f2h(y - h2f(hy)) << 16);
}

template <class T> struct fa_f16 { static constexpr bool value = false; };
template <> struct fa_f16<f16> { static constexpr bool value = true; };

// The tensor-core build of the F16 fast path (chunks of FA_CHUNK positions, head groups of at
// least FA_MMA_HEADS; the entry point picks it): scores S = Q K^T and sums O = P V as mma.sync
// products over tiles staged as the fast path stages them (fa_copy_tiles, pieces swizzled).
// The NH query heads are rows 0..NH of a 16-row A operand and what rounding to f16 left of them
// rows 8..8 + NH; each thread holds rows g and g + 8 of a product, so their sum keeps float
// accuracy: q (per head scaled by a power of two so its largest element is in [64, 128): no f16
// overflow, few subnormal residues) and the softmax weights P. The warps split the chunk's
// positions for S and the head dim for O; P goes through shared memory already in the A
// fragments' layout. A chunk is a few dozen mma and ldmatrix a warp, where the scalar build's
// work grows with the heads it serves (each K and V row multiplied NH times, reduced by shuffles).
template <int NH, int HD, bool VP, int CH>
__device__ __forceinline__ void flash_tc_impl(char* dst, const TDesc& d, const char* q, const TDesc& qd,
                                              const char* k, const TDesc& kd, const char* v, const TDesc& vd,
                                              const char* mask, const TDesc& md, int mdt, const FaArgs& p,
                                              float* ws, int* cnt) {
    constexpr int KROW = HD * 2, VROW = CH * 2;       // tile row bytes
    constexpr int KS = HD / 16;                       // k-steps of Q K^T
    constexpr int PPW = CH / FA_WARPS, NT = PPW / 8;   // a warp's positions, in n-tiles of 8
    constexpr int DPW = HD / FA_WARPS, DN = DPW / 8;   // a warp's head dims in P V, in n-tiles
    static_assert(PPW % 8 == 0 && (NT == 1 || NT == 2) && DN % 2 == 0 && KS % 2 == 0 && NH <= 8, "tile split");
    extern __shared__ __align__(16) char dyn[];  // the K tile, then the V tile
    __shared__ float sc[NH][CH];                  // the mask
    __shared__ __align__(16) unsigned pf[CH / 16][32][4];  // P as A fragments, a k-step of 16 positions each
    __shared__ float red_m[FA_WARPS][8], red_l[FA_WARPS][8];
    __shared__ float cml[NH][2];                  // cluster combine: the chunk's (m, l) and o per head
    __shared__ __align__(16) float co[NH * HD];
    const float NEG_INF = -__int_as_float(0x7f800000);
    const unsigned ALL = 0xffffffffu;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
    const int T = (int)d.ne[1], t = (int)blockIdx.z % T, i3 = (int)blockIdx.z / T;
    const int h0 = (int)blockIdx.y * NH;
    const char* kb = k + (h0 / p.r2) * kd.nb[2] + (i3 / p.r3) * kd.nb[3];
    const char* vb = v + (h0 / p.r2) * vd.nb[2] + (i3 / p.r3) * vd.nb[3];
    const char* qb = q + t * qd.nb[1] + (i64)h0 * qd.nb[2] + i3 * qd.nb[3];
    const int S = (int)gridDim.x, split = (int)blockIdx.x;
    const i64 j0 = (i64)split * CH;
    const int len = (int)min((i64)CH, kd.ne[1] - j0);
    const i64 R = (i64)gridDim.z * d.ne[2];
    const bool cl = GG_CLUSTERS && p.cl;
    auto row_of = [&](int hh) -> i64 { return (i64)blockIdx.z * d.ne[2] + h0 + hh; };
    auto diag = [&](i64 j) -> bool { return p.n_past >= 0 && j > (i64)p.n_past + t; };
    char* Ks = dyn;
    char* Vs = dyn + CH * KROW;

    auto copy_tiles = [&]() { fa_copy_tiles<f16, HD, VP, CH, true>(Ks, Vs, kb, kd, vb, vd, j0, len); };
    const bool early = cl && p.early;  // short contexts: the tiles' round trip overlaps the mask's
    if (early) copy_tiles();

    // q: this thread's elements (head g, columns 16 ks + 2 c + {0, 1, 8, 9}) as A fragments
    float qf[HD / 4];
#pragma unroll
    for (int i = 0; i < HD / 4; ++i) {
        const int col = (i >> 2) * 16 + 2 * c + (i & 1) + ((i >> 1) & 1) * 8;
        qf[i] = g < NH ? ld<float>(qb + col * qd.nb[0] + g * qd.nb[2]) : 0.0f;
    }
    // the chunk's mask values, and whether any position is visible at all
    const char* mbase = mask ? mask + (t % md.ne[1]) * md.nb[1] + (i3 % md.ne[3]) * md.nb[3] : nullptr;
    int visible = !(p.post > 0.0f);  // post <= 0 turns -inf into +inf or NaN: never skip then
    for (int jj = tid; jj < len; jj += FA_THREADS)
#pragma unroll
        for (int hh = 0; hh < NH; ++hh) {
            const i64 mo = ((unsigned)(h0 + hh) % (unsigned)md.ne[2]) * md.nb[2] + (j0 + jj) * md.nb[0];
            const float m = mbase ? ld_dt(mbase + mo, mdt) : 0.0f;
            sc[hh][jj] = m;
            visible |= m != NEG_INF && !diag(j0 + jj);
        }
    visible = __syncthreads_or(visible);
    fa_stamp(2);

    float mx = NEG_INF, l = 0.0f, o[DN][4];  // head g's chunk max, this thread's share of its sum,
#pragma unroll                               // the warp's head dims of its O
    for (int n = 0; n < DN; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    if (visible) {
        if (!early) copy_tiles();
        float amax = 0.0f;  // the head's largest |q| (NaN elements stay NaN through the scaling)
#pragma unroll
        for (int i = 0; i < HD / 4; ++i) amax = fmaxf(amax, fabsf(qf[i]));
        amax = fmaxf(amax, __shfl_xor_sync(ALL, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(ALL, amax, 2));
        const int ex = amax > 0.0f && amax <= 3.0e38f
                           ? min(100, max(-100, (int)((__float_as_uint(amax) >> 23) & 0xff) - 127 - 6)) : 0;
        const float to_q = __uint_as_float((unsigned)(127 - ex) << 23);  // 2^-ex and 2^ex, exact
        const float from_q = __uint_as_float((unsigned)(127 + ex) << 23);
        unsigned qa[KS][4];
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            f16_split2(qf[4 * ks] * to_q, qf[4 * ks + 1] * to_q, qa[ks][0], qa[ks][1]);
            f16_split2(qf[4 * ks + 2] * to_q, qf[4 * ks + 3] * to_q, qa[ks][2], qa[ks][3]);
        }
        cp_async_wait<1>();  // the K tile
        __syncthreads();
        fa_stamp(3);
        // S: lanes 8 i .. 8 i + 7 address the rows of matrix i = piece 2 kk + i (k-steps kk, kk + 1)
        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KS; kk += 2)
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const int row = warp * PPW + j * 8 + (lane & 7), piece = 2 * kk + (lane >> 3);
                unsigned b[4];
                ldsm_x4(b, Ks + row * KROW + fa_swz<KROW>(row, piece) * 16);
                mma16816(s[j], qa[kk], b[0], b[1]);
                mma16816(s[j], qa[kk + 1], b[2], b[3]);
            }
        // the softmax: this thread's positions 8 j + 2 c + i of the warp's, head g
        float x[NT][2], m = NEG_INF;
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int jj = warp * PPW + j * 8 + 2 * c + i;
                const float dot = (s[j][i] + s[j][2 + i]) * from_q;
                x[j][i] = g < NH && jj < len ? p.post * (diag(j0 + jj) ? NEG_INF : p.cx * dot + sc[g][jj]) : NEG_INF;
                m = max_nan(m, x[j][i]);
            }
        m = max_nan(m, __shfl_xor_sync(ALL, m, 1));
        m = max_nan(m, __shfl_xor_sync(ALL, m, 2));
        if (c == 0) red_m[warp][g] = m;
        __syncthreads();
#pragma unroll
        for (int w = 0; w < FA_WARPS; ++w) mx = max_nan(mx, red_m[w][g]);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const float e0 = x[j][0] == NEG_INF || mx == NEG_INF ? 0.0f : expf(x[j][0] - mx);
            const float e1 = x[j][1] == NEG_INF || mx == NEG_INF ? 0.0f : expf(x[j][1] - mx);
            l += e0 + e1;
            // n-tile J of the chunk is half J % 2 of k-step J / 2: registers 0, 1 (rows g, g + 8) or 2, 3
            const int J = warp * NT + j;
            unsigned hi, lo;
            f16_split2(e0, e1, hi, lo);
            pf[J >> 1][lane][(J & 1) * 2] = hi;
            pf[J >> 1][lane][(J & 1) * 2 + 1] = lo;
        }
        cp_async_wait<0>();  // the V tile
        __syncthreads();
        fa_stamp(5);
        // O = P V over the warp's head dims, two n-tiles an ldmatrix
#pragma unroll
        for (int ks = 0; ks < CH / 16; ++ks) {
            const uint4 av = *(const uint4*)pf[ks][lane];
            const unsigned a[4] = {av.x, av.y, av.z, av.w};
#pragma unroll
            for (int n = 0; n < DN; n += 2) {
                const int d0 = warp * DPW + n * 8;
                unsigned b[4];
                if constexpr (VP) {  // rows are positions: (+0, d0) (+8, d0) (+0, d0 + 8) (+8, d0 + 8), transposed
                    const int row = ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, piece = d0 / 8 + (lane >> 4);
                    ldsm_x4_trans(b, Vs + row * KROW + fa_swz<KROW>(row, piece) * 16);
                } else {  // rows are head dims: matrices (d0, +0) (d0, +8) (d0 + 8, +0) (d0 + 8, +8)
                    const int row = d0 + (lane & 7) + (lane >> 4) * 8, piece = 2 * ks + ((lane >> 3) & 1);
                    ldsm_x4(b, Vs + row * VROW + fa_swz<VROW>(row, piece) * 16);
                }
                mma16816(o[n], a, b[0], b[1]);
                mma16816(o[n + 1], a, b[2], b[3]);
            }
        }
    } else if (early) {
        cp_async_wait<0>();  // no copy may land in a block that has left
    }

    // the chunk's (m, l) and o (m = -inf, l = 0, o = 0 where nothing is visible): to the
    // workspace, or (cl) to shared memory for the cluster
    l += __shfl_xor_sync(ALL, l, 1);
    l += __shfl_xor_sync(ALL, l, 2);
    if (c == 0) red_l[warp][g] = l;
    __syncthreads();
    if (tid < NH) {
        float L = 0.0f;
#pragma unroll
        for (int w = 0; w < FA_WARPS; ++w) L += red_l[w][tid];
        float Mh = NEG_INF;
        if (visible)
#pragma unroll
            for (int w = 0; w < FA_WARPS; ++w) Mh = max_nan(Mh, red_m[w][tid]);
        if (cl) {
            cml[tid][0] = Mh;
            cml[tid][1] = L;
        } else {
            ws[(row_of(tid) * S + split) * 2] = Mh;
            ws[(row_of(tid) * S + split) * 2 + 1] = L;
        }
    }
    if (g < NH) {
        float* wo = ws + fa_o_base(R, S) + (row_of(g) * S + split) * HD;
#pragma unroll
        for (int n = 0; n < DN; ++n) {
            const int dd = warp * DPW + n * 8 + 2 * c;
            const float o0 = o[n][0] + o[n][2], o1 = o[n][1] + o[n][3];
            if (cl) {
                co[g * HD + dd] = o0;
                co[g * HD + dd + 1] = o1;
            } else {
                wo[dd] = o0;
                wo[dd + 1] = o1;
            }
        }
    }
    fa_stamp(6);
    if (cl) flash_cluster_finish<NH, HD>(dst, d, &cml[0][0], co);
    else if (cnt) flash_finish<f16, NH, HD, CH>(dst, d, ws, cnt, dyn);
}

// The kernels' body: the tensor-core build where it exists (F16 fast builds of FA_CHUNK positions
// and FA_MMA_HEADS heads or more), else flash_impl.
template <class TK, int NH, int HD, bool VP, int CH>
__device__ __forceinline__ void flash_entry(char* dst, const TDesc& d, const char* q, const TDesc& qd,
                                            const char* k, const TDesc& kd, const char* v, const TDesc& vd,
                                            const char* mask, const TDesc& md, int mdt, const FaArgs& p,
                                            float* ws, int* cnt) {
    if constexpr (FA_MMA_HEADS > 0 && NH >= FA_MMA_HEADS && CH == FA_CHUNK && HD > 0 && fa_f16<TK>::value)
        flash_tc_impl<NH, HD, VP, CH>(dst, d, q, qd, k, kd, v, vd, mask, md, mdt, p, ws, cnt);
    else
        flash_impl<TK, NH, HD, VP, CH>(dst, d, q, qd, k, kd, v, vd, mask, md, mdt, p, ws, cnt);
}

// Before the wait for the predecessor (the cache write: a latency-bound step, the DRAM idle):
// the block's K and V tiles into L2, a line per thread, so the first wave's tiles are on their
// way when the wait ends (decode, H100: 85.1 -> 84.1 us). Fast builds only (HD 64 or 128).
template <class TK, int NH, int HD, bool VP, int CH>
__device__ __forceinline__ void flash_l2_prefetch(const TDesc& d, const char* k, const TDesc& kd, const char* v,
                                                  const TDesc& vd, const FaArgs& p) {
    if constexpr (HD > 0) {
        if (!p.pre) return;
        constexpr int LINES = HD * (int)sizeof(TK) / 128;  // 128-byte lines per K row
        const int kh = (int)blockIdx.y * NH / p.r2, i3 = (int)blockIdx.z / (int)d.ne[1] / p.r3;
        const char* kb = k + kh * kd.nb[2] + i3 * kd.nb[3];
        const char* vb = v + kh * vd.nb[2] + i3 * vd.nb[3];
        const int t = (int)threadIdx.x;
        const i64 j0 = (i64)blockIdx.x * CH, r = j0 + t / LINES;
        if (t < CH * LINES && r < kd.ne[1]) l2_prefetch_line(kb + r * kd.nb[1] + (t % LINES) * 128);
        if (VP && t < CH * LINES && r < kd.ne[1]) l2_prefetch_line(vb + r * vd.nb[0] + (t % LINES) * 128);
        if (!VP && t < HD) l2_prefetch_line(vb + t * vd.nb[1] + j0 * (i64)sizeof(TK));
    }
}

#define GG_FA(T, S, NH, HD, VP, CH, NAME)                                                                  \
    extern "C" __global__ void __launch_bounds__(FA_THREADS)                                               \
        NAME(char* dst, TDesc d, const char* q, TDesc qd, const char* k, TDesc kd, const char* v, TDesc vd, \
             const char* mask, TDesc md, int mdt, FaArgs p, float* ws, int* cnt) {                         \
        fa_stamp(0);                                                                                       \
        flash_l2_prefetch<T, NH, HD, VP, CH>(d, k, kd, v, vd, p);                                          \
        gg_grid_sync();                                                                                    \
        fa_stamp(1);                                                                                       \
        flash_entry<T, NH, HD, VP, CH>(dst, d, q, qd, k, kd, v, vd, mask, md, mdt, p, ws, cnt);            \
        fa_stamp(9);                                                                                       \
    }
// Fast builds for the F16 and BF16 caches of head size 64 and 128, every head grouping, both V
// layouts, in chunks of FA_CHUNK positions, and for short contexts in the host's short chunk C
// (*_c<C>, the head groupings C allows: GG_FOR_FA_SHORT, empty when the host has none);
// one generic build per dtype (one query head per block, either layout), for the rest. Compile
// time grows with every variant.
#define GG_FA_FAST(NH, HD, T, S) GG_FA(T, S, NH, HD, false, FA_CHUNK, flash_attn_##S##_h##NH##_d##HD)
#define GG_FA_FAST_VPOS(NH, HD, T, S) GG_FA(T, S, NH, HD, true, FA_CHUNK, flash_attn_##S##_h##NH##_d##HD##_vpos)
#define GG_FA_SHORT(NH, HD, C, T, S) GG_FA(T, S, NH, HD, false, C, flash_attn_##S##_h##NH##_d##HD##_c##C)
#define GG_FA_SHORT_VPOS(NH, HD, C, T, S) GG_FA(T, S, NH, HD, true, C, flash_attn_##S##_h##NH##_d##HD##_vpos_c##C)
GG_FA(float, f32, 1, 0, false, FA_CHUNK, flash_attn_f32_h1)
GG_FA(f16, f16, 1, 0, false, FA_CHUNK, flash_attn_f16_h1)
GG_FA(bf16, bf16, 1, 0, false, FA_CHUNK, flash_attn_bf16_h1)
GG_FOR_FA_FAST(GG_FA_FAST, f16, f16)
GG_FOR_FA_FAST(GG_FA_FAST, bf16, bf16)
GG_FOR_FA_FAST(GG_FA_FAST_VPOS, f16, f16)
GG_FOR_FA_FAST(GG_FA_FAST_VPOS, bf16, bf16)
GG_FOR_FA_SHORT(GG_FA_SHORT, f16, f16)
GG_FOR_FA_SHORT(GG_FA_SHORT, bf16, bf16)
GG_FOR_FA_SHORT(GG_FA_SHORT_VPOS, f16, f16)
GG_FOR_FA_SHORT(GG_FA_SHORT_VPOS, bf16, bf16)
