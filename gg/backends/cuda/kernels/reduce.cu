// argmax over dim 0: the index of each row's largest value, I32. numpy's rules: the first index
// wins on ties and the first NaN wins over every number. One block per row, or a long row's blocks
// of one cluster (argmax_cl_vec_*: a vocabulary row of a greedy decode step, which reads back one
// token id, not the logits).
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

// This thread's best (value, index) over runs [lo, hi) of 4 elements (VEC) or elements [lo, hi)
// of `row`, in numpy's order (bi < 0: none seen).
template <class T, bool VEC>
__device__ __forceinline__ void argmax_scan(const char* row, const TDesc& xd, i64 lo, i64 hi, float& bv, long long& bi) {
    bv = -__int_as_float(0x7f800000);
    bi = -1;
    if constexpr (VEC) {
        const int step = (int)blockDim.x * AM_UNROLL;
        for (int r0 = (int)lo + threadIdx.x; r0 < (int)hi; r0 += step) {
            float v[AM_UNROLL][4];
#pragma unroll
            for (int u = 0; u < AM_UNROLL; ++u) {
                const int r = r0 + u * (int)blockDim.x;
                if (r < (int)hi) ldg<T, 4>(row + (i64)r * 4 * (i64)sizeof(T), v[u]);
            }
#pragma unroll
            for (int u = 0; u < AM_UNROLL; ++u) {
                const int r = r0 + u * (int)blockDim.x;
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (r < (int)hi && (bi < 0 || am_better(bv, bi, v[u][e], 4LL * r + e))) { bv = v[u][e]; bi = 4LL * r + e; }
            }
        }
    } else {
        for (i64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            const float v = ld<T>(row + i * xd.nb[0]);
            if (bi < 0 || am_better(bv, bi, v, i)) { bv = v; bi = i; }
        }
    }
}

// The best of a warp's (value, index) pairs, in every lane.
__device__ __forceinline__ void argmax_warp(float& bv, long long& bi) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const long long oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || am_better(bv, bi, ov, oi))) { bv = ov; bi = oi; }
    }
}

// The block's best pair, in warp 0 (true there).
__device__ __forceinline__ bool argmax_block(float& bv, long long& bi) {
    __shared__ float sv[32];
    __shared__ long long si[32];
    argmax_warp(bv, bi);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
    __syncthreads();
    if (warp != 0) return false;
    const int nw = (blockDim.x + 31) >> 5;
    bv = lane < nw ? sv[lane] : 0.0f;
    bi = lane < nw ? si[lane] : -1;
    argmax_warp(bv, bi);
    return true;
}

template <class T, bool VEC>
__device__ __forceinline__ void argmax_impl(char* dst, const TDesc& d, const char* x, const TDesc& xd) {
    i64 i1, i2, i3;
    row_index(blockIdx.x, xd, i1, i2, i3);
    float bv;
    long long bi;
    argmax_scan<T, VEC>(x + row_offs(xd, i1, i2, i3), xd, 0, VEC ? xd.ne[0] / 4 : xd.ne[0], bv, bi);
    if (argmax_block(bv, bi) && (threadIdx.x & 31) == 0) *(int*)(dst + row_offs(d, i1, i2, i3)) = (int)bi;
}

// A row in C blocks (VEC, ne0 < 2^31): block s of the row's C (blockIdx.x = row * C + s) scans a
// C-th of its runs; with C > 1 (sm_90) the C blocks are one cluster, and the first reads the
// others' best pairs from their shared memory (a vocabulary row: one block of 1024 threads had
// three rounds of loads to go through, the cluster one).
template <class T>
__device__ __forceinline__ void argmax_cl_impl(char* dst, const TDesc& d, const char* x, const TDesc& xd, int C) {
    __shared__ float best[2];  // this block's value and index (as float bits: ld_cluster loads floats)
    const int row = (int)(blockIdx.x / (unsigned)C), s = (int)(blockIdx.x - (unsigned)row * (unsigned)C);
    i64 i1, i2, i3;
    row_index(row, xd, i1, i2, i3);
    const i64 runs = xd.ne[0] / 4, per = (runs + C - 1) / C, lo = min(runs, s * per);
    float bv;
    long long bi;
    argmax_scan<T, true>(x + row_offs(xd, i1, i2, i3), xd, lo, min(runs, lo + per), bv, bi);
    const bool first = argmax_block(bv, bi) && (threadIdx.x & 31) == 0;
#if GG_CLUSTERS
    if (C > 1) {
        if (first) {
            best[0] = bv;
            best[1] = __int_as_float((int)bi);
        }
        cluster_sync();  // every block's pair in its shared memory
        if (s == 0 && threadIdx.x < 32) {
            const int lane = threadIdx.x;
            bv = lane < C ? ld_cluster(&best[0], (unsigned)lane) : 0.0f;
            bi = lane < C ? (long long)__float_as_int(ld_cluster(&best[1], (unsigned)lane)) : -1;
            argmax_warp(bv, bi);
            if (lane == 0) *(int*)(dst + row_offs(d, i1, i2, i3)) = (int)bi;
        }
        cluster_sync();  // the others are done reading this block's pair
        return;
    }
#endif
    if (first) *(int*)(dst + row_offs(d, i1, i2, i3)) = (int)bi;
}

#define GG_ARGMAX(T, S)                                                                            \
    extern "C" __global__ void argmax_##S(char* dst, TDesc d, const char* x, TDesc xd) {           \
        gg_grid_sync();                                                                           \
        argmax_impl<T, false>(dst, d, x, xd);                                                      \
    }                                                                                             \
    extern "C" __global__ void argmax_vec_##S(char* dst, TDesc d, const char* x, TDesc xd) {       \
        gg_grid_sync();                                                                           \
        argmax_impl<T, true>(dst, d, x, xd);                                                       \
    }                                                                                             \
    extern "C" __global__ void argmax_cl_vec_##S(char* dst, TDesc d, const char* x, TDesc xd, int C) { \
        gg_grid_sync();                                                                           \
        argmax_cl_impl<T>(dst, d, x, xd, C);                                                       \
    }
GG_ARGMAX(float, f32)
GG_ARGMAX(f16, f16)
GG_ARGMAX(bf16, bf16)
