// rms_norm and norm over dim 0, optionally fused with "* w" and "+ c" (the rms_norm -> mul -> add
// chains of a transformer block). One block per row; statistics in fp32, norm is two-pass.
// w and c broadcast over the row like ggml's binary ops; their dtypes are runtime codes.
#include "common.cuh"

template <bool RMS, class T>
__device__ __forceinline__ void norm_impl(char* dst, const TDesc& d, const char* x, const TDesc& xd, float eps,
                                          const char* w, const TDesc& wd, int wdt, const char* c,
                                          const TDesc& cd, int cdt) {
    __shared__ float sh[32];
    i64 i1, i2, i3;
    row_index(blockIdx.x, d, i1, i2, i3);
    const char* xrow = x + row_offs(xd, i1, i2, i3);
    char* drow = dst + row_offs(d, i1, i2, i3);
    const i64 n = d.ne[0];

    float mean = 0.0f;
    if (!RMS) {
        float s = 0.0f;
        for (i64 i0 = threadIdx.x; i0 < n; i0 += blockDim.x) s += ld<T>(xrow + i0 * xd.nb[0]);
        mean = block_sum(s, sh) / (float)n;
    }
    float ss = 0.0f;
    for (i64 i0 = threadIdx.x; i0 < n; i0 += blockDim.x) {
        const float v = ld<T>(xrow + i0 * xd.nb[0]) - mean;
        ss += v * v;
    }
    const float inv = 1.0f / sqrtf(block_sum(ss, sh) / (float)n + eps);

    for (i64 i0 = threadIdx.x; i0 < n; i0 += blockDim.x) {
        float y = (ld<T>(xrow + i0 * xd.nb[0]) - mean) * inv;
        if (w) y *= ld_dt(w + bcast_offs(wd, i0, i1, i2, i3), wdt);
        if (c) y += ld_dt(c + bcast_offs(cd, i0, i1, i2, i3), cdt);
        st<T>(drow + i0 * d.nb[0], y);
    }
}

#define GG_NORM(NAME, RMS, T, S)                                                                     \
    extern "C" __global__ void NAME##_##S(char* dst, TDesc d, const char* x, TDesc xd, float eps,    \
                                          const char* w, TDesc wd, int wdt, const char* c, TDesc cd, \
                                          int cdt) {                                                \
        norm_impl<RMS, T>(dst, d, x, xd, eps, w, wd, wdt, c, cd, cdt);                               \
    }

GG_NORM(rms_norm, true, float, f32)
GG_NORM(rms_norm, true, f16, f16)
GG_NORM(rms_norm, true, bf16, bf16)
GG_NORM(norm, false, float, f32)
GG_NORM(norm, false, f16, f16)
GG_NORM(norm, false, bf16, bf16)
