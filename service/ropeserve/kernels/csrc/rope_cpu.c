/*
 * One-pass RoPE rotation on CPU, rounding exactly where the eager formula rounds.
 *
 * For every row (token) r and head h, channel pair (a, b) with cos c and sin s (already in x's dtype):
 *
 *     first  = R(R(a * c) - R(b * s))      eager: x * cos + rotate_half(x) * sin
 *     second = R(R(b * c) + R(a * s))
 *
 * R rounds a float to x's dtype (identity for float32, round-to-nearest-even for bfloat16 and float16),
 * as ATen rounds every elementwise op; products and sums are computed in float32 as ATen does. Built
 * with -ffp-contract=off so no multiply-add is fused: the results are bit-identical to the eager formula.
 *
 * Pairs are (i, i + n) for NeoX and (2i, 2i + 1) for GPT-J, i < n = rotary_dim / 2; the channels past
 * rotary_dim pass through (copied when out-of-place). Strides are in elements; channels are contiguous.
 */
#include <stdint.h>
#include <string.h>

#define LOAD_F32(v) (v)
#define STORE_F32(f) (f)

static inline float load_bf16(uint16_t v) {
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t store_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    uint16_t rounded = (uint16_t)((bits + ((bits >> 16) & 1u) + 0x7FFFu) >> 16);
    return f != f ? (uint16_t)0x7FC0 : rounded;
}

/* f rounded to the nearest bfloat16, kept as a float (the same value as load_bf16(store_bf16(f))). */
static inline float round_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    bits = (bits + ((bits >> 16) & 1u) + 0x7FFFu) & 0xFFFF0000u;
    float rounded;
    memcpy(&rounded, &bits, sizeof rounded);
    return f != f ? f : rounded;
}

#define LOAD_BF16(v) load_bf16(v)
#define STORE_BF16(f) store_bf16(f)
#define ROUND_BF16(f) round_bf16(f)
#define LOAD_F16(v) ((float)(v))
#define STORE_F16(f) ((_Float16)(f))
#define ROUND_F16(f) ((float)(_Float16)(f))
#define ROUND_F32(f) (f)

/* n channel pairs of one head: (A_IN, B_IN) rotated into (A_OUT, B_OUT), indexed by i. Intermediate
 * products are rounded to x's dtype but kept as floats (ROUND); a NaN stays NaN until the final STORE. */
#define ROTATE_PAIRS(LOAD, STORE, ROUND, A_IN, B_IN, A_OUT, B_OUT)                                    \
    for (int64_t i = 0; i < n; ++i) {                                                               \
        float a = LOAD(A_IN), b = LOAD(B_IN), c = LOAD(cos_row[i]), s = LOAD(sin_row[i]);          \
        float ac = ROUND(a * c), bs = ROUND(b * s), bc = ROUND(b * c), as = ROUND(a * s);           \
        A_OUT = STORE(ac - bs);                                                                     \
        B_OUT = STORE(bc + as);                                                                     \
    }

/* Per pairing, an out-of-place and an in-place head. Every pointer is restrict: NeoX halves never overlap,
 * and in place each element is read before it is written at the same index, so the loops vectorize
 * without run-time alias checks. */
#define DEFINE_HEADS(NAME, T, LOAD, STORE, ROUND)                                                     \
    static void neox_##NAME(const T *restrict x, T *restrict out, const T *restrict cos_row,         \
                            const T *restrict sin_row, int64_t n) {                                  \
        const T *restrict x_hi = x + n;                                                              \
        T *restrict out_hi = out + n;                                                                \
        ROTATE_PAIRS(LOAD, STORE, ROUND, x[i], x_hi[i], out[i], out_hi[i])                           \
    }                                                                                                \
    static void gptj_##NAME(const T *restrict x, T *restrict out, const T *restrict cos_row,         \
                            const T *restrict sin_row, int64_t n) {                                  \
        ROTATE_PAIRS(LOAD, STORE, ROUND, x[2 * i], x[2 * i + 1], out[2 * i], out[2 * i + 1])         \
    }                                                                                                \
    static void neox_inplace_##NAME(T *restrict x, const T *restrict cos_row,                        \
                                    const T *restrict sin_row, int64_t n) {                          \
        T *restrict x_hi = x + n;                                                                    \
        ROTATE_PAIRS(LOAD, STORE, ROUND, x[i], x_hi[i], x[i], x_hi[i])                               \
    }                                                                                                \
    static void gptj_inplace_##NAME(T *restrict x, const T *restrict cos_row,                        \
                                    const T *restrict sin_row, int64_t n) {                          \
        ROTATE_PAIRS(LOAD, STORE, ROUND, x[2 * i], x[2 * i + 1], x[2 * i], x[2 * i + 1])             \
    }

/*
 * Exported entry point per dtype: rows [row_begin, row_end) of x, [rows, heads, head_dim] with the given
 * row/head strides, rotated into out (same indexing; out == x for in place). cos, sin: [rows, n_freq]
 * contiguous, in x's dtype. gptj: 0 for NeoX pairing, 1 for GPT-J.
 */
#define DEFINE_ROTATE(NAME, T, LOAD, STORE, ROUND)                                                    \
    DEFINE_HEADS(NAME, T, LOAD, STORE, ROUND)                                                         \
    void ropeserve_rotate_##NAME(const T *x, T *out, int64_t row_begin, int64_t row_end,             \
                                 int64_t heads, int64_t head_dim, int64_t x_row_stride,              \
                                 int64_t x_head_stride, int64_t out_row_stride,                      \
                                 int64_t out_head_stride, const T *cos, const T *sin, int64_t n_freq, \
                                 int32_t gptj) {                                                     \
        size_t pass_bytes = (size_t)(head_dim - 2 * n_freq) * sizeof(T);                             \
        for (int64_t r = row_begin; r < row_end; ++r) {                                              \
            const T *cos_row = cos + r * n_freq, *sin_row = sin + r * n_freq;                        \
            for (int64_t h = 0; h < heads; ++h) {                                                    \
                const T *head_in = x + r * x_row_stride + h * x_head_stride;                         \
                T *head_out = out + r * out_row_stride + h * out_head_stride;                        \
                if (head_in == head_out) {                                                           \
                    (gptj ? gptj_inplace_##NAME : neox_inplace_##NAME)(head_out, cos_row, sin_row,   \
                                                                       n_freq);                      \
                    continue;                                                                        \
                }                                                                                    \
                (gptj ? gptj_##NAME : neox_##NAME)(head_in, head_out, cos_row, sin_row, n_freq);     \
                memcpy(head_out + 2 * n_freq, head_in + 2 * n_freq, pass_bytes);                     \
            }                                                                                        \
        }                                                                                            \
    }

DEFINE_ROTATE(float32, float, LOAD_F32, STORE_F32, ROUND_F32)
DEFINE_ROTATE(bfloat16, uint16_t, LOAD_BF16, STORE_BF16, ROUND_BF16)
#ifdef __FLT16_MAX__
DEFINE_ROTATE(float16, _Float16, LOAD_F16, STORE_F16, ROUND_F16)
#endif
