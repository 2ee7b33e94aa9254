// Experimental, specialized builds of gg's bandwidth-bound kernels, timed by scripts/kexp.py
// against the real ones: contiguous F32 rows (F16 weights for the mat-vec), sizes as template
// parameters. A tuning aid: whatever wins moves into gg/backends/cuda/kernels with tests.
#include "common.cuh"

// ---- mat-vec: dst[m] = sum_k a[m, k] * x[k], a F16 [M, K] rows of lda bytes, x F32 [K].
// TPR threads per row (<= 32: several rows per warp; > 32: several warps per row, reduced
// through shared memory), R rows per block, BATCH 16-byte loads of a per thread in flight.
template <int TPR, int R, int BATCH>
__device__ __forceinline__ void mmvx(float* dst, const char* a, i64 lda, const char* x, int M, int K) {
    __shared__ float part[R][TPR > 32 ? TPR / 32 : 1];
    const int t = threadIdx.x % TPR, r = threadIdx.x / TPR;
    const i64 m = (i64)blockIdx.x * R + r;
    const bool live = m < M;
    const char* arow = a + (live ? m : 0) * lda;
    const int chunks = live ? K / 8 : 0;
    float acc = 0.0f;
    for (int c0 = t; c0 < chunks; c0 += BATCH * TPR) {
        V16 av[BATCH];
#pragma unroll
        for (int u = 0; u < BATCH; ++u) {
            const int c = c0 + u * TPR;
            if (c < chunks) av[u] = ld16_cs(arow + (i64)c * 16);
        }
#pragma unroll
        for (int u = 0; u < BATCH; ++u) {
            const int c = c0 + u * TPR;
            if (c < chunks) {
                float w[8], xv[8];
                unpack16<f16>(av[u], w);
                ld8<float>(x + (i64)c * 32, xv);
#pragma unroll
                for (int i = 0; i < 8; ++i) acc += w[i] * xv[i];
            }
        }
    }
    constexpr int W = TPR < 32 ? TPR : 32;
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (TPR > 32) {
        if ((t & 31) == 0) part[r][t / 32] = acc;
        __syncthreads();
        if (t == 0 && live) {
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < (TPR > 32 ? TPR / 32 : 1); ++i) s += part[r][i];
            dst[m] = s;
        }
    } else if (t == 0 && live) {
        dst[m] = acc;
    }
}

#define MMVX(TPR, R, B)                                                                                   \
    extern "C" __global__ void __launch_bounds__(TPR * R) mmvx_##TPR##_##R##_##B(float* dst, const char* a, \
                                                                          i64 lda, const char* x, int M,  \
                                                                          int K) {                        \
        mmvx<TPR, R, B>(dst, a, lda, x, M, K);                                                            \
    }
MMVX(32, 4, 4) MMVX(32, 1, 8)
MMVX(64, 2, 4) MMVX(128, 1, 4)
MMVX(256, 1, 2) MMVX(256, 1, 4)

// ---- rms_norm(x) * w over rows of N = T * NG * 4 floats, row-contiguous. WSM: w staged in
// shared memory once per block (grid-stride over rows); PIPE: the next row's loads are issued
// before this row's reduction.
template <int T, int NG, bool WSM, bool PIPE>
__device__ __forceinline__ void rmsx(char* dst, const char* x, const char* w, i64 rows, float eps) {
    constexpr int N = T * NG * 4;
    __shared__ float sh[32];
    __shared__ V16 ws[WSM ? T * NG : 1];
    if (WSM) {
#pragma unroll
        for (int j = 0; j < NG; ++j) ws[threadIdx.x + j * T] = ((const V16*)w)[threadIdx.x + j * T];
        __syncthreads();
    }
    V16 v[NG], nv[NG];
    i64 r = blockIdx.x;
    if (PIPE && r < rows) {
#pragma unroll
        for (int j = 0; j < NG; ++j) v[j] = ld16_cs(x + r * N * 4 + (threadIdx.x + j * T) * 16);
    }
    for (; r < rows; r += gridDim.x) {
        if (!PIPE) {
#pragma unroll
            for (int j = 0; j < NG; ++j) v[j] = ld16_cs(x + r * N * 4 + (threadIdx.x + j * T) * 16);
        }
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < NG; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) ss += __uint_as_float(v[j].w[i]) * __uint_as_float(v[j].w[i]);
        if (PIPE && r + gridDim.x < rows) {
#pragma unroll
            for (int j = 0; j < NG; ++j) nv[j] = ld16_cs(x + (r + gridDim.x) * N * 4 + (threadIdx.x + j * T) * 16);
        }
        const float inv = 1.0f / sqrtf(block_sum(ss, sh) / (float)N + eps);
#pragma unroll
        for (int j = 0; j < NG; ++j) {
            const V16 wv = WSM ? ws[threadIdx.x + j * T] : ((const V16*)w)[threadIdx.x + j * T];
            V16 y;
#pragma unroll
            for (int i = 0; i < 4; ++i)
                y.w[i] = __float_as_uint(__uint_as_float(v[j].w[i]) * inv * __uint_as_float(wv.w[i]));
            st16_cs(dst + r * N * 4 + (threadIdx.x + j * T) * 16, y);
        }
        if (PIPE) {
#pragma unroll
            for (int j = 0; j < NG; ++j) v[j] = nv[j];
        }
    }
}

#define RMSX(T, NG, WSM, PIPE)                                                                            \
    extern "C" __global__ void __launch_bounds__(T) rmsx_##T##_##NG##_##WSM##_##PIPE(                      \
        char* dst, const char* x, const char* w, i64 rows, float eps) {                                   \
        rmsx<T, NG, WSM, PIPE>(dst, x, w, rows, eps);                                                      \
    }
RMSX(128, 8, 1, 0) RMSX(256, 4, 1, 0) RMSX(256, 4, 0, 0) RMSX(512, 2, 1, 0) RMSX(1024, 1, 1, 0)
RMSX(256, 4, 1, 1) RMSX(128, 8, 1, 1) RMSX(512, 2, 1, 1)

// ---- cpy F32 -> F16 of contiguous rows of N floats into rows of ldd bytes; each thread moves
// BATCH groups of 4, all loads issued before any store.
template <int BATCH>
__device__ __forceinline__ void cpyx(char* dst, i64 ldd, const char* src, i64 rows, int N) {
    const i64 r = blockIdx.x;
    const int groups = N / 4;
    const char* s = src + r * N * 4;
    char* d = dst + r * ldd;
    for (int c0 = threadIdx.x; c0 < groups; c0 += BATCH * blockDim.x) {
        V16 v[BATCH];
#pragma unroll
        for (int u = 0; u < BATCH; ++u) {
            const int c = c0 + u * blockDim.x;
            if (c < groups) v[u] = ld16_cs(s + (i64)c * 16);
        }
#pragma unroll
        for (int u = 0; u < BATCH; ++u) {
            const int c = c0 + u * blockDim.x;
            if (c < groups) {
                float f[4];
                unpack16<float>(v[u], f);
                stg<f16, 4>(d + (i64)c * 8, f);
            }
        }
    }
}
#define CPYX(B)                                                                                        \
    extern "C" __global__ void cpyx_##B(char* dst, i64 ldd, const char* src, i64 rows, int N) {         \
        cpyx<B>(dst, ldd, src, rows, N);                                                                \
    }
CPYX(1) CPYX(2) CPYX(4)

// ---- read roof: n16 16-byte vectors read once (B in flight per thread, grid-stride), nothing
// written unless the xor of everything hits a value random data does not give.
template <int B>
__device__ __forceinline__ void readx(const char* p, i64 n16, unsigned* out) {
    unsigned acc = 0;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i0 = (i64)blockIdx.x * blockDim.x + threadIdx.x; i0 < n16; i0 += B * stride) {
        V16 v[B];
#pragma unroll
        for (int u = 0; u < B; ++u)
            if (i0 + u * stride < n16) v[u] = ld16_cs(p + 16 * (i0 + u * stride));
#pragma unroll
        for (int u = 0; u < B; ++u)
            if (i0 + u * stride < n16) acc ^= v[u].w[0] ^ v[u].w[1] ^ v[u].w[2] ^ v[u].w[3];
    }
    if (acc == 0x9e3779b9u) out[0] = acc;
}
#define READX(B)                                                                                        \
    extern "C" __global__ void readx_##B(const char* p, i64 n16, unsigned* out) { readx<B>(p, n16, out); }
READX(2) READX(4) READX(8)
