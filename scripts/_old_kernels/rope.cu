// Rotary position embedding, ggml's NORMAL (pairs 2i, 2i+1) and NEOX (pairs i, i + n_dims/2) modes.
// One y-slice of the block per row (i1 = head, i2 = token, i3): head_dim rows are short, and a
// block per row spent more on its own start-up than on the row. Dims >= n_dims pass through. The
// rotation is common.cuh's rope_pair, with the host's float64 table of frequencies
// (freq_scale * freq_base^(-2i / n_dims)): a double pow or exp2 per element made this kernel
// FP64-bound, far below the memory roof. With `vec` (host-checked:
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
            float y[4], z[4];
            if (mode == 2) {
#pragma unroll
                for (int k = 0; k < 4; ++k) rope_pair(p, freqs[j0 + k], a[k], b[k], y[k], z[k]);
            } else {
#pragma unroll
                for (int k = 0; k < 2; ++k) rope_pair(p, freqs[2 * t + k], a[2 * k], a[2 * k + 1], y[2 * k], y[2 * k + 1]);
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
            float o0, o1;
            rope_pair((double)*(const int*)(pos + i2 * pos_nb0), freqs[t], x0, x1, o0, o1);
            st<T>(drow + j0 * d.nb[0], o0);
            st<T>(drow + j1 * d.nb[0], o1);
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
