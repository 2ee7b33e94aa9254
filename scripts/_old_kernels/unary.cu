// Elementwise ops of one source, same dtype in and out: scale, silu, gelu (tanh), diag_mask_inf.
// Same launch shape and `vec` path as binary.cu.
#include "common.cuh"

enum { OP_SCALE = 0, OP_SILU = 1, OP_GELU = 2, OP_DIAG_MASK_INF = 3 };

template <int OP> __device__ __forceinline__ float unop(float x, float s, i64 i0, i64 i1, int n_past) {
    if (OP == OP_SCALE) return x * s;
    if (OP == OP_SILU) return x / (1.0f + expf(-x));
    if (OP == OP_GELU) {
        const float k = 0.7978845608028654f;  // sqrt(2 / pi)
        return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
    }
    // diag_mask_inf: the causal mask, col > n_past + row -> -inf
    return i0 > (i64)n_past + i1 ? -__int_as_float(0x7f800000) : x;
}

template <int OP, class T>
__device__ __forceinline__ void unary_impl(char* dst, const TDesc& d, const char* a, const TDesc& ad,
                                           float s, int n_past, int vec) {
    const i64 rows = d.ne[1] * d.ne[2] * d.ne[3];
    const i64 r = (i64)blockIdx.x * blockDim.y + threadIdx.y;
    if (r >= rows) return;
    i64 i1, i2, i3;
    row_index(r, d, i1, i2, i3);
    char* drow = dst + row_offs(d, i1, i2, i3);
    const char* arow = a + row_offs(ad, i1, i2, i3);
    const i64 start = (i64)blockIdx.y * blockDim.x + threadIdx.x, stride = (i64)gridDim.y * blockDim.x;
    if (vec) {
        constexpr int G = Group<T>::G;
        for (i64 c = start; c < d.ne[0] / G; c += stride) {
            float x[G];
            ldg<T, G>(arow + c * G * (i64)sizeof(T), x);
#pragma unroll
            for (int i = 0; i < G; ++i) x[i] = unop<OP>(x[i], s, c * G + i, i1, n_past);
            stg<T, G>(drow + c * G * (i64)sizeof(T), x);
        }
        return;
    }
    for (i64 i0 = start; i0 < d.ne[0]; i0 += stride) {
        st<T>(drow + i0 * d.nb[0], unop<OP>(ld<T>(arow + i0 * ad.nb[0]), s, i0, i1, n_past));
    }
}

#define GG_UNARY(NAME, OP, T, S)                                                                   \
    extern "C" __global__ void NAME##_##S(char* dst, TDesc d, const char* a, TDesc ad, float s,    \
                                          int n_past, int vec) {                                  \
        gg_grid_sync();                                                                           \
        unary_impl<OP, T>(dst, d, a, ad, s, n_past, vec);                                          \
    }

#define GG_UNARY_T(NAME, OP) GG_UNARY(NAME, OP, float, f32) GG_UNARY(NAME, OP, f16, f16) GG_UNARY(NAME, OP, bf16, bf16)

GG_UNARY_T(scale, OP_SCALE)
GG_UNARY_T(silu, OP_SILU)
GG_UNARY_T(gelu, OP_GELU)
GG_UNARY_T(diag_mask_inf, OP_DIAG_MASK_INF)
