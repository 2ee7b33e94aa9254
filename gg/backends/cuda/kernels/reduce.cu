// argmax over dim 0: the index of each row's largest value, I32. numpy's rules: the first index
// wins on ties and the first NaN wins over every number. One block per row (a vocabulary row of a
// greedy decode step: the step reads back one token id, not the logits).
#include "common.cuh"

// (value, index) pairs: b beats a when it is "larger" by numpy's argmax order.
__device__ __forceinline__ bool am_better(float av, long long ai, float bv, long long bi) {
    const bool an = av != av, bn = bv != bv;
    if (an || bn) return bn && (!an || bi < ai);  // a NaN wins; between NaNs the first
    return bv > av || (bv == av && bi < ai);
}

// VEC (rows_aligned, ne0 % 4 == 0): each thread loads AM_UNROLL runs of 4 elements before comparing
// any, so a vocabulary row is a few rounds of loads in flight rather than ne0 / blockDim dependent
// loads (49152 logits, one block of 1024 threads on an H100: 15.8 us -> see docs/performance.md).
#define AM_UNROLL 4
template <class T, bool VEC>
__device__ __forceinline__ void argmax_impl(char* dst, const TDesc& d, const char* x, const TDesc& xd) {
    __shared__ float sv[32];
    __shared__ long long si[32];
    i64 i1, i2, i3;
    row_index(blockIdx.x, xd, i1, i2, i3);
    const char* row = x + row_offs(xd, i1, i2, i3);
    float bv = -__int_as_float(0x7f800000);
    long long bi = -1;
    if constexpr (VEC) {
        const int runs = (int)(xd.ne[0] / 4), step = (int)blockDim.x * AM_UNROLL;
        for (int r0 = threadIdx.x; r0 < runs; r0 += step) {
            float v[AM_UNROLL][4];
#pragma unroll
            for (int u = 0; u < AM_UNROLL; ++u) {
                const int r = r0 + u * (int)blockDim.x;
                if (r < runs) ldg<T, 4>(row + (i64)r * 4 * (i64)sizeof(T), v[u]);
            }
#pragma unroll
            for (int u = 0; u < AM_UNROLL; ++u) {
                const int r = r0 + u * (int)blockDim.x;
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (r < runs && (bi < 0 || am_better(bv, bi, v[u][e], 4LL * r + e))) { bv = v[u][e]; bi = 4LL * r + e; }
            }
        }
    } else {
        for (i64 i = threadIdx.x; i < xd.ne[0]; i += blockDim.x) {
            const float v = ld<T>(row + i * xd.nb[0]);
            if (bi < 0 || am_better(bv, bi, v, i)) { bv = v; bi = i; }
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const long long oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || am_better(bv, bi, ov, oi))) { bv = ov; bi = oi; }
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        const int nw = (blockDim.x + 31) >> 5;
        bv = lane < nw ? sv[lane] : 0.0f;
        bi = lane < nw ? si[lane] : -1;
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const long long oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi >= 0 && (bi < 0 || am_better(bv, bi, ov, oi))) { bv = ov; bi = oi; }
        }
        if (lane == 0) *(int*)(dst + row_offs(d, i1, i2, i3)) = (int)bi;
    }
}

#define GG_ARGMAX(T, S)                                                                            \
    extern "C" __global__ void argmax_##S(char* dst, TDesc d, const char* x, TDesc xd) {           \
        gg_grid_sync();                                                                           \
        argmax_impl<T, false>(dst, d, x, xd);                                                      \
    }                                                                                             \
    extern "C" __global__ void argmax_vec_##S(char* dst, TDesc d, const char* x, TDesc xd) {       \
        gg_grid_sync();                                                                           \
        argmax_impl<T, true>(dst, d, x, xd);                                                       \
    }
GG_ARGMAX(float, f32)
GG_ARGMAX(f16, f16)
GG_ARGMAX(bf16, bf16)
