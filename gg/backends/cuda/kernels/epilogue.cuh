// The sibling step's epilogue (families/siblings.py SibEpilogue): each finished row of a product
// of one decode token goes through rope(q), rope(k) and the K/V cache writes (`cpy` into a cache
// view, or `set_rows`) in the launch that computed it. Shared by the float sibling mat-vec
// (siblings.cu) and the block-quantized one (quant.cu): both give a block `per` rows of a product
// and call epi_rows for which rows, and sib_epilogue for each finished row with its rope partner.
// SIB_ROPES and SIB_WRITES come from the host (families/siblings.py EPI_ROPES, EPI_WRITES, as -D).
#pragma once
#include "common.cuh"

// All fields 8 bytes: the host packs them as words.
// A rope of member rows [lo, lo + n) in heads of hd into `out` (null: read inside the step only).
struct SibRope {
    char* out;
    const char* pos;
    const double* freqs;
    i64 member, lo, n, hd, n_dims, neox;
};
// A cache write of member rows [lo, lo + n), raw or as rope `rope` made them (-1: raw). Element u
// of the range is (c, i1, i2, i3) of the written tensor: c = u % ne0, i_k = (u / ne0 / div[k]) %
// ne[k]. It goes to dst + c*nb[0] + row*nb[1] + i2*nb[2] + i3*nb[3], row = i1 (a cpy) or
// idx[i1, i2 % ine[0], i3 % ine[1]] (a set_rows; out of [0, nrows): nothing written, `code`
// reported through `err`, as rows.cu's set_rows does).
struct SibWrite {
    char* dst;
    const char* idx;
    i64 member, rope, lo, n, ne0, div[3], ne[3], nb[4], inb[3], ine[2], nrows, dt;
};
struct SibEpi {
    SibRope r[SIB_ROPES];
    SibWrite w[SIB_WRITES];
    int* err;
    i64 code;
};

// Which member rows a block of `per` rows from m0 (a multiple of per, even) takes, so that every
// rotated pair is two rows of the block: block row j is member row r0 + j, plus `jump` for
// j >= split. NORMAL's pairs (2i, 2i + 1) are rows j, j ^ 1 of the contiguous rows anyway (split
// = per, jump = 0). NEOX's (i, i + n_dims/2): a block at column c (< n_dims) of its head takes the
// pair slots c/2 .. c/2 + per/2 - 1 of the first half and their partners (split = per/2); the
// planner admits NEOX only where per divides head_dim and n_dims (families/siblings.py _epi_rope).
__device__ __forceinline__ void epi_rows(const SibEpi& e, int member, i64 m0, int per, i64& r0, int& split, i64& jump) {
    r0 = m0;
    split = per;
    jump = 0;
#pragma unroll
    for (int k = 0; k < SIB_ROPES; ++k) {
        const SibRope& r = e.r[k];
        const i64 j = m0 - r.lo;
        if (r.n && r.member == member && r.neox && j >= 0 && j < r.n) {
            const int c = (int)j % (int)r.hd;  // 32-bit: a 64-bit modulo is a long software routine
            if (c < (int)r.n_dims) {
                r0 = m0 - c + c / 2;
                split = per / 2;
                jump = r.n_dims / 2 - per / 2;
            }
        }
    }
}

// Block row j's rope partner and whether j is the pair's second, for epi_rows' layout.
__device__ __forceinline__ int epi_partner(int j, int split, int per, bool& second) {
    if (split == per) {
        second = j & 1;
        return j ^ 1;
    }
    second = j >= split;
    return second ? j - split : j + split;
}

// What member row m's epilogue reads from memory (position, frequency, cache rows), requested
// apart from its value: a kernel can issue these loads before its partial sums meet (siblings.cu
// sib_impl), so they are not a round trip at the end of every block. Raw values only: the
// sines wait for the barrier (computing them before it lengthened the quantized step, 097c179).
struct SibPre {
    double f[SIB_ROPES];
    int p[SIB_ROPES], row[SIB_WRITES];
};
__device__ __forceinline__ void sib_epi_load(const SibEpi& e, int member, i64 m, SibPre& pre) {
#pragma unroll
    for (int k = 0; k < SIB_ROPES; ++k) {
        const SibRope& r = e.r[k];
        const i64 j = m - r.lo;
        pre.f[k] = 0.0;
        pre.p[k] = 0;
        if (!r.n || r.member != member || j < 0 || j >= r.n) continue;
        const int c = (int)j % (int)r.hd, half = (int)r.n_dims / 2;
        if (c < (int)r.n_dims) {
            // theta index: NORMAL's pair (2i, 2i + 1) and NEOX's (i, i + half) both rotate by freqs[i]
            pre.f[k] = r.freqs[r.neox ? (c < half ? c : c - half) : c / 2];
            pre.p[k] = *(const int*)r.pos;
        }
    }
#pragma unroll
    for (int k = 0; k < SIB_WRITES; ++k) {
        const SibWrite& w = e.w[k];
        const i64 u = m - w.lo;
        pre.row[k] = 0;
        if (!w.dst || w.member != member || u < 0 || u >= w.n) continue;
        const int h = (int)u / (int)w.ne0;
        const int i1 = h / (int)w.div[0] % (int)w.ne[0], i2 = h / (int)w.div[1] % (int)w.ne[1],
                  i3 = h / (int)w.div[2] % (int)w.ne[2];
        pre.row[k] = w.idx ? *(const int*)(w.idx + i1 * w.inb[0] + (i2 % (int)w.ine[0]) * w.inb[1] +
                                           (i3 % (int)w.ine[1]) * w.inb[2])
                           : i1;
    }
}

// Member row m's value v (x0, x1: the raw values of its rope pair; second: m is the pair's second),
// with what sib_epi_load read for row m.
__device__ __forceinline__ void sib_epilogue(const SibEpi& e, const SibPre& pre, int member, char* raw, i64 m,
                                             float v, float x0, float x1, bool second) {
    if (raw) *(float*)raw = v;
    float roped[SIB_ROPES];
#pragma unroll
    for (int k = 0; k < SIB_ROPES; ++k) {
        const SibRope& r = e.r[k];
        const i64 j = m - r.lo;
        roped[k] = v;
        if (!r.n || r.member != member || j < 0 || j >= r.n) continue;
        if ((int)j % (int)r.hd < (int)r.n_dims) {
            float sn, cs;
            rope_sincos((double)pre.p[k], pre.f[k], sn, cs);
            roped[k] = rope_rotate(x0, x1, sn, cs, second);
        }
        if (r.out) *(float*)(r.out + j * (i64)sizeof(float)) = roped[k];
    }
#pragma unroll
    for (int k = 0; k < SIB_WRITES; ++k) {
        const SibWrite& w = e.w[k];
        const i64 u = m - w.lo;
        if (!w.dst || w.member != member || u < 0 || u >= w.n) continue;
        float y = v;
#pragma unroll
        for (int q = 0; q < SIB_ROPES; ++q)
            if (w.rope == q) y = roped[q];
        const int c = (int)u % (int)w.ne0, h = (int)u / (int)w.ne0;
        const int i2 = h / (int)w.div[1] % (int)w.ne[1], i3 = h / (int)w.div[2] % (int)w.ne[2];
        const i64 row = pre.row[k];
        if (w.idx && (row < 0 || row >= w.nrows)) {
            report_error(e.err, (int)e.code);
            continue;
        }
        st_dt(w.dst + c * w.nb[0] + row * w.nb[1] + i2 * w.nb[2] + i3 * w.nb[3], y, (int)w.dt);
    }
}

// Both at once (loads at the end of the block).
__device__ __forceinline__ void sib_epilogue(const SibEpi& e, int member, char* raw, i64 m, float v, float x0,
                                             float x1, bool second) {
    SibPre pre;
    sib_epi_load(e, member, m, pre);
    sib_epilogue(e, pre, member, raw, m, v, x0, x1, second);
}
