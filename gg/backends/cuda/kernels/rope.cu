// Rotary position embedding, ggml's NORMAL (pairs 2i, 2i+1) and NEOX (pairs i, i + n_dims/2) modes.
// One y-slice of the block per row (i1 = head, i2 = token, i3): head_dim rows are short, and a
// block per row spent more on its own start-up than on the row. Dims >= n_dims pass through. The angle is built
// in double (positions reach thousands of radians, where a float angle loses ~1e-4 of accuracy)
// from the host's float64 table of frequencies (freq_scale * freq_base^(-2i / n_dims)), reduced
// to [-pi, pi] in double, and only then handed to the float sincosf: a double sincos, pow or exp2
// per element made this kernel FP64-bound, far below the memory roof. With `vec` (host-checked:
// contiguous rows aligned to 4 elements, n_dims % 8 == 0, ne0 % 4 == 0) a thread moves 4
// elements per access (T=512 prefill q+k: one pair per thread and two 4-byte accesses per pair
// ran at half the memory roof).
#include "common.cuh"

template <class T>
__device__ __forceinline__ void rope_impl(char* dst, const TDesc& d, const char* x, const TDesc& xd,
                                          const char* pos, i64 pos_nb0, int n_dims, int mode,
                                          const double* freqs, int vec) {
    const i64 r = (i64)blockIdx.x * blockDim.y + threadIdx.y;  // blockDim.y rows per block
    if (r >= d.ne[1] * d.ne[2] * d.ne[3]) return;
    i64 i1, i2, i3;
    row_index(r, d, i1, i2, i3);
    const char* xrow = x + row_offs(xd, i1, i2, i3);
    char* drow = dst + row_offs(d, i1, i2, i3);
    const int half = n_dims / 2;
    const double two_pi = 6.283185307179586;
    if (vec) {  // 4 elements per thread and access: two NORMAL pairs, or four NEOX pairs' halves
        const int rot = mode == 2 ? half / 4 : n_dims / 4, work = rot + (int)(d.ne[0] - n_dims) / 4;
        for (int t = threadIdx.x; t < work; t += blockDim.x) {
            if (t >= rot) {
                const int j = n_dims + (t - rot) * 4;
                float v[4];
                ldg<T, 4>(xrow + j * (int)sizeof(T), v);
                stg<T, 4>(drow + j * (int)sizeof(T), v);
                continue;
            }
            const int j0 = 4 * t, j1 = mode == 2 ? j0 + half : j0;  // NORMAL: j1 unused
            float a[4], b[4];
            ldg<T, 4>(xrow + j0 * (int)sizeof(T), a);
            if (mode == 2) ldg<T, 4>(xrow + j1 * (int)sizeof(T), b);
            const double p = (double)*(const int*)(pos + i2 * pos_nb0);
            auto rot2 = [&](int i, float x0, float x1, float& o0, float& o1) {  // pair i by p * freqs[i]
                const double theta = p * freqs[i];
                const float r = (float)(theta - two_pi * rint(theta * (1.0 / two_pi)));
                float sn, cs;
                sincosf(r, &sn, &cs);
                o0 = x0 * cs - x1 * sn;
                o1 = x0 * sn + x1 * cs;
            };
            float y[4], z[4];
            if (mode == 2) {
#pragma unroll
                for (int k = 0; k < 4; ++k) rot2(j0 + k, a[k], b[k], y[k], z[k]);
            } else {
#pragma unroll
                for (int k = 0; k < 2; ++k) rot2(2 * t + k, a[2 * k], a[2 * k + 1], y[2 * k], y[2 * k + 1]);
            }
            stg<T, 4>(drow + j0 * (int)sizeof(T), y);
            if (mode == 2) stg<T, 4>(drow + j1 * (int)sizeof(T), z);
        }
        return;
    }
    const i64 work = half + (d.ne[0] - n_dims);
    for (i64 t = threadIdx.x; t < work; t += blockDim.x) {
        if (t < half) {
            const i64 j0 = mode == 2 ? t : 2 * t;
            const i64 j1 = mode == 2 ? t + half : 2 * t + 1;
            // The position is loaded with x, not before: the short rows of a decode step then
            // wait for one memory round trip instead of two.
            const float x0 = ld<T>(xrow + j0 * xd.nb[0]), x1 = ld<T>(xrow + j1 * xd.nb[0]);
            const double p = (double)*(const int*)(pos + i2 * pos_nb0);
            const double theta = p * freqs[t];
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
                                        i64 pos_nb0, int n_dims, int mode, const double* freqs,        \
                                        int vec) {                                                     \
        gg_grid_sync();                                                                                \
        rope_impl<T>(dst, d, x, xd, pos, pos_nb0, n_dims, mode, freqs, vec);                            \
    }

GG_ROPE(float, f32)
GG_ROPE(f16, f16)
