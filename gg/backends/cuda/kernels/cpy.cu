// cpy / cont / cast: copy src into dst with dtype conversion; elements are matched in each
// tensor's logical (ne[0]-fastest) order, so ne and nb may differ on both sides. Block (tx, ty):
// one dst row per y-slice, a long row shared by gridDim.y blocks. When the shapes are equal the
// source row is addressed directly (and with `vec`, host-checked contiguous aligned rows of a
// multiple of 8, moved Group<TS, TD>::G elements per access); otherwise every element's flat index is
// re-decomposed by src.ne.
#include "common.cuh"

template <class TS, class TD, bool RAW>
__device__ __forceinline__ void cpy_impl(char* dst, const TDesc& d, const char* s, const TDesc& sd, int same,
                                         int vec) {
    const i64 rows = d.ne[1] * d.ne[2] * d.ne[3];
    const i64 r = (i64)blockIdx.x * blockDim.y + threadIdx.y;
    if (r >= rows) return;
    i64 i1, i2, i3;
    row_index(r, d, i1, i2, i3);
    char* drow = dst + row_offs(d, i1, i2, i3);
    const char* srow = s + row_offs(sd, i1, i2, i3);
    const i64 start = (i64)blockIdx.y * blockDim.x + threadIdx.x, stride = (i64)gridDim.y * blockDim.x;
    if (vec) {  // RAW (I32) moves bits through float registers: no arithmetic touches them
        // Two groups per iteration, both loads issued before either store (the compiler may not
        // hoist a load above a store through char pointers that might alias): 37.6 -> 36.6 us
        // for 4096 F32 -> F16 rows of 4096 (scripts/kexp.py, H100).
        constexpr int G = Group<TS, TD>::G;
        constexpr int SS = RAW ? 4 : (int)sizeof(TS), SD = RAW ? 4 : (int)sizeof(TD);
        const i64 groups = d.ne[0] / G;
        for (i64 c = start; c < groups; c += 2 * stride) {
            const bool two = c + stride < groups;
            float v[G], u[G];
            if (RAW) {
                ldg<float, 4>(srow + c * 16, v);
                if (two) ldg<float, 4>(srow + (c + stride) * 16, u);
                stg<float, 4>(drow + c * 16, v);
                if (two) stg<float, 4>(drow + (c + stride) * 16, u);
            } else {
                ldg<TS, G>(srow + c * G * SS, v);
                if (two) ldg<TS, G>(srow + (c + stride) * G * SS, u);
                stg<TD, G>(drow + c * G * SD, v);
                if (two) stg<TD, G>(drow + (c + stride) * G * SD, u);
            }
        }
        return;
    }
    for (i64 i0 = start; i0 < d.ne[0]; i0 += stride) {
        const char* sp;
        if (same) {
            sp = srow + i0 * sd.nb[0];
        } else {
            i64 flat = i0 + d.ne[0] * r;  // r is already i1 + ne1 * (i2 + ne2 * i3)
            const i64 j0 = flat % sd.ne[0]; flat /= sd.ne[0];
            const i64 j1 = flat % sd.ne[1]; flat /= sd.ne[1];
            const i64 j2 = flat % sd.ne[2];
            const i64 j3 = flat / sd.ne[2];
            sp = s + j0 * sd.nb[0] + row_offs(sd, j1, j2, j3);
        }
        char* dp = drow + i0 * d.nb[0];
        if (RAW) {
            *(int*)dp = *(const int*)sp;  // I32 -> I32: bit copy
        } else {
            st<TD>(dp, ld<TS>(sp));
        }
    }
}

#define GG_CPY(TS, SS, TD, SD, RAW)                                                                  \
    extern "C" __global__ void cpy_##SS##_##SD(char* dst, TDesc d, const char* s, TDesc sd, int same,   \
                                               int vec) {                                             \
        gg_grid_sync();                                                                               \
        cpy_impl<TS, TD, RAW>(dst, d, s, sd, same, vec);                                             \
    }

#define GG_CPY_D(TS, SS) GG_CPY(TS, SS, float, f32, false) GG_CPY(TS, SS, f16, f16, false) GG_CPY(TS, SS, bf16, bf16, false)
GG_CPY_D(float, f32)
GG_CPY_D(f16, f16)
GG_CPY_D(bf16, bf16)
GG_CPY(float, i32, float, i32, true)

// cpy_t: the same copy when the source is contiguous along dim 1 and the destination along dim 0
// (writing K/V rows into a transposed V cache). The row kernel above would read the source with
// a stride per element; here a block moves a 32 x 32 tile of (dim 0, dim 1) through shared
// memory, so both sides are read and written along their contiguous dim. Block (32, 8); grid
// (tiles along dim 0, tiles along dim 1, ne2 * ne3).
// CPY_TILE (families/copy.py TILE) comes from the host as -D.

template <class TS, class TD>
__device__ __forceinline__ void cpy_t_impl(char* dst, const TDesc& d, const char* s, const TDesc& sd) {
    __shared__ float tile[CPY_TILE][CPY_TILE + 1];
    const i64 x0 = (i64)blockIdx.x * CPY_TILE, y0 = (i64)blockIdx.y * CPY_TILE;
    const i64 i2 = blockIdx.z % d.ne[2], i3 = blockIdx.z / d.ne[2];
    const char* sb = s + i2 * sd.nb[2] + i3 * sd.nb[3];
    char* db = dst + i2 * d.nb[2] + i3 * d.nb[3];
    const int tx = threadIdx.x, ty = threadIdx.y;
    for (int j = ty; j < CPY_TILE; j += blockDim.y) {  // read along dim 1 (the source's contiguous dim)
        const i64 i0 = x0 + j, i1 = y0 + tx;
        if (i0 < d.ne[0] && i1 < d.ne[1]) tile[j][tx] = ld<TS>(sb + i0 * sd.nb[0] + i1 * sd.nb[1]);
    }
    __syncthreads();
    for (int j = ty; j < CPY_TILE; j += blockDim.y) {  // write along dim 0 (the destination's)
        const i64 i0 = x0 + tx, i1 = y0 + j;
        if (i0 < d.ne[0] && i1 < d.ne[1]) st<TD>(db + i0 * d.nb[0] + i1 * d.nb[1], tile[tx][j]);
    }
}

#define GG_CPY_T(TS, SS, TD, SD)                                                                     \
    extern "C" __global__ void cpy_t_##SS##_##SD(char* dst, TDesc d, const char* s, TDesc sd) {     \
        gg_grid_sync();                                                                             \
        cpy_t_impl<TS, TD>(dst, d, s, sd);                                                          \
    }
#define GG_CPY_T_D(TS, SS) GG_CPY_T(TS, SS, float, f32) GG_CPY_T(TS, SS, f16, f16) GG_CPY_T(TS, SS, bf16, bf16)
GG_CPY_T_D(float, f32)
GG_CPY_T_D(f16, f16)
GG_CPY_T_D(bf16, bf16)

// copy_pieces: up to CPY_PIECES byte ranges copied in one launch, a block a piece. The runtime's
// small host <-> device transfers (gg/backends/cuda/staging.py): a decode step's inputs written
// into its pinned ring are read from there (host memory mapped into the device's address space)
// and its token and the error word written back into a pinned slot, where a DMA copy each cost
// a stream transition each (~2.5 us of GPU time a copy between two CUDA graph replays).
struct Pieces {
    long long dst[CPY_PIECES], src[CPY_PIECES], n[CPY_PIECES];
    long long count;
};
extern "C" __global__ void copy_pieces(Pieces p) {
    gg_grid_sync();
    if (blockIdx.x >= p.count) return;
    unsigned char* d = (unsigned char*)p.dst[blockIdx.x];
    const unsigned char* s = (const unsigned char*)p.src[blockIdx.x];
    const long long n = p.n[blockIdx.x];
    long long tail = 0;  // the bytes from here on go one at a time
    if ((((unsigned long long)d | (unsigned long long)s) & 15u) == 0) {
        for (long long w = threadIdx.x; 16 * w + 16 <= n; w += blockDim.x) ((uint4*)d)[w] = ((const uint4*)s)[w];
        tail = n / 16 * 16;
    }
    for (long long i = tail + threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
    __threadfence_system();  // the host reads what this wrote once an event recorded after it completes
}
