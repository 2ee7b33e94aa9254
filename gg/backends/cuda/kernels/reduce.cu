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

template <class T>
__device__ __forceinline__ void argmax_impl(char* dst, const TDesc& d, const char* x, const TDesc& xd) {
    __shared__ float sv[32];
    __shared__ long long si[32];
    i64 i1, i2, i3;
    row_index(blockIdx.x, xd, i1, i2, i3);
    const char* row = x + row_offs(xd, i1, i2, i3);
    float bv = -__int_as_float(0x7f800000);
    long long bi = -1;
    for (i64 i = threadIdx.x; i < xd.ne[0]; i += blockDim.x) {
        const float v = ld<T>(row + i * xd.nb[0]);
        if (bi < 0 || am_better(bv, bi, v, i)) { bv = v; bi = i; }
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
        argmax_impl<T>(dst, d, x, xd);                                                             \
    }
GG_ARGMAX(float, f32)
GG_ARGMAX(f16, f16)
GG_ARGMAX(bf16, bf16)
