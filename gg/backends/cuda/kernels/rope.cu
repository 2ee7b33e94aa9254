// Rotary position embedding, ggml's NORMAL (pairs 2i, 2i+1) and NEOX (pairs i, i + n_dims/2) modes.
// One y-slice of the block per row (i1 = head, i2 = token, i3): head_dim rows are short, and a
// block per row spent more on its own start-up than on the row. Dims >= n_dims pass through. The angle is built
// in double (positions reach thousands of radians, where a float angle loses ~1e-4 of accuracy),
// reduced to [-pi, pi] in double, and only then handed to the float sincosf: a double sincos and
// pow per element made this kernel compute-bound at a quarter of the memory roof.
#include "common.cuh"

template <class T>
__device__ __forceinline__ void rope_impl(char* dst, const TDesc& d, const char* x, const TDesc& xd,
                                          const char* pos, i64 pos_nb0, int n_dims, int mode,
                                          double log2_base, double freq_scale) {
    const i64 r = (i64)blockIdx.x * blockDim.y + threadIdx.y;  // blockDim.y rows per block
    if (r >= d.ne[1] * d.ne[2] * d.ne[3]) return;
    i64 i1, i2, i3;
    row_index(r, d, i1, i2, i3);
    const char* xrow = x + row_offs(xd, i1, i2, i3);
    char* drow = dst + row_offs(d, i1, i2, i3);
    const int half = n_dims / 2;
    const i64 work = half + (d.ne[0] - n_dims);
    for (i64 t = threadIdx.x; t < work; t += blockDim.x) {
        if (t < half) {
            const i64 j0 = mode == 2 ? t : 2 * t;
            const i64 j1 = mode == 2 ? t + half : 2 * t + 1;
            // The position is loaded with x, not before: the short rows of a decode step then
            // wait for one memory round trip instead of two.
            const float x0 = ld<T>(xrow + j0 * xd.nb[0]), x1 = ld<T>(xrow + j1 * xd.nb[0]);
            const double p = (double)*(const int*)(pos + i2 * pos_nb0);
            const double theta = p * freq_scale * exp2(-2.0 * (double)t / (double)n_dims * log2_base);
            const double two_pi = 6.283185307179586;
            const float r = (float)(theta - two_pi * rint(theta * (1.0 / two_pi)));
            float sn, cs;
            sincosf(r, &sn, &cs);
            st<T>(drow + j0 * d.nb[0], (float)(x0 * cs - x1 * sn));
            st<T>(drow + j1 * d.nb[0], (float)(x0 * sn + x1 * cs));
        } else {
            const i64 j = n_dims + (t - half);
            st<T>(drow + j * d.nb[0], ld<T>(xrow + j * xd.nb[0]));
        }
    }
}

#define GG_ROPE(T, S)                                                                                  \
    extern "C" __global__ void rope_##S(char* dst, TDesc d, const char* x, TDesc xd, const char* pos,  \
                                        i64 pos_nb0, int n_dims, int mode, double log2_base,           \
                                        double freq_scale) {                                           \
        rope_impl<T>(dst, d, x, xd, pos, pos_nb0, n_dims, mode, log2_base, freq_scale);                 \
    }

GG_ROPE(float, f32)
GG_ROPE(f16, f16)
