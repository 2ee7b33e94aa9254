// Fused attention over a KV cache (flash-decoding): out = softmax(post * (cx * K·q + mask)) · V in
// one kernel, for the planner's chains  mul_mat -> scale -> add|diag_mask_inf -> soft_max -> mul_mat
// and  mul_mat -> soft_max_ext -> mul_mat  with few query tokens (decode). The KQ scores never
// reach device memory, and two launches (softmax, second product) disappear.
//
// Shapes (ggml): K (hd, n_kv, n_kv_head), q (hd, T, n_head), V (n_kv, hd, n_kv_head) (the
// transposed cache), out (hd, T, n_head); query head h reads K/V head h / (n_head / n_kv_head).
// One block of FA_THREADS threads per (chunk of `chunk` positions, NH query heads sharing a K/V
// head, token). A block computes its chunk's scores into shared memory, their max m and sum l,
// and the unnormalized sum o = Σ e^(s - m) V, and writes (m, l, o) to a workspace; the last block
// of each (head group, token) to finish combines the chunks:
//     out = Σ_c e^(m_c - M) o_c / Σ_c e^(m_c - M) l_c,  M = max_c m_c,
// and resets its counter so a replayed CUDA graph finds it at zero. Heads sharing a K/V head are
// done by one block (GQA), so each cache byte is read once per token.
//
// A chunk whose every position is masked (mask -inf, or past n_past + t) reads neither K nor V:
// an indexed decode graph spans the whole context, and early in a sequence most of it is empty.
// So NaN or inf stored at such positions cannot reach the output (in the unfused chain
// NaN + -inf would poison the row). A fully masked row gives zeros, like the unfused softmax.
#include "common.cuh"

#define FA_THREADS 128
#define FA_WARPS (FA_THREADS / 32)
#define FA_MAX_CHUNK 256   // support.py FLASH_CHUNKS
#define FA_MAX_HD 256      // support.py FLASH_MAX_HD
#define FA_MAX_SPLITS 1024 // support.py FLASH_MAX_SPLITS
#define FA_UNROLL 4        // K rows (V rows) a thread loads before using them

// Sum acc[0..NH) over an aligned group of `width` lanes (a power of two >= NH). Reduce-scatter:
// each halving step trades half of the remaining partial sums with the partner lane, so NH sums
// cost NH - 1 + log2(width / NH) shuffles instead of NH * log2(width). A lane ends up with the
// total of one head, returned in `head`; lanes whose bits below width / NH are zero hold each
// head once.
template <int NH>
__device__ __forceinline__ float group_sum_scatter(float* acc, int width, int lane, int& head) {
    int base = 0, o = width >> 1;
#pragma unroll
    for (int n = NH; n > 1; n >>= 1, o >>= 1) {
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
    for (; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    head = base;
    return v;
}

// Workspace reads bypass L1: they were written by other blocks of this launch.
__device__ __forceinline__ float ld_cg(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

struct FaArgs {
    float cx, post;   // score = post * (cx * K·q + mask)
    int n_past;       // >= 0: diag_mask_inf(n_past) instead of a mask tensor
    int chunk, tpp;   // positions per block; lanes per K row (power of two, >= NH)
    int kvec, vvec;   // 16-byte loads of K rows / V rows (host-checked alignment)
};

template <class TK, int NH>
__device__ __forceinline__ void flash_impl(char* dst, const TDesc& d, const char* q, const TDesc& qd,
                                           const char* k, const TDesc& kd, const char* v, const TDesc& vd,
                                           const char* mask, const TDesc& md, int mdt, const FaArgs& p,
                                           float* ws, unsigned* counters) {
    __shared__ float qs[NH][FA_MAX_HD];
    __shared__ float sc[NH][FA_MAX_CHUNK];
    __shared__ float wsh[FA_MAX_SPLITS];
    __shared__ float red[32];
    __shared__ int last;
    const float NEG_INF = -__int_as_float(0x7f800000);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hd = (int)kd.ne[0];
    const i64 n_kv = kd.ne[1];
    const int T = (int)d.ne[1];
    const int t = (int)(blockIdx.z % T), i3 = (int)(blockIdx.z / T);
    const int h0 = (int)blockIdx.y * NH;
    const i64 r2 = d.ne[2] / kd.ne[2], r3 = d.ne[3] / kd.ne[3];
    const char* kb = k + (h0 / r2) * kd.nb[2] + (i3 / r3) * kd.nb[3];
    const char* vb = v + (h0 / r2) * vd.nb[2] + (i3 / r3) * vd.nb[3];
    const int S = (int)gridDim.x, split = (int)blockIdx.x;
    const i64 j0 = (i64)split * p.chunk;
    const int len = (int)min((i64)p.chunk, n_kv - j0);
    // workspace: (m, l) per (row, split), then o[hd] per (row, split); row = query head of a token
    const i64 R = (i64)gridDim.z * d.ne[2];
    float* ws_ml = ws;
    float* ws_o = ws + 2 * R * S;
    auto row_of = [&](int hh) -> i64 { return (i64)blockIdx.z * d.ne[2] + h0 + hh; };
    // the mask row of head h0 + hh (masks broadcast over heads: usually one row for all)
    const char* mbase = mask ? mask + (t % md.ne[1]) * md.nb[1] + (i3 % md.ne[3]) * md.nb[3] : nullptr;
    const unsigned mne2 = (unsigned)md.ne[2];
    auto mrow = [&](int hh) -> const char* { return mbase + ((unsigned)(h0 + hh) % mne2) * md.nb[2]; };
    auto masked = [&](int hh, i64 j) -> bool {  // position j contributes nothing to head hh
        if (p.n_past >= 0 && j > (i64)p.n_past + t) return true;
        return mbase && ld_dt(mrow(hh) + j * md.nb[0], mdt) == NEG_INF;
    };

    // q of the NH heads, and whether any position of the chunk is visible at all
    for (int e = tid; e < NH * hd; e += FA_THREADS) {
        const int hh = e / hd, c = e % hd;
        qs[hh][c] = ld<float>(q + c * qd.nb[0] + t * qd.nb[1] + (h0 + hh) * qd.nb[2] + i3 * qd.nb[3]);
    }
    int visible = !(p.post > 0.0f);  // post <= 0 turns -inf into +inf or NaN: never skip then
    for (int jj = tid; jj < len && !visible; jj += FA_THREADS)
#pragma unroll
        for (int hh = 0; hh < NH; ++hh) visible |= !masked(hh, j0 + jj);
    visible = __syncthreads_or(visible);

    if (visible) {
        auto score = [&](int hh, i64 j, float dot) -> float {
            float x = p.cx * dot;
            if (mbase) x += ld_dt(mrow(hh) + j * md.nb[0], mdt);
            if (p.n_past >= 0 && j > (i64)p.n_past + t) x = NEG_INF;
            return p.post * x;
        };
        // ---- scores: `tpp` lanes per K row; 16-byte loads, FA_UNROLL rows in flight per lane
        const int tpp = p.tpp, groups = FA_THREADS / tpp, grp = tid / tpp, gl = tid % tpp;
        const int writer = (gl & (tpp / NH - 1)) == 0;
        if (p.kvec) {
            const int c8 = hd / 8;
            float qr[NH][8];
#pragma unroll
            for (int hh = 0; hh < NH; ++hh)
#pragma unroll
                for (int i = 0; i < 8; ++i) qr[hh][i] = gl < c8 ? qs[hh][gl * 8 + i] : 0.0f;
            for (int base = 0; base < len; base += groups * FA_UNROLL) {
                float kv[FA_UNROLL][8];
#pragma unroll
                for (int u = 0; u < FA_UNROLL; ++u) {
                    const int jj = base + u * groups + grp;
                    if (jj < len && gl < c8) {
                        ld8<TK>(kb + (j0 + jj) * kd.nb[1] + gl * 8 * (i64)sizeof(TK), kv[u]);
                    } else {
#pragma unroll
                        for (int i = 0; i < 8; ++i) kv[u][i] = 0.0f;
                    }
                }
#pragma unroll
                for (int u = 0; u < FA_UNROLL; ++u) {
                    float acc[NH];
#pragma unroll
                    for (int hh = 0; hh < NH; ++hh) {
                        acc[hh] = 0.0f;
#pragma unroll
                        for (int i = 0; i < 8; ++i) acc[hh] += kv[u][i] * qr[hh][i];
                    }
                    int hh;
                    const float dot = group_sum_scatter<NH>(acc, tpp, lane, hh);
                    const int jj = base + u * groups + grp;
                    if (jj < len && writer) sc[hh][jj] = score(hh, j0 + jj, dot);
                }
            }
        } else {  // any strides: lanes of a group stride over the row
            for (int base = 0; base < len; base += groups) {
                const int jj = base + grp;
                float acc[NH];
#pragma unroll
                for (int hh = 0; hh < NH; ++hh) acc[hh] = 0.0f;
                if (jj < len) {
                    const char* krow = kb + (j0 + jj) * kd.nb[1];
                    for (int c = gl; c < hd; c += tpp) {
                        const float kx = ld<TK>(krow + c * kd.nb[0]);
#pragma unroll
                        for (int hh = 0; hh < NH; ++hh) acc[hh] += kx * qs[hh][c];
                    }
                }
                int hh;
                const float dot = group_sum_scatter<NH>(acc, tpp, lane, hh);
                if (jj < len && writer) sc[hh][jj] = score(hh, j0 + jj, dot);
            }
        }
        __syncthreads();

        // ---- the chunk's softmax statistics, one warp per head; sc becomes e^(s - m), 0 past len
        for (int hh = warp; hh < NH; hh += FA_WARPS) {
            float m = NEG_INF;
            for (int jj = lane; jj < len; jj += 32) m = max_nan(m, sc[hh][jj]);
            m = warp_max(m);
            float l = 0.0f;
            for (int jj = lane; jj < FA_MAX_CHUNK; jj += 32) {
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
        __syncthreads();

        // ---- o[d] = Σ_j e_j V[d, j]: V rows are contiguous over positions (the transposed cache)
        if (p.vvec) {  // `vl` lanes cover a row's chunk, 8 positions (16 or 32 bytes) each
            const int vl = p.chunk / 8, rows = 32 / vl, lr = lane % vl, rw = lane / vl;
            const int vwriter = (lr & (vl / NH - 1)) == 0;
            float pr[NH][8];
#pragma unroll
            for (int hh = 0; hh < NH; ++hh)
#pragma unroll
                for (int i = 0; i < 8; ++i) pr[hh][i] = sc[hh][lr * 8 + i];
            const int jj = lr * 8;
            const int full = jj + 8 <= len;
            for (int base = 0; base < hd; base += FA_WARPS * rows * FA_UNROLL) {
                float vv[FA_UNROLL][8];
#pragma unroll
                for (int u = 0; u < FA_UNROLL; ++u) {
                    const int dd = base + (u * FA_WARPS + warp) * rows + rw;
                    const char* vrow = vb + dd * vd.nb[1] + (j0 + jj) * vd.nb[0];
                    if (dd < hd && full) {
                        ld8<TK>(vrow, vv[u]);
                    } else {
#pragma unroll
                        for (int i = 0; i < 8; ++i)
                            vv[u][i] = (dd < hd && jj + i < len) ? ld<TK>(vrow + i * vd.nb[0]) : 0.0f;
                    }
                }
#pragma unroll
                for (int u = 0; u < FA_UNROLL; ++u) {
                    float acc[NH];
#pragma unroll
                    for (int hh = 0; hh < NH; ++hh) {
                        acc[hh] = 0.0f;
#pragma unroll
                        for (int i = 0; i < 8; ++i) acc[hh] += pr[hh][i] * vv[u][i];
                    }
                    int hh;
                    const float o = group_sum_scatter<NH>(acc, vl, lane, hh);
                    const int dd = base + (u * FA_WARPS + warp) * rows + rw;
                    if (dd < hd && vwriter) ws_o[(row_of(hh) * S + split) * hd + dd] = o;
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
                const float o = group_sum_scatter<NH>(acc, 32, lane, hh);
                if ((lane & (32 / NH - 1)) == 0) ws_o[(row_of(hh) * S + split) * hd + dd] = o;
            }
        }
    } else if (tid < NH) {  // nothing visible: m = -inf marks the chunk empty (o is never read)
        ws_ml[(row_of(tid) * S + split) * 2] = NEG_INF;
        ws_ml[(row_of(tid) * S + split) * 2 + 1] = 0.0f;
    }

    // ---- the last block of this (head group, token) combines the chunks
    __threadfence();
    __syncthreads();
    unsigned* counter = counters + (i64)blockIdx.z * gridDim.y + blockIdx.y;
    if (tid == 0) last = atomicAdd(counter, 1u) == (unsigned)(S - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int hh = 0; hh < NH; ++hh) {
        const float* ml = ws_ml + row_of(hh) * S * 2;
        float M = NEG_INF;
        for (int s = tid; s < S; s += FA_THREADS) M = max_nan(M, ld_cg(ml + 2 * s));
        M = block_max(M, red);
        float L = 0.0f;
        for (int s = tid; s < S; s += FA_THREADS) {
            const float m = ld_cg(ml + 2 * s);
            const float w = m == NEG_INF ? 0.0f : expf(m - M);  // an empty chunk: weight 0, o unread
            wsh[s] = w;
            L += w * ld_cg(ml + 2 * s + 1);
        }
        L = block_sum(L, red);  // its barriers also publish wsh
        const float* o = ws_o + row_of(hh) * S * hd;
        char* out = dst + t * d.nb[1] + (i64)(h0 + hh) * d.nb[2] + i3 * d.nb[3];
        for (int dd = tid; dd < hd; dd += FA_THREADS) {
            float acc = 0.0f;
            for (int s = 0; s < S; ++s)
                if (wsh[s] != 0.0f) acc += wsh[s] * ld_cg(o + (i64)s * hd + dd);
            *(float*)(out + dd * d.nb[0]) = L == 0.0f ? 0.0f : acc / L;  // fully masked: zeros
        }
        __syncthreads();  // wsh is rewritten for the next head
    }
    if (tid == 0) *counter = 0u;
}

#define GG_FA(T, S, NH)                                                                                    \
    extern "C" __global__ void __launch_bounds__(FA_THREADS)                                               \
        flash_attn_##S##_h##NH(char* dst, TDesc d, const char* q, TDesc qd, const char* k, TDesc kd,       \
                               const char* v, TDesc vd, const char* mask, TDesc md, int mdt, FaArgs p,     \
                               float* ws, unsigned* counters) {                                            \
        flash_impl<T, NH>(dst, d, q, qd, k, kd, v, vd, mask, md, mdt, p, ws, counters);                    \
    }
#define GG_FA_H(T, S) GG_FA(T, S, 1) GG_FA(T, S, 2) GG_FA(T, S, 4) GG_FA(T, S, 8)
GG_FA_H(float, f32)
GG_FA_H(f16, f16)
GG_FA_H(bf16, bf16)
