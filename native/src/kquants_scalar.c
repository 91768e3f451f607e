/*
 * kquants_scalar.c — K-quant (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) type info, panel packing, row
 * dequantization, SIMD dispatch and the portable kernels: the readable
 * statement of what the AVX2 / AVX-512 paths compute bit for bit.
 */
#include "kquants.h"
#include "colibri.h"

#include <math.h>
#include <string.h>

static inline uint16_t rd16(const void *p) { uint16_t v; memcpy(&v, p, 2); return v; }

int cb_kq_is_kquant(int type) {
    return type == CB_TYPE_Q2_K || type == CB_TYPE_Q3_K || type == CB_TYPE_Q4_K || type == CB_TYPE_Q5_K ||
           type == CB_TYPE_Q6_K;
}

size_t cb_kq_block_bytes(int type) {
    switch (type) {
    case CB_TYPE_Q2_K: return sizeof(cb_block_q2_K);
    case CB_TYPE_Q3_K: return sizeof(cb_block_q3_K);
    case CB_TYPE_Q4_K: return sizeof(cb_block_q4_K);
    case CB_TYPE_Q5_K: return sizeof(cb_block_q5_K);
    case CB_TYPE_Q6_K: return sizeof(cb_block_q6_K);
    default: return 0;
    }
}

const char *cb_kq_type_name(int type) {
    switch (type) {
    case CB_TYPE_Q2_K: return "q2_K";
    case CB_TYPE_Q3_K: return "q3_K";
    case CB_TYPE_Q4_K: return "q4_K";
    case CB_TYPE_Q5_K: return "q5_K";
    case CB_TYPE_Q6_K: return "q6_K";
    default: return NULL;
    }
}

/* ----------------------------------------------------------------- pack */

void cb_kq_pack_block(int type, const uint8_t *blk, int j, uint8_t *pk) {
    switch (type) {
    case CB_TYPE_Q4_K:
    case CB_TYPE_Q5_K: {
        const int q5 = type == CB_TYPE_Q5_K;
        memcpy(pk + 2 * j, blk, 2);            /* d */
        memcpy(pk + 32 + 2 * j, blk + 2, 2);   /* dmin */
        for (int k = 0; k < 12; k++) pk[64 + 16 * k + j] = blk[4 + k];
        const uint8_t *qs = blk + (q5 ? 48 : 16);
        uint8_t *pq = pk + (q5 ? 768 : 256);
        if (q5)
            for (int c = 0; c < 8; c++) memcpy(pk + 256 + 64 * c + 4 * j, blk + 16 + 4 * c, 4);
        for (int g = 0; g < 4; g++)
            for (int c = 0; c < 8; c++) memcpy(pq + 512 * g + 64 * c + 4 * j, qs + 32 * g + 4 * c, 4);
        break;
    }
    case CB_TYPE_Q6_K: {
        memcpy(pk + 2 * j, blk + 208, 2);      /* d */
        for (int i = 0; i < 16; i++) pk[32 + 16 * i + j] = blk[192 + i];
        uint8_t q[CB_QK_K];                    /* the 6-bit quants in element order (ggml's dequantize_row_q6_K) */
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *ql = blk + 64 * h, qh = blk[128 + 32 * h + l];
                q[128 * h + l] = (uint8_t)((ql[l] & 0xF) | ((qh & 3) << 4));
                q[128 * h + l + 32] = (uint8_t)((ql[l + 32] & 0xF) | (((qh >> 2) & 3) << 4));
                q[128 * h + l + 64] = (uint8_t)((ql[l] >> 4) | (((qh >> 4) & 3) << 4));
                q[128 * h + l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh >> 6) & 3) << 4));
            }
        for (int g = 0; g < 16; g++)  /* group g: chunks 4 (g & 1) .. + 3 of 32-weight block g / 2 */
            for (int t = 0; t < 4; t++) {
                const uint8_t *e = q + 32 * (g >> 1) + 16 * (g & 1) + t;  /* element t of chunk 0 of the group */
                const int w3 = e[12];
                for (int v = 0; v < 3; v++)
                    pk[288 + 192 * g + 64 * v + 4 * j + t] = (uint8_t)(e[4 * v] | ((w3 >> (2 * v)) & 3) << 6);
            }
        break;
    }
    default:
        break;
    }
}

/* ------------------------------------------------------------ activations */

/* d = max|x| / 127 over 256 values (a zero block stays all zeros, d = 0),
 * q = round(x / d) through the reciprocal, as cb_block_q8 over 32. */
void cb_kq_quantize_q8k_scalar(const float *x, cb_block_q8k *q, int64_t n) {
    for (int64_t b = 0; b < n / CB_QK_K; b++) {
        const float *xb = x + b * CB_QK_K;
        float id;
        const float d = cb_q8_scale(xb, CB_QK_K, &id);
        for (int i = 0; i < CB_QK_K; i++) q[b].qs[i] = (int8_t)cb_round_q8(xb[i] * id);
        for (int i = 0; i < 16; i++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += q[b].qs[16 * i + l];
            q[b].bs16[i] = (int16_t)s;
        }
        for (int j = 0; j < 8; j++) q[b].bs32[j] = (int16_t)(q[b].bs16[2 * j] + q[b].bs16[2 * j + 1]);
        q[b].d = d;
        memset(q[b].pad, 0, sizeof q[b].pad);  /* defined bytes: blocks compare with memcmp */
    }
}

void cb_kq_quantize_q8k(int simd, const float *x, cb_block_q8k *q, int64_t n) {
    if (simd == CB_SIMD_AVX512 && cb_kq_quantize_q8k_avx512(x, q, n)) return;
    if (simd >= CB_SIMD_AVX2 && cb_kq_quantize_q8k_avx2(x, q, n)) return;
    cb_kq_quantize_q8k_scalar(x, q, n);
}

/* ------------------------------------------------------------ dequantize */

/* Element order of every block type: sub-block j covers out[32j .. 32j+32). */
void cb_kq_row_f32(int type, const void *row, int64_t n, float *out) {
    const uint8_t *p = row;
    const int64_t nsb = n / CB_QK_K;
    for (int64_t s = 0; s < nsb; s++, out += CB_QK_K) {
        if (type == CB_TYPE_Q4_K || type == CB_TYPE_Q5_K) {
            const int q5 = type == CB_TYPE_Q5_K;
            const uint8_t *blk = p + (size_t)s * cb_kq_block_bytes(type);
            const float d = cb_f16_to_f32(rd16(blk)), dmin = cb_f16_to_f32(rd16(blk + 2));
            const uint8_t *scales = blk + 4;
            const uint8_t *qh = q5 ? blk + 16 : NULL;
            const uint8_t *qs = q5 ? blk + 48 : blk + 16;
            for (int j = 0; j < 8; j++) {
                int sc, m;
                cb_kq_scale_min(scales, j, &sc, &m);
                const float dl = d * (float)sc, ml = dmin * (float)m;
                const uint8_t *q = qs + 32 * (j / 2);
                for (int l = 0; l < 32; l++) {
                    int v = (j & 1) ? q[l] >> 4 : q[l] & 0xF;
                    if (q5) v |= ((qh[l] >> j) & 1) << 4;
                    out[32 * j + l] = dl * (float)v - ml;
                }
            }
        } else if (type == CB_TYPE_Q6_K) {
            const cb_block_q6_K *blk = (const cb_block_q6_K *)(p + (size_t)s * sizeof(cb_block_q6_K));
            const float d = cb_f16_to_f32(rd16(&blk->d));
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = blk->ql + 64 * h, *qh = blk->qh + 32 * h;
                const int8_t *sc = blk->scales + 8 * h;
                for (int k = 0; k < 4; k++)
                    for (int l = 0; l < 32; l++) {
                        const int lo = k & 1 ? ql[l + 32] : ql[l];
                        const int v = ((k & 2 ? lo >> 4 : lo & 0xF) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
                        out[128 * h + 32 * k + l] = d * (float)sc[2 * k + l / 16] * (float)v;
                    }
            }
        } else if (type == CB_TYPE_Q2_K || type == CB_TYPE_Q3_K) {
            const int q3 = type == CB_TYPE_Q3_K;
            const uint8_t *blk = p + (size_t)s * cb_kq_block_bytes(type);
            int sc3[16];
            if (q3) cb_kq3_scales(blk + 96, sc3);
            const float d = cb_f16_to_f32(rd16(blk + (q3 ? 108 : 80)));
            const float dmin = q3 ? 0.0f : cb_f16_to_f32(rd16(blk + 82));
            const uint8_t *qs = blk + (q3 ? 32 : 16);
            for (int h = 0; h < 2; h++)
                for (int k = 0; k < 4; k++)
                    for (int l = 0; l < 32; l++) {
                        const int i = 8 * h + 2 * k + l / 16;  /* scale of these 16 weights */
                        int v = (qs[32 * h + l] >> (2 * k)) & 3;
                        float x;
                        if (q3) {
                            v -= (blk[l] >> (4 * h + k)) & 1 ? 0 : 4;
                            x = d * (float)sc3[i] * (float)v;
                        } else {
                            x = d * (float)(blk[i] & 0xF) * (float)v - dmin * (float)(blk[i] >> 4);
                        }
                        out[128 * h + 32 * k + l] = x;
                    }
        } else {
            memset(out, 0, CB_QK_K * sizeof(float));
        }
    }
}

/* ---------------------------------------------------------------- dots */

/* Q4_K (q5 = 0) and Q5_K (q5 = 1): the integer sums of a super-block, then
 * its float step (kquants.h). */
static float dot_q45_K(const int q5, const uint8_t *w, const cb_block_q8k *x, int64_t nsb) {
    const size_t bsz = q5 ? sizeof(cb_block_q5_K) : sizeof(cb_block_q4_K);
    float acc = 0.0f;
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *blk = w + (size_t)s * bsz;
        const float d = cb_f16_to_f32(rd16(blk)), dmin = cb_f16_to_f32(rd16(blk + 2));
        const uint8_t *scales = blk + 4, *qh = blk + 16, *qs = q5 ? blk + 48 : blk + 16;
        const cb_block_q8k *xb = x + s;
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = qs + 32 * (j / 2);
            const int shift = 4 * (j & 1);
            int32_t t = 0;
            for (int l = 0; l < 32; l++) {
                int v = (q[l] >> shift) & 0xF;
                if (q5) v |= ((qh[l] >> j) & 1) << 4;
                t += v * xb->qs[32 * j + l];
            }
            int sc, m;
            cb_kq_scale_min(scales, j, &sc, &m);
            isum += sc * t;
            msum += m * xb->bs32[j];
        }
        acc = cb_kq_step_min(acc, isum, msum, d, dmin, xb->d);
    }
    return acc;
}

static float dot_q6_K(const uint8_t *w, const cb_block_q8k *x, int64_t nsb) {
    float acc = 0.0f;
    for (int64_t s = 0; s < nsb; s++) {
        const cb_block_q6_K *blk = (const cb_block_q6_K *)(w + (size_t)s * sizeof(cb_block_q6_K));
        const float d = cb_f16_to_f32(rd16(&blk->d));
        const cb_block_q8k *xb = x + s;
        int32_t isum = 0;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = blk->ql + 64 * h, *qh = blk->qh + 32 * h;
            for (int k = 0; k < 4; k++) {
                int32_t t[2] = { 0, 0 };
                for (int l = 0; l < 32; l++) {
                    const int lo = k & 1 ? ql[l + 32] : ql[l];
                    const int v = ((k & 2 ? lo >> 4 : lo & 0xF) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
                    t[l / 16] += v * xb->qs[128 * h + 32 * k + l];
                }
                isum += blk->scales[8 * h + 2 * k] * t[0] + blk->scales[8 * h + 2 * k + 1] * t[1];
            }
        }
        acc = cb_kq_step(acc, isum, d, xb->d);
    }
    return acc;
}

/* Q2_K (q3 = 0) and Q3_K (q3 = 1): per activation block two 16-weight
 * halves with their own scales (and Q2_K mins against the halves' sums). */
static float dot_q23_K(const int q3, const uint8_t *w, const cb_block_q8 *x, int64_t nsb) {
    const size_t bsz = q3 ? sizeof(cb_block_q3_K) : sizeof(cb_block_q2_K);
    float acc = 0.0f;
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *blk = w + (size_t)s * bsz;
        int sc3[16];
        if (q3) cb_kq3_scales(blk + 96, sc3);
        const float d = cb_f16_to_f32(rd16(blk + (q3 ? 108 : 80)));
        const float dmin = q3 ? 0.0f : cb_f16_to_f32(rd16(blk + 82));
        const uint8_t *qs = blk + (q3 ? 32 : 16);
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++) {
                const cb_block_q8 *xb = x + s * 8 + h * 4 + k;
                int isum[2] = { 0, 0 }, xsum[2] = { 0, 0 };
                for (int l = 0; l < 32; l++) {
                    int v = (qs[32 * h + l] >> (2 * k)) & 3;
                    if (q3) v -= (blk[l] >> (4 * h + k)) & 1 ? 0 : 4;
                    isum[l / 16] += v * xb->qs[l];
                    xsum[l / 16] += xb->qs[l];
                }
                const int i = 8 * h + 2 * k;
                if (q3) {
                    acc = cb_kq_acc(acc, sc3[i] * isum[0] + sc3[i + 1] * isum[1], d, xb);
                } else {
                    acc = cb_kq_acc(acc, (blk[i] & 0xF) * isum[0] + (blk[i + 1] & 0xF) * isum[1], d, xb);
                    const float dm = dmin * xb->d;
                    acc -= (float)((blk[i] >> 4) * xsum[0] + (blk[i + 1] >> 4) * xsum[1]) * dm;
                }
            }
    }
    return acc;
}

void cb_kq_matmul_rows_scalar(const cb_weight *w, const cb_block_q8 *xq, const cb_block_q8k *xk, int n_rows,
                              float *y, int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t nsb = w->n_in / CB_QK_K, nb = w->n_in / CB_QK;
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *wr = (const uint8_t *)w->data + (size_t)o * w->row_bytes;
        for (int r = 0; r < n_rows; r++) {
            float v;
            switch (w->type) {
            case CB_TYPE_Q2_K: v = dot_q23_K(0, wr, xq + r * nb, nsb); break;
            case CB_TYPE_Q3_K: v = dot_q23_K(1, wr, xq + r * nb, nsb); break;
            case CB_TYPE_Q4_K: v = dot_q45_K(0, wr, xk + r * nsb, nsb); break;
            case CB_TYPE_Q5_K: v = dot_q45_K(1, wr, xk + r * nsb, nsb); break;
            case CB_TYPE_Q6_K: v = dot_q6_K(wr, xk + r * nsb, nsb); break;
            default: v = 0.0f; break;
            }
            y[r * ldy + o] = v;
        }
    }
}

/* Every level gives the same bits (the same integer sums, the same float
 * steps in the same order) and reads the same panel layout, so the level a
 * matmul runs at is a speed choice (and within the AVX-512 level, the
 * kernel: kquants_avx512.c's 256-bit one for decode's Q4_K on Zen 4). */
void cb_kq_matmul_rows(int simd, const cb_weight *w, const cb_block_q8 *xq, const cb_block_q8k *xk, int n_rows,
                       float *y, int64_t ldy, int64_t o0, int64_t o1) {
    if (simd == CB_SIMD_AVX512 && cb_kq_matmul_rows_avx512(w, xq, xk, n_rows, y, ldy, o0, o1)) return;
    if (simd >= CB_SIMD_AVX2 && cb_kq_matmul_rows_avx2(w, xq, xk, n_rows, y, ldy, o0, o1)) return;
    cb_kq_matmul_rows_scalar(w, xq, xk, n_rows, y, ldy, o0, o1);
}
