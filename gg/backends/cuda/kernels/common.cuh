// Shared helpers for gg's CUDA kernels: tensor descriptors, f16/bf16 conversion, reductions.
// No CUDA headers are included on purpose: NVRTC then needs nothing but this file, on any box.
#pragma once

typedef long long i64;
typedef unsigned short u16;

// A tensor's logical shape and byte strides, exactly as gg's Tensor.ne / Tensor.nb (ne[0] fastest).
struct TDesc {
    i64 ne[4];
    i64 nb[4];
};

// Storage tags: kernels are templated on these so one source serves every dtype.
struct f16 { u16 x; };
struct bf16 { u16 x; };

// Runtime dtype codes DT_F32, DT_F16, DT_BF16, DT_I32 for secondary operands (weights of a fused
// norm, masks) where a template per combination would be wasteful: defined by the host
// (families/common.py DT_CODES, passed to NVRTC as -D), like every constant host and kernel share.

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));  // round to nearest even, as numpy
    return h;
}

__device__ __forceinline__ float bf2f(u16 b) { return __uint_as_float(((unsigned)b) << 16); }

__device__ __forceinline__ u16 f2bf(float f) {
    // Round to nearest even; NaN -> 0x7FC0 (the bits gg.dtypes.encode writes on the CPU).
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

template <class T> __device__ __forceinline__ float ld(const char* p);
template <> __device__ __forceinline__ float ld<float>(const char* p) { return *(const float*)p; }
template <> __device__ __forceinline__ float ld<f16>(const char* p) { return h2f(*(const u16*)p); }
template <> __device__ __forceinline__ float ld<bf16>(const char* p) { return bf2f(*(const u16*)p); }

template <class T> __device__ __forceinline__ void st(char* p, float v);
template <> __device__ __forceinline__ void st<float>(char* p, float v) { *(float*)p = v; }
template <> __device__ __forceinline__ void st<f16>(char* p, float v) { *(u16*)p = f2h(v); }
template <> __device__ __forceinline__ void st<bf16>(char* p, float v) { *(u16*)p = f2bf(v); }

// 16 bytes loaded at once (the caller guarantees 16-byte alignment): the fast path of the
// bandwidth-bound kernels.
struct alignas(16) V16 { unsigned w[4]; };

// Eight consecutive elements of a contiguous row starting at p, as floats.
template <class T> __device__ __forceinline__ void ld8(const char* p, float* v);
template <> __device__ __forceinline__ void ld8<float>(const char* p, float* v) {
    const V16 a = *(const V16*)p, b = *(const V16*)(p + 16);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[i] = __uint_as_float(a.w[i]);
        v[i + 4] = __uint_as_float(b.w[i]);
    }
}
template <> __device__ __forceinline__ void ld8<f16>(const char* p, float* v) {
    const V16 a = *(const V16*)p;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = h2f((u16)(a.w[i] & 0xffffu));
        v[2 * i + 1] = h2f((u16)(a.w[i] >> 16));
    }
}
template <> __device__ __forceinline__ void ld8<bf16>(const char* p, float* v) {
    const V16 a = *(const V16*)p;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = __uint_as_float(a.w[i] << 16);
        v[2 * i + 1] = __uint_as_float(a.w[i] & 0xffff0000u);
    }
}

// Store eight floats as consecutive elements of a contiguous, 16-byte aligned row.
template <class T> __device__ __forceinline__ void st8(char* p, const float* v);
template <> __device__ __forceinline__ void st8<float>(char* p, const float* v) {
    V16 a, b;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        a.w[i] = __float_as_uint(v[i]);
        b.w[i] = __float_as_uint(v[i + 4]);
    }
    *(V16*)p = a;
    *(V16*)(p + 16) = b;
}
template <> __device__ __forceinline__ void st8<f16>(char* p, const float* v) {
    V16 a;
#pragma unroll
    for (int i = 0; i < 4; ++i) a.w[i] = (unsigned)f2h(v[2 * i]) | ((unsigned)f2h(v[2 * i + 1]) << 16);
    *(V16*)p = a;
}
template <> __device__ __forceinline__ void st8<bf16>(char* p, const float* v) {
    V16 a;
#pragma unroll
    for (int i = 0; i < 4; ++i) a.w[i] = (unsigned)f2bf(v[2 * i]) | ((unsigned)f2bf(v[2 * i + 1]) << 16);
    *(V16*)p = a;
}

// G consecutive elements at p as floats, one access of G * sizeof(T) bytes (8 or 16; the caller
// guarantees that alignment). The vectorized paths move G = 16 / (widest element size) elements
// per thread and access, so a warp's accesses to every operand cover contiguous bytes; loading
// 32 bytes per thread as two 16-byte halves instead made each half touch 32 sectors and doubled
// the L2 traffic (ncu: L2 at 96% with DRAM at 55% on rms_norm).
struct alignas(8) V8 { unsigned w[2]; };

template <class T, int G> __device__ __forceinline__ void ldg(const char* p, float* v);
template <> __device__ __forceinline__ void ldg<float, 4>(const char* p, float* v) {
    const V16 a = *(const V16*)p;
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = __uint_as_float(a.w[i]);
}
template <> __device__ __forceinline__ void ldg<f16, 8>(const char* p, float* v) { ld8<f16>(p, v); }
template <> __device__ __forceinline__ void ldg<bf16, 8>(const char* p, float* v) { ld8<bf16>(p, v); }
template <> __device__ __forceinline__ void ldg<f16, 4>(const char* p, float* v) {
    const V8 a = *(const V8*)p;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        v[2 * i] = h2f((u16)(a.w[i] & 0xffffu));
        v[2 * i + 1] = h2f((u16)(a.w[i] >> 16));
    }
}
template <> __device__ __forceinline__ void ldg<bf16, 4>(const char* p, float* v) {
    const V8 a = *(const V8*)p;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        v[2 * i] = __uint_as_float(a.w[i] << 16);
        v[2 * i + 1] = __uint_as_float(a.w[i] & 0xffff0000u);
    }
}

template <class T, int G> __device__ __forceinline__ void stg(char* p, const float* v);
template <> __device__ __forceinline__ void stg<float, 4>(char* p, const float* v) {
    V16 a;
#pragma unroll
    for (int i = 0; i < 4; ++i) a.w[i] = __float_as_uint(v[i]);
    *(V16*)p = a;
}
template <> __device__ __forceinline__ void stg<f16, 8>(char* p, const float* v) { st8<f16>(p, v); }
template <> __device__ __forceinline__ void stg<bf16, 8>(char* p, const float* v) { st8<bf16>(p, v); }
template <> __device__ __forceinline__ void stg<f16, 4>(char* p, const float* v) {
    V8 a;
#pragma unroll
    for (int i = 0; i < 2; ++i) a.w[i] = (unsigned)f2h(v[2 * i]) | ((unsigned)f2h(v[2 * i + 1]) << 16);
    *(V8*)p = a;
}
template <> __device__ __forceinline__ void stg<bf16, 4>(char* p, const float* v) {
    V8 a;
#pragma unroll
    for (int i = 0; i < 2; ++i) a.w[i] = (unsigned)f2bf(v[2 * i]) | ((unsigned)f2bf(v[2 * i + 1]) << 16);
    *(V8*)p = a;
}

// Streaming (evict-first) 16-byte load and store, for data touched exactly once (the rows of a
// norm or softmax, weight rows of a mat-vec): they leave L1 to the operands every block re-reads
// (a norm's weight row, a mat-vec's vector), which otherwise come back from L2 per block.
__device__ __forceinline__ V16 ld16_cs(const char* p) {
    V16 a;
    asm("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a.w[0]), "=r"(a.w[1]), "=r"(a.w[2]), "=r"(a.w[3]) : "l"(p));
    return a;
}
__device__ __forceinline__ void st16_cs(char* p, const V16& a) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "r"(a.w[0]), "r"(a.w[1]), "r"(a.w[2]), "r"(a.w[3]) : "memory");
}

// 16 bytes <-> 16 / sizeof(T) floats.
template <class T> __device__ __forceinline__ void unpack16(const V16& a, float* v);
template <> __device__ __forceinline__ void unpack16<float>(const V16& a, float* v) {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = __uint_as_float(a.w[i]);
}
template <> __device__ __forceinline__ void unpack16<f16>(const V16& a, float* v) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = h2f((u16)(a.w[i] & 0xffffu));
        v[2 * i + 1] = h2f((u16)(a.w[i] >> 16));
    }
}
template <> __device__ __forceinline__ void unpack16<bf16>(const V16& a, float* v) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = __uint_as_float(a.w[i] << 16);
        v[2 * i + 1] = __uint_as_float(a.w[i] & 0xffff0000u);
    }
}
template <class T> __device__ __forceinline__ V16 pack16(const float* v);
template <> __device__ __forceinline__ V16 pack16<float>(const float* v) {
    V16 a;
#pragma unroll
    for (int i = 0; i < 4; ++i) a.w[i] = __float_as_uint(v[i]);
    return a;
}
template <> __device__ __forceinline__ V16 pack16<f16>(const float* v) {
    V16 a;
#pragma unroll
    for (int i = 0; i < 4; ++i) a.w[i] = (unsigned)f2h(v[2 * i]) | ((unsigned)f2h(v[2 * i + 1]) << 16);
    return a;
}
template <> __device__ __forceinline__ V16 pack16<bf16>(const float* v) {
    V16 a;
#pragma unroll
    for (int i = 0; i < 4; ++i) a.w[i] = (unsigned)f2bf(v[2 * i]) | ((unsigned)f2bf(v[2 * i + 1]) << 16);
    return a;
}

// A hint that p's line will be read soon: brought into L1 without holding a register.
__device__ __forceinline__ void prefetch_l1(const char* p) { asm volatile("prefetch.global.L1 [%0];" :: "l"(p)); }

// Eight consecutive elements, streamed (see ld16_cs).
template <class T> __device__ __forceinline__ void ld8_cs(const char* p, float* v) {
    unpack16<T>(ld16_cs(p), v);
    if (sizeof(T) == 4) unpack16<T>(ld16_cs(p + 16), v + 4);
}

// Elements per vectorized access for a kernel whose operands have element sizes S1, S2.
template <class A, class B = A> struct Group { static constexpr int G = (sizeof(A) == 4 || sizeof(B) == 4) ? 4 : 8; };

__device__ __forceinline__ float ld_dt(const char* p, int dt) {
    switch (dt) {
        case DT_F16: return h2f(*(const u16*)p);
        case DT_BF16: return bf2f(*(const u16*)p);
        default: return *(const float*)p;
    }
}

__device__ __forceinline__ void st_dt(char* p, float v, int dt) {
    switch (dt) {
        case DT_F16: st<f16>(p, v); break;
        case DT_BF16: st<bf16>(p, v); break;
        default: st<float>(p, v);
    }
}

// ggml's rope: the pair (x0, x1) turned by the angle p * freq. The angle is built in double
// (positions reach thousands of radians, where a float angle loses ~1e-4 of accuracy) and
// reduced to [-pi, pi] before the float sincosf (a double sincos made rope FP64-bound). Every
// rounding is explicit, so the kernels that rope (rope.cu, the mat-vec epilogue in mul_mat.cu)
// give the same bits whatever the compiler contracts.
__device__ __forceinline__ void rope_sincos(double p, double freq, float& sn, float& cs) {
    const double two_pi = 6.283185307179586;
    const double theta = __dmul_rn(p, freq);
    sincosf((float)__fma_rn(-two_pi, rint(__dmul_rn(theta, 1.0 / two_pi)), theta), &sn, &cs);
}

__device__ __forceinline__ float rope_rotate(float x0, float x1, float sn, float cs, bool second) {
    return second ? __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cs)) : __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
}

__device__ __forceinline__ void rope_pair(double p, double freq, float x0, float x1, float& o0, float& o1) {
    float sn, cs;
    rope_sincos(p, freq, sn, cs);
    o0 = rope_rotate(x0, x1, sn, cs, false);
    o1 = rope_rotate(x0, x1, sn, cs, true);
}

// Byte offset of element (i0, i1, i2, i3) in d, with every index taken modulo d.ne (ggml's
// "src1 repeats over src0" broadcast).
__device__ __forceinline__ i64 bcast_offs(const TDesc& d, i64 i0, i64 i1, i64 i2, i64 i3) {
    return (i0 % d.ne[0]) * d.nb[0] + (i1 % d.ne[1]) * d.nb[1] + (i2 % d.ne[2]) * d.nb[2] +
           (i3 % d.ne[3]) * d.nb[3];
}

// Row r (over dims 1..3 of d) -> (i1, i2, i3). 64-bit division is a ~70-instruction software
// routine; when everything fits in 32 bits (always, in practice) the hardware-assisted 32-bit
// one is used: it was the largest cost of kernels with short rows (rope on head_dim rows).
__device__ __forceinline__ void row_index(i64 r, const TDesc& d, i64& i1, i64& i2, i64& i3) {
    if (((unsigned long long)r | (unsigned long long)d.ne[1] | (unsigned long long)d.ne[2]) < 0x80000000ull) {
        const unsigned rr = (unsigned)r, n1 = (unsigned)d.ne[1], n2 = (unsigned)d.ne[2];
        const unsigned t = rr / n1;
        i1 = rr - t * n1;
        i2 = t % n2;
        i3 = t / n2;
        return;
    }
    i1 = r % d.ne[1];
    i64 t = r / d.ne[1];
    i2 = t % d.ne[2];
    i3 = t / d.ne[2];
}

__device__ __forceinline__ i64 row_offs(const TDesc& d, i64 i1, i64 i2, i64 i3) {
    return i1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3];
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// max that propagates NaN (fmaxf drops it: a row of NaN and -inf would look fully masked)
__device__ __forceinline__ float max_nan(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide sum/max; blockDim.x must be a multiple of 32 (the launchers guarantee it) and every
// thread of the block must call it. `sh` holds 32 floats. The leading barrier lets callers reuse
// `sh` for successive reductions without a race between the last reads and the next writes.
__device__ __forceinline__ float block_sum(float v, float* sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -__int_as_float(0x7f800000);
    return warp_max(v);
}

// First statement of every kernel: wait until the kernels before it on the stream have finished
// and their writes are visible, then let the next one start launching. The host launches gg's
// kernels with programmatic stream serialization on sm_90+ (launch.py), so a kernel's blocks may
// be scheduled while its predecessor's last blocks still run: only the launch latency overlaps,
// never memory accesses. Without that launch attribute (or before sm_90) both are no-ops. The
// kernels that split the two are the quantized mat-vecs (quant.cu mvs_impl, mv_run): they copy
// weights no step of the plan writes before their wait (the streaming one may let its successor
// launch late).
__device__ __forceinline__ void gg_grid_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void gg_launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void gg_grid_sync() {
    gg_grid_wait();
    gg_launch_dependents();
}

// Measuring builds only (attention.STAMPS, blocks.STAMP_GRID; scripts/stamps.py reads the
// stamps): %globaltimer (ns, comparable across SMs) and the SM's clock into stamp[0..1], and the
// SM's id into stamp[2]: where a kernel's time goes inside a replayed graph, which no profiler
// shows. `after`: a value the stamp waits for (its input operand), so that the compiler cannot
// read the clock before that value is computed.
__device__ __forceinline__ void gg_stamp(unsigned long long* stamp, float after = 0.0f) {
    unsigned long long g;
    unsigned sm;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g) : "f"(after));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    stamp[0] = g;
    stamp[1] = clock64();
    stamp[2] = sm;
}

// The only thing a kernel may do before gg_grid_sync(): ask L2 for `bytes` at p (null: nothing)
// that it will read once the wait is over. A prefetch moves no data into the kernel, and L2 is
// where every write lands, so a line the predecessor is still writing is never read stale; it
// puts the DRAM to work while a latency-bound predecessor runs (PDL: the blocks are resident).
__device__ __forceinline__ void l2_prefetch_line(const char* p) { asm volatile("prefetch.global.L2 [%0];" :: "l"(p)); }
__device__ __forceinline__ void gg_l2_prefetch(const char* p, i64 bytes) {
    if (!p) return;
    for (i64 o = (i64)threadIdx.x * 128; o < bytes; o += (i64)blockDim.x * 128) l2_prefetch_line(p + o);
}

// Report a bad input (e.g. a row index out of range) to the host: the backend reads this word
// on synchronize() and raises a BackendError naming the step that set it.
__device__ __forceinline__ void report_error(int* err, int code) {
    if (err) atomicCAS(err, 0, code);
}

// Asynchronous 16-byte global -> shared copies (sm_80+): a block issues every load of a tile at
// once and waits for them as a group, one memory round trip instead of one per loop iteration.
// `bytes` < 16 copies that many and zero-fills the rest (0: nothing is read).
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(smem_addr(dst)), "l"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}

// The ticket of a thread block that meets n - 1 others through global memory (a split-K product's
// parts): true in the last to arrive, which then reads what every other block wrote before taking
// its ticket. RELEASE: after the block's barrier one thread's acq_rel atomic publishes the whole
// block's writes (a PTX release covers what happens before it through the barrier, as CUTLASS's
// semaphore relies on) and acquires the others'; else every thread fences before and after a
// plain atomic (the threadFenceReduction sample).
template <bool RELEASE>
__device__ __forceinline__ bool gg_last_block(int* counter, int n) {
    __shared__ int last;
    if constexpr (!RELEASE) __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int old;
        if constexpr (RELEASE)
            asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
        else
            old = atomicAdd(counter, 1);
        last = old == n - 1;
    }
    __syncthreads();
    const bool l = last;
    if constexpr (!RELEASE) {
        if (l) __threadfence();
    }
    return l;
}

// Bulk copies (sm_90, the TMA unit): one instruction moves a whole 16-byte-aligned run of a multiple
// of 16 bytes into shared memory and counts its bytes on an mbarrier, which the block waits on; a
// block copying long rows issues one instruction a row instead of one per 16 bytes per thread.
// Callers test GG_BULK_COPY (sm_80 builds have none of these).
#if __CUDA_ARCH__ >= 900
#define GG_BULK_COPY 1
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_addr(bar)), "r"(count) : "memory");
}
// This thread's shared-memory writes and reads so far (an mbarrier's initialization, a stage's
// reads) ordered before the bulk copies it issues next (they run in the async proxy).
__device__ __forceinline__ void async_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// one arrival that also expects `bytes` more of copies on the barrier's current phase
__device__ __forceinline__ void mbar_expect(unsigned long long* bar, unsigned bytes) {
    asm volatile("{ .reg .b64 s; mbarrier.arrive.expect_tx.shared::cta.b64 s, [%0], %1; }"
                 :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    asm volatile("{ .reg .pred done; WAIT_%=: mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1; "
                 "@!done bra WAIT_%=; }" :: "r"(smem_addr(bar)), "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}
// An L2 policy for bytes read once a token (a model's streamed weights): their lines go first, so
// that what the next kernels read again (their code, the KV cache, the activations) is not pushed
// out of L2 by the ~200 MB of weights a llama-8B layer streams through it.
__device__ __forceinline__ unsigned long long l2_evict_first() {
    unsigned long long p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
// bulk_copy under such a policy
__device__ __forceinline__ void bulk_copy_hint(void* dst, const void* src, unsigned bytes, unsigned long long* bar,
                                               unsigned long long policy) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy) : "memory");
}
#else
#define GG_BULK_COPY 0
#endif

// Thread block clusters (sm_90): the blocks of a cluster run at once on one GPC and read each
// other's shared memory, so partial results meet there instead of through global memory, a fence
// and an atomic ticket. cluster_sync is a barrier over every thread of the cluster (all threads of
// each block call it) that also orders their shared-memory writes before the reads after it.
// Callers test GG_CLUSTERS (sm_80 builds have none of these; the host launches no clusters there).
#if __CUDA_ARCH__ >= 900
#define GG_CLUSTERS 1
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
// `p` (in this block's shared memory) as it lies in the shared memory of the cluster's block `rank`
__device__ __forceinline__ float ld_cluster(const float* p, unsigned rank) {
    unsigned a;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(smem_addr(p)), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
    return v;
}
#else
#define GG_CLUSTERS 0
#endif
