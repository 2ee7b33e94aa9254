// Softmax over dim 0 in one kernel that also covers the fused groups:
//   t = cx * x;  t += slope * mask (optional);  t = -inf where col > n_past + row (n_past >= 0);
//   y = softmax(post * t)
// soft_max_ext: cx = scale, post = 1, slope = ALiBi slope of head i2 (1 without max_bias);
// scale -> add -> soft_max: cx = s, slope = 1, post = soft_max's scale; scale -> diag_mask_inf ->
// soft_max: cx = s, n_past, post = soft_max's scale. A fully masked row gives zeros (as the CPU).
// One block per row. soft_max_f32 caches the row's t values in dynamic shared memory when they
// fit (any length); soft_max_r<NPT>_f32 keeps NPT values per thread in registers (rows up to
// NPT * blockDim.x), with 16-byte loads and stores when the host says the rows allow it (`vec`).
#include "common.cuh"

// This block's row: x and dst row pointers, the mask row (or null), the ALiBi slope of head i2.
struct SmRow {
    const char* x;
    char* dst;
    const char* mask;
    float slope;
    i64 i1;
};

__device__ __forceinline__ SmRow sm_row(char* dst, const TDesc& d, const char* x, const TDesc& xd, const char* m,
                                        const TDesc& md, float max_bias, float m0, float m1, int n_head_log2) {
    i64 i1, i2, i3;
    row_index(blockIdx.x, d, i1, i2, i3);
    SmRow r;
    r.x = x + row_offs(xd, i1, i2, i3);
    r.dst = dst + row_offs(d, i1, i2, i3);
    r.mask = m ? m + row_offs(md, i1 % md.ne[1], i2 % md.ne[2], i3 % md.ne[3]) : nullptr;
    r.slope = 1.0f;
    if (max_bias > 0.0f) {
        const int h = (int)i2;
        r.slope = h < n_head_log2 ? powf(m0, (float)(h + 1)) : powf(m1, (float)(2 * (h - n_head_log2) + 1));
    }
    r.i1 = i1;
    return r;
}


template <class TD>
__device__ __forceinline__ void soft_max_smem(char* dst, const TDesc& d, const char* x, const TDesc& xd,
                                              const char* m, const TDesc& md, int mdt, float cx, float post,
                                              int n_past, float max_bias, float m0, float m1, int n_head_log2,
                                              int cache) {
    extern __shared__ float row[];
    __shared__ float sh[32];
    const SmRow R = sm_row(dst, d, x, xd, m, md, max_bias, m0, m1, n_head_log2);
    const char* xrow = R.x;
    char* drow = R.dst;
    const char* mrow = R.mask;
    const float slope = R.slope;
    const i64 i1 = R.i1, n = d.ne[0];
    const float NEG_INF = -__int_as_float(0x7f800000);

    const bool mfull = md.ne[0] == n;  // the usual case: no 64-bit modulo per element
    // value() recomputes t when the row does not fit in shared memory.
    auto value = [&](i64 i0) -> float {
        float t = cx * ld<float>(xrow + i0 * xd.nb[0]);
        if (mrow) t += slope * ld_dt(mrow + (mfull ? i0 : i0 % md.ne[0]) * md.nb[0], mdt);
        if (n_past >= 0 && i0 > (i64)n_past + i1) t = NEG_INF;
        return post * t;
    };

    float mx = NEG_INF;
    for (i64 i0 = threadIdx.x; i0 < n; i0 += blockDim.x) {
        const float v = value(i0);
        if (cache) row[i0] = v;
        mx = max_nan(mx, v);
    }
    mx = block_max(mx, sh);
    if (mx == NEG_INF) {  // fully masked row
        for (i64 i0 = threadIdx.x; i0 < n; i0 += blockDim.x) st<TD>(drow + i0 * d.nb[0], 0.0f);
        return;
    }
    float sum = 0.0f;
    for (i64 i0 = threadIdx.x; i0 < n; i0 += blockDim.x) {
        const float e = expf((cache ? row[i0] : value(i0)) - mx);
        if (cache) row[i0] = e;
        sum += e;
    }
    const float inv = 1.0f / block_sum(sum, sh);
    for (i64 i0 = threadIdx.x; i0 < n; i0 += blockDim.x) {
        const float e = cache ? row[i0] : expf(value(i0) - mx);
        st<TD>(drow + i0 * d.nb[0], e * inv);
    }
}

// Registers instead of shared memory: thread t owns elements t*4 + q (+ g * 4 * blockDim.x) with
// vec, else t + j * blockDim.x. One global read of x and the mask, one write of y.
template <int NPT, class TD>
__device__ __forceinline__ void soft_max_reg(char* dst, const TDesc& d, const char* x, const TDesc& xd,
                                             const char* m, const TDesc& md, int mdt, float cx, float post,
                                             int n_past, float max_bias, float m0, float m1, int n_head_log2,
                                             int vec) {
    __shared__ float sh[32];
    const SmRow R = sm_row(dst, d, x, xd, m, md, max_bias, m0, m1, n_head_log2);
    const char* xrow = R.x;
    char* drow = R.dst;
    const char* mrow = R.mask;
    const float slope = R.slope;
    const i64 i1 = R.i1, n = d.ne[0];
    const float NEG_INF = -__int_as_float(0x7f800000);
    const bool mfull = md.ne[0] == n;
    const i64 limit = n_past >= 0 ? (i64)n_past + i1 : n;  // causal: columns past this are masked

    // slot j -> column: with vec, thread t owns columns 4t..4t+3 of each 4*blockDim.x wide group
    auto col = [&](int j) -> i64 {
        return vec ? ((j / 4) * (i64)blockDim.x + threadIdx.x) * 4 + (j % 4) : j * (i64)blockDim.x + threadIdx.x;
    };
    // vec == 2: the mask rows too are F32, full length and 16-byte aligned
    float v[NPT], mv[NPT];
    if (vec) {  // n % 4 == 0 and rows 16-byte aligned: a group is either all in or all out
#pragma unroll
        for (int g = 0; g < NPT / 4; ++g) {
            const i64 i0 = col(4 * g);
            if (i0 < n) {
                const V16 q = ld16_cs(xrow + i0 * 4);
#pragma unroll
                for (int k = 0; k < 4; ++k) v[4 * g + k] = __uint_as_float(q.w[k]);
                if (vec == 2) {
                    const V16 r = *(const V16*)(mrow + i0 * 4);
#pragma unroll
                    for (int k = 0; k < 4; ++k) mv[4 * g + k] = __uint_as_float(r.w[k]);
                }
            }
        }
    }
    float mx = NEG_INF;
#pragma unroll
    for (int j = 0; j < NPT; ++j) {
        const i64 i0 = col(j);
        float t = NEG_INF;
        if (i0 < n) {
            t = cx * (vec ? v[j] : ld<float>(xrow + i0 * xd.nb[0]));
            if (vec == 2) t += slope * mv[j];
            else if (mrow) t += slope * ld_dt(mrow + (mfull ? i0 : i0 % md.ne[0]) * md.nb[0], mdt);
            if (i0 > limit) t = NEG_INF;
            t *= post;
        }
        v[j] = t;
        mx = max_nan(mx, t);
    }
    mx = block_max(mx, sh);
    if (mx == NEG_INF) {  // fully masked row
#pragma unroll
        for (int j = 0; j < NPT; ++j) v[j] = 0.0f;
    } else {
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < NPT; ++j) {
            v[j] = expf(v[j] - mx);  // padding slots are -inf: they add 0
            sum += v[j];
        }
        const float inv = 1.0f / block_sum(sum, sh);
#pragma unroll
        for (int j = 0; j < NPT; ++j) v[j] *= inv;
    }
    if (vec) {  // dst rows are contiguous and 16-byte aligned too: 4 values per store
#pragma unroll
        for (int g = 0; g < NPT / 4; ++g) {
            const i64 i0 = col(4 * g);
            if (i0 < n) {
                if (sizeof(TD) == 4) st16_cs(drow + i0 * 4, pack16<float>(v + 4 * g));
                else stg<TD, 4>(drow + i0 * (i64)sizeof(TD), v + 4 * g);
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < NPT; ++j) {
            const i64 i0 = col(j);
            if (i0 < n) st<TD>(drow + i0 * d.nb[0], v[j]);
        }
    }
}

// Output dtype S: f32 (the op), or f16 / bf16 when the planner folded a cast of the result into
// the step (the F16 operand of a cuBLAS product).
#define GG_SOFTMAX_REG(NPT, TD, S)                                                                           \
    extern "C" __global__ void soft_max_r##NPT##_##S(char* dst, TDesc d, const char* x, TDesc xd,            \
                                                     const char* m, TDesc md, int mdt, float cx, float post, \
                                                     int n_past, float max_bias, float m0, float m1,         \
                                                     int n_head_log2, int vec) {                             \
        gg_grid_sync();                                                                                      \
        soft_max_reg<NPT, TD>(dst, d, x, xd, m, md, mdt, cx, post, n_past, max_bias, m0, m1, n_head_log2,    \
                              vec);                                                                          \
    }
#define GG_SOFTMAX(TD, S)                                                                                    \
    extern "C" __global__ void soft_max_##S(char* dst, TDesc d, const char* x, TDesc xd, const char* m,      \
                                            TDesc md, int mdt, float cx, float post, int n_past,             \
                                            float max_bias, float m0, float m1, int n_head_log2, int cache) { \
        gg_grid_sync();                                                                                       \
        soft_max_smem<TD>(dst, d, x, xd, m, md, mdt, cx, post, n_past, max_bias, m0, m1, n_head_log2, cache); \
    }                                                                                                        \
    GG_FOR_SOFTMAX_NPT(GG_SOFTMAX_REG, TD, S)  /* values per thread: families/softmax.py NPT, as -D */
GG_SOFTMAX(float, f32)
GG_SOFTMAX(f16, f16)
GG_SOFTMAX(bf16, bf16)
