// rms_norm and norm over dim 0, optionally fused with "* w" and "+ c" (the rms_norm -> mul -> add
// chains of a transformer block). One block per row; statistics in fp32, norm is two-pass.
// w and c broadcast over the row like ggml's binary ops; their dtypes are runtime codes.
//
// Speed: the row is read from global memory once and kept in dynamic shared memory (`cache`,
// when it fits); with `vec` (x and dst rows contiguous, 16-byte aligned, ne0 % 8 == 0, checked
// by the host) each thread moves 8 elements per 16/32-byte access. Broadcast operands get their
// row pointer once per row, and the per-element modulo only when they are shorter than the row.
#include "common.cuh"

struct Operand {  // a broadcast operand's row: base pointer, element count and stride along dim 0
    const char* row;
    i64 ne0, nb0;
    int dt;
};

__device__ __forceinline__ Operand operand_row(const char* p, const TDesc& d, int dt, i64 i1, i64 i2, i64 i3) {
    Operand o;
    o.row = p ? p + row_offs(d, i1 % d.ne[1], i2 % d.ne[2], i3 % d.ne[3]) : nullptr;
    o.ne0 = d.ne[0];
    o.nb0 = d.nb[0];
    o.dt = dt;
    return o;
}

__device__ __forceinline__ float operand_at(const Operand& o, i64 i0, i64 n) {
    return ld_dt(o.row + (o.ne0 == n ? i0 : i0 % o.ne0) * o.nb0, o.dt);
}

// The register path, a kernel of its own: sharing an entry with norm_impl's general paths (and
// keeping runtime-dtype operands, 64-bit offsets per group, a run-time block size) cost it 124
// registers, 4 blocks of 128 threads per SM, and the [4096 x 2^18] rms_norm*w ran at 0.78 of the
// copy roof; lean (~40 registers) it runs at the copy's speed (scripts/kexp.py measures both).
// One block of THREADS (a compile-time constant: a thread's group offsets are immediates) per
// row; the row is read once with all its loads in flight and never touches shared memory.
// Thread t holds groups t, t + THREADS, ... of G elements (what one 16-byte load brings: 4 F32,
// 8 F16/BF16) as raw 16-byte words, at most CHUNKS * 8 elements. Host-checked: x and dst rows
// contiguous, 16-byte aligned, ne0 % 8 == 0; weight and bias rows F32, full length, aligned.
// Weight and bias rows come through L1 (every block of an SM reads the same ones): staging
// them in shared memory for blocks that take several rows measured 1-2% slower.

// G consecutive F32 values of a weight/bias row (16-byte aligned), as floats.
template <int G> __device__ __forceinline__ void ldw(const char* p, float* v) {
    if (G == 4) ldg<float, 4>(p, v);
    else ld8<float>(p, v);
}

// TD: dst's dtype, T's or (F32 x) F16/BF16 when the planner folded a cast of the result into the
// step (the operand of a cuBLAS product: one pass over the tensor less).
template <bool RMS, class T, class TD, int THREADS, int CHUNKS>
__device__ __forceinline__ void norm_reg_impl(char* dst, const TDesc& d, const char* x, const TDesc& xd, float eps,
                                              const char* w, const TDesc& wd, const char* c, const TDesc& cd) {
    constexpr int G = 16 / (int)sizeof(T);
    constexpr int NG = CHUNKS * 8 / G;
    __shared__ float sh[32];
    const int n = (int)d.ne[0], groups = n / G, t0 = threadIdx.x;
    i64 i1, i2, i3;
    row_index(blockIdx.x, d, i1, i2, i3);
    const char* xrow = x + row_offs(xd, i1, i2, i3);
    char* drow = dst + row_offs(d, i1, i2, i3);
    if (w) w += row_offs(wd, i1 % wd.ne[1], i2 % wd.ne[2], i3 % wd.ne[3]);
    if (c) c += row_offs(cd, i1 % cd.ne[1], i2 % cd.ne[2], i3 % cd.ne[3]);
    V16 v[NG];
    float s = 0.0f, ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NG; ++j) {
        const int k = t0 + j * THREADS;
        if (k < groups) {
            v[j] = ld16_cs(xrow + k * 16);
            float f[G];
            unpack16<T>(v[j], f);
#pragma unroll
            for (int i = 0; i < G; ++i) {
                s += f[i];
                ss += f[i] * f[i];
            }
        }
    }
    // The weight and bias rows are prefetched into L1 now, in flight with x and the reduction:
    // fetched after it they cost one more memory round trip, the larger part of a one-row
    // (decode) norm's 8 us. Prefetches take no registers, unlike loading them here.
#pragma unroll
    for (int j = 0; j < NG; ++j) {
        const int k = t0 + j * THREADS;
        if (k < groups && w) prefetch_l1(w + k * G * 4);
        if (k < groups && c) prefetch_l1(c + k * G * 4);
    }
    float mean = 0.0f, var;
    if (RMS) {
        var = block_sum(ss, sh) / (float)n;
    } else {
        mean = block_sum(s, sh) / (float)n;
        float q = 0.0f;
#pragma unroll
        for (int j = 0; j < NG; ++j) {
            if (t0 + j * THREADS < groups) {
                float f[G];
                unpack16<T>(v[j], f);
#pragma unroll
                for (int i = 0; i < G; ++i) q += (f[i] - mean) * (f[i] - mean);
            }
        }
        var = block_sum(q, sh) / (float)n;
    }
    const float inv = 1.0f / sqrtf(var + eps);
#pragma unroll
    for (int j = 0; j < NG; ++j) {
        const int k = t0 + j * THREADS;
        if (k >= groups) continue;
        float y[G], t[G];
        unpack16<T>(v[j], y);
#pragma unroll
        for (int i = 0; i < G; ++i) y[i] = (y[i] - mean) * inv;
        if (w) {
            ldw<G>(w + k * G * 4, t);
#pragma unroll
            for (int i = 0; i < G; ++i) y[i] *= t[i];
        }
        if (c) {
            ldw<G>(c + k * G * 4, t);
#pragma unroll
            for (int i = 0; i < G; ++i) y[i] += t[i];
        }
        if (sizeof(TD) == sizeof(T)) st16_cs(drow + k * 16, pack16<TD>(y));
        else stg<TD, G>(drow + k * G * (int)sizeof(TD), y);
    }
}

template <bool RMS, class T>
__device__ __forceinline__ void norm_impl(char* dst, const TDesc& d, const char* x, const TDesc& xd, float eps,
                                          const char* w, const TDesc& wd, int wdt, const char* c,
                                          const TDesc& cd, int cdt, int cache, int vec) {
    extern __shared__ float row[];
    __shared__ float sh[32];
    const i64 n = d.ne[0];
    const i64 chunks = n / 8;
    i64 i1, i2, i3;
    row_index(blockIdx.x, d, i1, i2, i3);
    const char* xrow = x + row_offs(xd, i1, i2, i3);
    char* drow = dst + row_offs(d, i1, i2, i3);
    // Pass 1: one read of the row (into shared memory when cached): sum and sum of squares.
    float s = 0.0f, ss = 0.0f;
    if (vec) {
        for (i64 k = threadIdx.x; k < chunks; k += blockDim.x) {
            float v[8];
            ld8<T>(xrow + k * 8 * (i64)sizeof(T), v);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                if (cache) row[k * 8 + i] = v[i];
                s += v[i];
                ss += v[i] * v[i];
            }
        }
    } else {
        for (i64 i0 = threadIdx.x; i0 < n; i0 += blockDim.x) {
            const float v = ld<T>(xrow + i0 * xd.nb[0]);
            if (cache) row[i0] = v;
            s += v;
            ss += v * v;
        }
    }
    // With vec, thread t owns elements [8k, 8k + 8) for k = t, t + blockDim, ...; without, elements
    // t, t + blockDim, ... Every later pass uses the same ownership, so the shared row needs no
    // barrier beyond those inside block_sum.
    auto xat = [&](i64 i0) -> float { return cache ? row[i0] : ld<T>(xrow + i0 * xd.nb[0]); };

    float mean = 0.0f, var;
    if (RMS) {
        var = block_sum(ss, sh) / (float)n;
    } else {
        mean = block_sum(s, sh) / (float)n;
        float q = 0.0f;  // second pass over the (cached) row: sum of squared deviations
        if (vec) {
            for (i64 k = threadIdx.x; k < chunks; k += blockDim.x)
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const float v = xat(k * 8 + i) - mean;
                    q += v * v;
                }
        } else {
            for (i64 i0 = threadIdx.x; i0 < n; i0 += blockDim.x) {
                const float v = xat(i0) - mean;
                q += v * v;
            }
        }
        var = block_sum(q, sh) / (float)n;
    }
    const float inv = 1.0f / sqrtf(var + eps);

    const Operand wo = operand_row(w, wd, wdt, i1, i2, i3), co = operand_row(c, cd, cdt, i1, i2, i3);
    if (vec) {
        for (i64 k = threadIdx.x; k < chunks; k += blockDim.x) {
            float y[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) y[i] = (xat(k * 8 + i) - mean) * inv;
            // Not unrolled on purpose: eight inlined copies of the runtime-dtype loads made this
            // module 10x larger and 20x slower to compile (15 s with NVRTC 13.5).
#pragma unroll 1
            for (int i = 0; i < 8; ++i) {
                if (w) y[i] *= operand_at(wo, k * 8 + i, n);
                if (c) y[i] += operand_at(co, k * 8 + i, n);
            }
            st8<T>(drow + k * 8 * (i64)sizeof(T), y);
        }
    } else {
        for (i64 i0 = threadIdx.x; i0 < n; i0 += blockDim.x) {
            float y = (xat(i0) - mean) * inv;
            if (w) y *= operand_at(wo, i0, n);
            if (c) y += operand_at(co, i0, n);
            st<T>(drow + i0 * d.nb[0], y);
        }
    }
}

#define GG_NORM(NAME, RMS, T, S)                                                                     \
    extern "C" __global__ void NAME##_##S(char* dst, TDesc d, const char* x, TDesc xd, float eps,    \
                                          const char* w, TDesc wd, int wdt, const char* c, TDesc cd, \
                                          int cdt, int cache, int vec) {                             \
        gg_grid_sync();                                                                              \
        norm_impl<RMS, T>(dst, d, x, xd, eps, w, wd, wdt, c, cd, cdt, cache, vec);                   \
    }                                                                                                \
    GG_NORM_REGS(NAME, RMS, T, S, T, S)

// The register builds, (threads, chunks of 8 per thread) each: GG_FOR_NORM_REG_BUILDS comes from the
// host (families/norm.py REG_BUILDS, as -D).
#define GG_NORM_REGS(NAME, RMS, T, S, TD, SD) GG_FOR_NORM_REG_BUILDS(GG_NORM_REG, NAME, RMS, T, S, TD, SD)
#define GG_NORM_REG(THREADS, CHUNKS, NAME, RMS, T, S, TD, SD)                                              \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                  \
        NAME##_reg##THREADS##_##S##_##SD(char* dst, TDesc d, const char* x, TDesc xd, float eps,         \
                                         const char* w, TDesc wd, const char* c, TDesc cd) {              \
        gg_grid_sync();                                                                                   \
        norm_reg_impl<RMS, T, TD, THREADS, CHUNKS>(dst, d, x, xd, eps, w, wd, c, cd);                      \
    }

GG_NORM(rms_norm, true, float, f32)
GG_NORM(rms_norm, true, f16, f16)
GG_NORM(rms_norm, true, bf16, bf16)
GG_NORM(norm, false, float, f32)
GG_NORM(norm, false, f16, f16)
GG_NORM(norm, false, bf16, bf16)
GG_NORM_REGS(rms_norm, true, float, f32, f16, f16)   // rms_norm chains with a folded cast
GG_NORM_REGS(rms_norm, true, float, f32, bf16, bf16)
