// add / sub / mul / div with ggml's broadcast: src1 repeats over src0 (indices modulo src1.ne).
// Launch: block (tx, ty), each y-slice of the block handles one row of dst (rows over dims 1..3),
// a long row shared by gridDim.y blocks. `vec`: Group<TA, TB>::G elements per access (host-
// checked: contiguous 16-byte aligned rows of equal length, a multiple of 8).
#include "common.cuh"

enum { OP_ADD = 0, OP_SUB = 1, OP_MUL = 2, OP_DIV = 3 };

template <int OP> __device__ __forceinline__ float binop(float x, float y) {
    if (OP == OP_ADD) return x + y;
    if (OP == OP_SUB) return x - y;
    if (OP == OP_MUL) return x * y;
    return x / y;
}

template <int OP, class TA, class TB>
__device__ __forceinline__ void binary_impl(char* dst, const TDesc& d, const char* a, const TDesc& ad,
                                            const char* b, const TDesc& bd, int vec) {
    const i64 rows = d.ne[1] * d.ne[2] * d.ne[3];
    const i64 r = (i64)blockIdx.x * blockDim.y + threadIdx.y;
    if (r >= rows) return;
    i64 i1, i2, i3;
    row_index(r, d, i1, i2, i3);
    char* drow = dst + row_offs(d, i1, i2, i3);
    const char* arow = a + row_offs(ad, i1, i2, i3);
    const char* brow = b + row_offs(bd, i1 % bd.ne[1], i2 % bd.ne[2], i3 % bd.ne[3]);
    const i64 start = (i64)blockIdx.y * blockDim.x + threadIdx.x, stride = (i64)gridDim.y * blockDim.x;
    if (vec) {
        constexpr int G = Group<TA, TB>::G;
        for (i64 c = start; c < d.ne[0] / G; c += stride) {
            float x[G], y[G];
            ldg<TA, G>(arow + c * G * (i64)sizeof(TA), x);
            ldg<TB, G>(brow + c * G * (i64)sizeof(TB), y);
#pragma unroll
            for (int i = 0; i < G; ++i) x[i] = binop<OP>(x[i], y[i]);
            stg<TA, G>(drow + c * G * (i64)sizeof(TA), x);
        }
        return;
    }
    const bool full = bd.ne[0] == d.ne[0];  // no modulo in the inner loop for the common case
    for (i64 i0 = start; i0 < d.ne[0]; i0 += stride) {
        const i64 j0 = full ? i0 : i0 % bd.ne[0];
        const float x = ld<TA>(arow + i0 * ad.nb[0]);
        const float y = ld<TB>(brow + j0 * bd.nb[0]);
        st<TA>(drow + i0 * d.nb[0], binop<OP>(x, y));
    }
}

#define GG_BINARY(NAME, OP, TA, SA, TB, SB)                                                       \
    extern "C" __global__ void NAME##_##SA##_##SB(char* dst, TDesc d, const char* a, TDesc ad,    \
                                                  const char* b, TDesc bd, int vec) {             \
        gg_grid_sync();                                                                           \
        binary_impl<OP, TA, TB>(dst, d, a, ad, b, bd, vec);                                       \
    }

#define GG_BINARY_B(NAME, OP, TA, SA) \
    GG_BINARY(NAME, OP, TA, SA, float, f32) GG_BINARY(NAME, OP, TA, SA, f16, f16) GG_BINARY(NAME, OP, TA, SA, bf16, bf16)

#define GG_BINARY_AB(NAME, OP) \
    GG_BINARY_B(NAME, OP, float, f32) GG_BINARY_B(NAME, OP, f16, f16) GG_BINARY_B(NAME, OP, bf16, bf16)

GG_BINARY_AB(add, OP_ADD)
GG_BINARY_AB(sub, OP_SUB)
GG_BINARY_AB(mul, OP_MUL)
GG_BINARY_AB(div, OP_DIV)
