// get_rows (gather, e.g. embeddings) and set_rows (scatter by index, e.g. KV-cache writes).
// Block (tx, ty): one row per y-slice; a long row is also spread over blockIdx.y (a decode step's
// single K row of n_embd values took 9 us on one block). A row index out of range writes nothing
// (get_rows: zeros) and reports `code` through `err`, which the host turns into a BackendError at
// synchronize().
#include "common.cuh"

// get_rows: dst (ne0, n, ne2, ne3) F32 (I32 for I32 sources); idx I32 (n, a.ne2, a.ne3).
template <class T, bool RAW>
__device__ __forceinline__ void get_rows_impl(char* dst, const TDesc& d, const char* a, const TDesc& ad,
                                              const char* idx, const TDesc& id, int* err, int code) {
    const i64 rows = d.ne[1] * d.ne[2] * d.ne[3];
    const i64 r = (i64)blockIdx.x * blockDim.y + threadIdx.y;
    if (r >= rows) return;
    i64 i1, i2, i3;
    row_index(r, d, i1, i2, i3);
    const i64 k = *(const int*)(idx + i1 * id.nb[0] + i2 * id.nb[1] + i3 * id.nb[2]);
    char* drow = dst + row_offs(d, i1, i2, i3);
    const bool ok = k >= 0 && k < ad.ne[1];
    if (!ok && threadIdx.x == 0) report_error(err, code);
    const char* arow = a + row_offs(ad, ok ? k : 0, i2, i3);
    for (i64 i0 = threadIdx.x + (i64)blockIdx.y * blockDim.x; i0 < d.ne[0]; i0 += (i64)gridDim.y * blockDim.x) {
        if (RAW) {
            *(int*)(drow + i0 * d.nb[0]) = ok ? *(const int*)(arow + i0 * ad.nb[0]) : 0;
        } else {
            *(float*)(drow + i0 * d.nb[0]) = ok ? ld<T>(arow + i0 * ad.nb[0]) : 0.0f;
        }
    }
}

#define GG_GET_ROWS(T, S, RAW)                                                                          \
    extern "C" __global__ void get_rows_##S(char* dst, TDesc d, const char* a, TDesc ad, const char* idx, \
                                            TDesc id, int* err, int code) {                             \
        gg_grid_sync();                                                                                 \
        get_rows_impl<T, RAW>(dst, d, a, ad, idx, id, err, code);                                       \
    }

GG_GET_ROWS(float, f32, false)
GG_GET_ROWS(f16, f16, false)
GG_GET_ROWS(bf16, bf16, false)
GG_GET_ROWS(float, i32, true)

// SET_ROWS_AHEAD (launch.py ROW_ITEMS_PER_THREAD: all of a thread's elements, usually) comes from
// the host as -D.

// set_rows: for each row (i1, i2, i3) of src b, dst row idx[i1, i2 % id.ne1, i3 % id.ne2] of plane
// (i2, i3) gets it. dst is the (view of the) destination tensor itself.
template <class TS, class TD>
__device__ __forceinline__ void set_rows_impl(char* dst, const TDesc& d, const char* b, const TDesc& bd,
                                              const char* idx, const TDesc& id, int* err, int code) {
    const i64 rows = bd.ne[1] * bd.ne[2] * bd.ne[3];
    const i64 r = (i64)blockIdx.x * blockDim.y + threadIdx.y;
    if (r >= rows) return;
    i64 i1, i2, i3;
    row_index(r, bd, i1, i2, i3);
    // The thread's first SET_ROWS_AHEAD elements are loaded before the row index: they do not
    // depend on it, and the short rows of a decode step (a K row, V columns) then wait for one
    // memory round trip instead of two.
    const char* brow = b + row_offs(bd, i1, i2, i3);
    const i64 first = threadIdx.x + (i64)blockIdx.y * blockDim.x, step = (i64)gridDim.y * blockDim.x;
    float ahead[SET_ROWS_AHEAD];
#pragma unroll
    for (int u = 0; u < SET_ROWS_AHEAD; ++u) {
        const i64 i0 = first + u * step;
        ahead[u] = i0 < d.ne[0] ? ld<TS>(brow + i0 * bd.nb[0]) : 0.0f;
    }
    // (a 64-bit modulo is a ~70-instruction routine: skipped for the usual single index plane)
    const i64 j2 = id.ne[1] == 1 ? 0 : i2 % id.ne[1], j3 = id.ne[2] == 1 ? 0 : i3 % id.ne[2];
    const i64 k = *(const int*)(idx + i1 * id.nb[0] + j2 * id.nb[1] + j3 * id.nb[2]);
    if (k < 0 || k >= d.ne[1]) {
        if (threadIdx.x == 0) report_error(err, code);
        return;
    }
    char* drow = dst + row_offs(d, k, i2, i3);
#pragma unroll
    for (int u = 0; u < SET_ROWS_AHEAD; ++u) {
        const i64 i0 = first + u * step;
        if (i0 < d.ne[0]) st<TD>(drow + i0 * d.nb[0], ahead[u]);
    }
    for (i64 i0 = first + SET_ROWS_AHEAD * step; i0 < d.ne[0]; i0 += step) {
        st<TD>(drow + i0 * d.nb[0], ld<TS>(brow + i0 * bd.nb[0]));
    }
}

#define GG_SET_ROWS(TS, SS, TD, SD)                                                                      \
    extern "C" __global__ void set_rows_##SS##_##SD(char* dst, TDesc d, const char* b, TDesc bd,         \
                                                   const char* idx, TDesc id, int* err, int code) {      \
        gg_grid_sync();                                                                                  \
        set_rows_impl<TS, TD>(dst, d, b, bd, idx, id, err, code);                                       \
    }

#define GG_SET_ROWS_D(TS, SS) GG_SET_ROWS(TS, SS, float, f32) GG_SET_ROWS(TS, SS, f16, f16) GG_SET_ROWS(TS, SS, bf16, bf16)
GG_SET_ROWS_D(float, f32)
GG_SET_ROWS_D(f16, f16)
GG_SET_ROWS_D(bf16, bf16)
