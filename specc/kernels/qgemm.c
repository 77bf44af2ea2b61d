/* Block-quantized weight x fp32 activation products for decoding and speculative verification on CPUs.
 *
 *   y[r, n] = sum_k x[r, k] * w[n, k]       x [R, K] fp32, y [R, N] fp32, w [N, K] kept quantized
 *
 * Two weight layouts, both the checkpoint's own values (no re-quantization; see specc/models/qweights.py):
 *   q4: qs uint8 [N, K/32, 16], d, m fp32 [N, K/32]: block b of row n holds 32 4-bit codes, byte j's low
 *       nibble is element j and its high nibble element j + 16 (GGML's Q4_0 / Q4_1 order,
 *       ggml-common.h block_q4_1); w = d * q + m (Q4_1; Q4_0 has m = -8 d; Q4_K's 32-element
 *       sub-blocks have d = d_super * scale, m = -dmin_super * min).
 *   q8: qs int8 [N, K/G, G], d fp32 [N, K/G], G a multiple of 16: w = d * q (Q8_0: G = 32;
 *       Q6_K: G = 16, q = code - 32, d = d_super * scale).
 * The weights are dequantized in registers (one fused multiply-add per 16 codes) and multiplied with
 * the fp32 activations in fp32, so a row's result is the checkpoint's weights applied in fp32: no
 * activation quantization (llama.cpp quantizes activations to 8 bits per 32-block, ggml-quants.c
 * quantize_row_q8_1, and multiplies in integers).
 *
 * Invariance: every y[r, n] is the same sequence of fp32 operations (per-lane partial sums over the
 * blocks in order, one fixed horizontal reduction) whatever R, the tile it falls in and the thread
 * count, within one instruction-set variant. A verify over R = kappa + 1 rows therefore gives each row
 * the bits a one-row step gives it: speculative greedy output equals plain greedy output.
 *
 * Variants, chosen at run time by CPUID (qgemm_variants) or forced by the caller: 2 = AVX-512F,
 * 1 = AVX2 + FMA, 0 = portable C. They sum in different orders, so their bits differ from each other
 * (by ~1e-6 relative); one process uses one variant for every product. Variants 3 (AVX-512 VNNI) and 4
 * (AVX2 int8) run q4 and Q8_0 weights repacked, with int8 activations (below), and give each other's
 * bits; their other products are variant 2's (variant 4: 1's without AVX-512F).
 *
 * Tiling: NC output rows x RC activation rows per register tile (AVX-512: 4 x 1 for one row, 4 x 2,
 * 2 x 3, 2 x 4, then 1 x 5..8, rows taken 8 at a time; AVX2: up to 2 x 4, rows 4 at a time; a block's
 * codes are decoded once per tile and used for RC rows), output rows
 * walked in blocks of OBLOCK so a block's weights stay in L2 across row chunks; OpenMP threads split
 * the output blocks. Every tile is a separate function compiled for its row count (and the packed ones for
 * their weight streams); a product picks the ones for its R. qgemm_trace records which ones ran and
 * qgemm_walk says which a product of R rows runs.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define OBLOCK 64
#define QK 32

/* Prefetch the next tile's weights (the NC output rows after this tile's; rows are contiguous, so the
 * next tile starts where this one ends) while this tile runs: its codes are NC * nb * 16 bytes, one
 * 64-byte line per NC/4 blocks; its scales NC * nb * 4 bytes each. Prefetching past the end of the
 * weight is harmless (a prefetch never faults). */
#ifndef PF_TILES
#define PF_TILES 4 /* how many tiles ahead to prefetch */
#endif
#ifndef QGEMM_NO_PREFETCH
#define PREFETCH_NEXT(NC, b, nb, pq, pd, pm)                                                                    \
    do {                                                                                                        \
        if ((b) * 64 < (NC) * (nb) * 16) _mm_prefetch((pq) + (b) * 64, _MM_HINT_T0);                           \
        if ((b) % 4 == 0 && (b) * 16 < (NC) * (nb) * 4) {                                                       \
            _mm_prefetch((pd) + (b) * 16, _MM_HINT_T0);                                                         \
            _mm_prefetch((pm) + (b) * 16, _MM_HINT_T0);                                                         \
        }                                                                                                       \
    } while (0)
#else
#define PREFETCH_NEXT(NC, b, nb, pq, pd, pm) ((void)0)
#endif

/* ------------------------------------------------------------------------------------- portable */
static void q4_tile_c(int NC, int RC, const float *x, long K, const uint8_t *qs, const float *d, const float *m,
                      float *y, long N, long n0) {
    long nb = K / QK;
    for (int c = 0; c < NC; c++) {
        long n = n0 + c;
        for (int r = 0; r < RC; r++) {
            float acc[QK];
            memset(acc, 0, sizeof acc);
            const float *xr = x + r * K;
            for (long b = 0; b < nb; b++) {
                const uint8_t *q = qs + (n * nb + b) * 16;
                float db = d[n * nb + b], mb = m[n * nb + b];
                for (int j = 0; j < 16; j++) {
                    acc[j] += xr[b * QK + j] * (db * (float)(q[j] & 15) + mb);
                    acc[j + 16] += xr[b * QK + j + 16] * (db * (float)(q[j] >> 4) + mb);
                }
            }
            float s = 0.f;
            for (int j = 0; j < QK; j++) s += acc[j];
            y[r * N + n] = s;
        }
    }
}

static void q8_tile_c(int NC, int RC, const float *x, long K, long G, const int8_t *qs, const float *d,
                      float *y, long N, long n0) {
    long nb = K / G;
    for (int c = 0; c < NC; c++) {
        long n = n0 + c;
        for (int r = 0; r < RC; r++) {
            float acc[16];
            memset(acc, 0, sizeof acc);
            const float *xr = x + r * K;
            for (long b = 0; b < nb; b++) {
                const int8_t *q = qs + (n * nb + b) * G;
                float db = d[n * nb + b];
                for (long j = 0; j < G; j++) acc[j & 15] += xr[b * G + j] * (db * (float)q[j]);
            }
            float s = 0.f;
            for (int j = 0; j < 16; j++) s += acc[j];
            y[r * N + n] = s;
        }
    }
}

/* ------------------------------------------------------------------------------------- AVX2 + FMA */
__attribute__((target("avx2,fma"))) static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#define Q4_AVX2(NC, RC)                                                                                         \
    __attribute__((target("avx2,fma"))) static void q4_avx2_##NC##x##RC(                                       \
        const float *x, long K, const uint8_t *qs, const float *d, const float *m, float *y, long N, long n0) { \
        long nb = K / QK;                                                                                       \
        __m256 acc[NC][RC][4];                                                                                  \
        for (int c = 0; c < NC; c++)                                                                            \
            for (int r = 0; r < RC; r++)                                                                        \
                for (int h = 0; h < 4; h++) acc[c][r][h] = _mm256_setzero_ps();                                 \
        const __m128i lo4 = _mm_set1_epi8(15);                                                                  \
        const char *pq = (const char *)(qs + (n0 + PF_TILES * NC) * nb * 16), *pd = (const char *)(d + (n0 + PF_TILES * NC) * nb);    \
        const char *pm = (const char *)(m + (n0 + PF_TILES * NC) * nb);                                                    \
        for (long b = 0; b < nb; b++) {                                                                         \
            PREFETCH_NEXT(NC, b, nb, pq, pd, pm);                                                               \
            for (int c = 0; c < NC; c++) {                                                                      \
                long i = (n0 + c) * nb + b;                                                                     \
                __m128i raw = _mm_loadu_si128((const __m128i *)(qs + i * 16));                                  \
                __m128i ql = _mm_and_si128(raw, lo4), qh = _mm_and_si128(_mm_srli_epi16(raw, 4), lo4);          \
                __m256 db = _mm256_set1_ps(d[i]), mb = _mm256_set1_ps(m[i]);                                    \
                __m256 w0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(ql)), db, mb);              \
                __m256 w1 = _mm256_fmadd_ps(                                                                    \
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(ql, ql))), db, mb);              \
                __m256 w2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(qh)), db, mb);              \
                __m256 w3 = _mm256_fmadd_ps(                                                                    \
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(qh, qh))), db, mb);              \
                for (int r = 0; r < RC; r++) {                                                                  \
                    const float *xb = x + r * K + b * QK;                                                       \
                    acc[c][r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xb), w0, acc[c][r][0]);                      \
                    acc[c][r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 8), w1, acc[c][r][1]);                  \
                    acc[c][r][2] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 16), w2, acc[c][r][2]);                 \
                    acc[c][r][3] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 24), w3, acc[c][r][3]);                 \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
        for (int c = 0; c < NC; c++)                                                                            \
            for (int r = 0; r < RC; r++)                                                                        \
                y[r * N + n0 + c] = hsum8(_mm256_add_ps(_mm256_add_ps(acc[c][r][0], acc[c][r][1]),              \
                                                        _mm256_add_ps(acc[c][r][2], acc[c][r][3])));            \
    }

#define Q8_AVX2(NC, RC)                                                                                         \
    __attribute__((target("avx2,fma"))) static void q8_avx2_##NC##x##RC(                                       \
        const float *x, long K, long G, const int8_t *qs, const float *d, float *y, long N, long n0) {          \
        long nb = K / G;                                                                                        \
        __m256 acc[NC][RC][2];                                                                                  \
        for (int c = 0; c < NC; c++)                                                                            \
            for (int r = 0; r < RC; r++) acc[c][r][0] = acc[c][r][1] = _mm256_setzero_ps();                     \
        const char *pq = (const char *)(qs + (n0 + PF_TILES * NC) * nb * G);                                    \
        for (long b = 0; b < nb; b++) {                                                                         \
            if (b % 4 == 0) _mm_prefetch((const char *)(d + (n0 + PF_TILES * NC) * nb + b), _MM_HINT_T0);       \
            for (long j = 0; j < G; j += 16) {                                                                  \
                _mm_prefetch(pq + (b * (G / 16) + j / 16) * 64, _MM_HINT_T0);                                   \
                for (int c = 0; c < NC; c++) {                                                                  \
                    long i = (n0 + c) * nb + b;                                                                 \
                    __m128i raw = _mm_loadu_si128((const __m128i *)(qs + i * G + j));                           \
                    __m256 db = _mm256_set1_ps(d[i]);                                                           \
                    __m256 w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw)), db);               \
                    __m256 w1 = _mm256_mul_ps(                                                                  \
                        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(raw, raw))), db);            \
                    for (int r = 0; r < RC; r++) {                                                              \
                        const float *xb = x + r * K + b * G + j;                                                \
                        acc[c][r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xb), w0, acc[c][r][0]);                  \
                        acc[c][r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 8), w1, acc[c][r][1]);              \
                    }                                                                                           \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
        for (int c = 0; c < NC; c++)                                                                            \
            for (int r = 0; r < RC; r++) y[r * N + n0 + c] = hsum8(_mm256_add_ps(acc[c][r][0], acc[c][r][1]));  \
    }

/* ------------------------------------------------------------------------------------- AVX-512F */
#define Q4_AVX512(NC, RC)                                                                                       \
    __attribute__((target("avx512f,fma"))) static void q4_avx512_##NC##x##RC(                                  \
        const float *x, long K, const uint8_t *qs, const float *d, const float *m, float *y, long N, long n0) { \
        long nb = K / QK;                                                                                       \
        __m512 acc[NC][RC][2];                                                                                  \
        for (int c = 0; c < NC; c++)                                                                            \
            for (int r = 0; r < RC; r++) acc[c][r][0] = acc[c][r][1] = _mm512_setzero_ps();                     \
        const __m128i lo4 = _mm_set1_epi8(15);                                                                  \
        const char *pq = (const char *)(qs + (n0 + PF_TILES * NC) * nb * 16), *pd = (const char *)(d + (n0 + PF_TILES * NC) * nb);    \
        const char *pm = (const char *)(m + (n0 + PF_TILES * NC) * nb);                                                    \
        for (long b = 0; b < nb; b++) {                                                                         \
            PREFETCH_NEXT(NC, b, nb, pq, pd, pm);                                                               \
            for (int c = 0; c < NC; c++) {                                                                      \
                long i = (n0 + c) * nb + b;                                                                     \
                __m128i raw = _mm_loadu_si128((const __m128i *)(qs + i * 16));                                  \
                __m512 db = _mm512_set1_ps(d[i]), mb = _mm512_set1_ps(m[i]);                                    \
                __m512 w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(raw, lo4))), \
                                            db, mb);                                                            \
                __m512 w1 = _mm512_fmadd_ps(                                                                    \
                    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(raw, 4), lo4))), db,   \
                    mb);                                                                                        \
                for (int r = 0; r < RC; r++) {                                                                  \
                    const float *xb = x + r * K + b * QK;                                                       \
                    acc[c][r][0] = _mm512_fmadd_ps(_mm512_loadu_ps(xb), w0, acc[c][r][0]);                      \
                    acc[c][r][1] = _mm512_fmadd_ps(_mm512_loadu_ps(xb + 16), w1, acc[c][r][1]);                 \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
        for (int c = 0; c < NC; c++)                                                                            \
            for (int r = 0; r < RC; r++)                                                                        \
                y[r * N + n0 + c] = _mm512_reduce_add_ps(_mm512_add_ps(acc[c][r][0], acc[c][r][1]));           \
    }

#define Q8_AVX512(NC, RC)                                                                                       \
    __attribute__((target("avx512f,fma"))) static void q8_avx512_##NC##x##RC(                                  \
        const float *x, long K, long G, const int8_t *qs, const float *d, float *y, long N, long n0) {          \
        long nb = K / G;                                                                                        \
        __m512 acc[NC][RC];                                                                                     \
        for (int c = 0; c < NC; c++)                                                                            \
            for (int r = 0; r < RC; r++) acc[c][r] = _mm512_setzero_ps();                                       \
        const char *pq = (const char *)(qs + (n0 + PF_TILES * NC) * nb * G);                                    \
        for (long b = 0; b < nb; b++) {                                                                         \
            if (b % 4 == 0) _mm_prefetch((const char *)(d + (n0 + PF_TILES * NC) * nb + b), _MM_HINT_T0);       \
            for (long j = 0; j < G; j += 16) {                                                                  \
                _mm_prefetch(pq + (b * (G / 16) + j / 16) * 64, _MM_HINT_T0);                                   \
                for (int c = 0; c < NC; c++) {                                                                  \
                    long i = (n0 + c) * nb + b;                                                                 \
                    __m128i raw = _mm_loadu_si128((const __m128i *)(qs + i * G + j));                           \
                    __m512 w = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw)),                     \
                                             _mm512_set1_ps(d[i]));                                             \
                    for (int r = 0; r < RC; r++)                                                                \
                        acc[c][r] = _mm512_fmadd_ps(_mm512_loadu_ps(x + r * K + b * G + j), w, acc[c][r]);       \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
        for (int c = 0; c < NC; c++)                                                                            \
            for (int r = 0; r < RC; r++) y[r * N + n0 + c] = _mm512_reduce_add_ps(acc[c][r]);                   \
    }

/* tiles: (NC, RC) = (4, 1), (4, 2), (2, 3), (2, 4), and (1, 1..4) for the last output rows */
Q4_AVX2(4, 1) Q4_AVX2(4, 2) Q4_AVX2(2, 3) Q4_AVX2(2, 4) Q4_AVX2(1, 1) Q4_AVX2(1, 2) Q4_AVX2(1, 3) Q4_AVX2(1, 4)
Q8_AVX2(4, 1) Q8_AVX2(4, 2) Q8_AVX2(2, 3) Q8_AVX2(2, 4) Q8_AVX2(1, 1) Q8_AVX2(1, 2) Q8_AVX2(1, 3) Q8_AVX2(1, 4)
Q4_AVX512(4, 1) Q4_AVX512(4, 2) Q4_AVX512(2, 3) Q4_AVX512(2, 4) Q4_AVX512(1, 1) Q4_AVX512(1, 2) Q4_AVX512(1, 3)
Q4_AVX512(1, 4) Q4_AVX512(1, 5) Q4_AVX512(1, 6) Q4_AVX512(1, 7) Q4_AVX512(1, 8)
Q8_AVX512(4, 1) Q8_AVX512(4, 2) Q8_AVX512(2, 3) Q8_AVX512(2, 4) Q8_AVX512(1, 1) Q8_AVX512(1, 2) Q8_AVX512(1, 3)
Q8_AVX512(1, 4) Q8_AVX512(1, 5) Q8_AVX512(1, 6) Q8_AVX512(1, 7) Q8_AVX512(1, 8)


typedef void (*q4_fn)(const float *, long, const uint8_t *, const float *, const float *, float *, long, long);
typedef void (*q8_fn)(const float *, long, long, const int8_t *, const float *, float *, long, long);

/* [variant][rows in the chunk]: the wide tile and the one-output tile. AVX2 takes rows in chunks of 4,
 * AVX-512 in chunks of 8 (one decode of a block serves 8 rows; 16 accumulators). */
static const q4_fn Q4_WIDE[3][9] = {{0}, {0, q4_avx2_4x1, q4_avx2_4x2, q4_avx2_2x3, q4_avx2_2x4},
                                    {0, q4_avx512_4x1, q4_avx512_4x2, q4_avx512_2x3, q4_avx512_2x4, q4_avx512_1x5,
                                     q4_avx512_1x6, q4_avx512_1x7, q4_avx512_1x8}};
static const q4_fn Q4_ONE[3][9] = {{0}, {0, q4_avx2_1x1, q4_avx2_1x2, q4_avx2_1x3, q4_avx2_1x4},
                                   {0, q4_avx512_1x1, q4_avx512_1x2, q4_avx512_1x3, q4_avx512_1x4, q4_avx512_1x5,
                                    q4_avx512_1x6, q4_avx512_1x7, q4_avx512_1x8}};
static const q8_fn Q8_WIDE[3][9] = {{0}, {0, q8_avx2_4x1, q8_avx2_4x2, q8_avx2_2x3, q8_avx2_2x4},
                                    {0, q8_avx512_4x1, q8_avx512_4x2, q8_avx512_2x3, q8_avx512_2x4, q8_avx512_1x5,
                                     q8_avx512_1x6, q8_avx512_1x7, q8_avx512_1x8}};
static const q8_fn Q8_ONE[3][9] = {{0}, {0, q8_avx2_1x1, q8_avx2_1x2, q8_avx2_1x3, q8_avx2_1x4},
                                   {0, q8_avx512_1x1, q8_avx512_1x2, q8_avx512_1x3, q8_avx512_1x4, q8_avx512_1x5,
                                    q8_avx512_1x6, q8_avx512_1x7, q8_avx512_1x8}};
static const int WIDE_NC[9] = {0, 4, 4, 2, 2, 1, 1, 1, 1};
static const int CHUNK[3] = {4, 4, 8}; /* rows per chunk by variant */

/* Bit mask of the variants this CPU runs: bit 0 portable, bit 1 AVX2 + FMA, bit 2 AVX-512F, bit 3 AVX-512
 * VNNI (variant 3: q4 and Q8_0 products with int8 activations, the rest as variant 2), bit 4 AVX2 + FMA +
 * F16C with int8 activations (variant 4: the packed products on AVX2 tiles, the rest as variant 1). */
static int isa_ceiling = ~0; /* the variants qgemm_limit allows: every one this CPU runs unless lowered */

/* Run only the variants in mask (bit i: variant i; the portable one always stays): every choice made from
 * qgemm_variants below — the products, the AVX-512 attention, the fp32 parts of variant 4 — then takes
 * the path a CPU without the others takes, so this CPU measures another's code paths. */
void qgemm_limit(int mask) { isa_ceiling = mask | 1; }

int qgemm_variants(void) {
    int v = 1;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) v |= 2;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) v |= 4;
    if ((v & 4) && __builtin_cpu_supports("avx512vnni")) v |= 8;
    if ((v & 2) && __builtin_cpu_supports("f16c")) v |= 16;
    return v & isa_ceiling;
}

/* The variant an fp32-activation product (q4_gemm, q8_gemm, h16_gemm) runs for a qgemm variant: VNNI (3)
 * changes only the packed products and runs the rest as AVX-512F (2); AVX2 int8 (4) runs the rest as
 * AVX-512F where present, else AVX2 (1). */
static int act_variant(int variant) {
    if (variant == 3) return 2;
    if (variant == 4) return (qgemm_variants() & 4) ? 2 : 1;
    return variant;
}

/* ------------------------------------------------------------------------------------- dispatch trace
 * Which compiled tiles the products ran: when on, every product call adds one count per row chunk it
 * walks to trace_calls[product][isa][rows in the chunk][weight streams]. The tiles are instantiated per
 * (rows, streams) at compile time (the macros above and below); a product picks the one for its row count,
 * so the trace shows which row specialization each call ran. "weight streams" is the walk's S for that row
 * count (walk_streams), not a count of tile calls: WALK_GROUPS also runs one-stream tiles for the groups a
 * thread's part leaves over past S equal ranges, and only those where a part has fewer than S groups. The
 * portable fp32-activation products run one generic tile per chunk (rows an argument). Recorded by the
 * calling thread before the OpenMP region; off (one branch per product) unless qgemm_trace(1). */
enum { PRODUCT_Q4, PRODUCT_Q8, PRODUCT_H16, PRODUCT_Q4V, PRODUCT_Q8V, PRODUCTS };
#define TRACE_ISAS 5
#define TRACE_ROWS 9
#define TRACE_STREAMS 5 /* MAX_STREAMS + 1 */
static long trace_calls[PRODUCTS][TRACE_ISAS][TRACE_ROWS][TRACE_STREAMS];
static int trace_on = 0;

/* Start (on = 1: counts zeroed) or stop (on = 0: counts kept for qgemm_trace_read) the trace. */
void qgemm_trace(int on) {
    if (on) memset(trace_calls, 0, sizeof trace_calls);
    trace_on = on;
}

/* The longs of the trace: PRODUCTS * TRACE_ISAS * TRACE_ROWS * TRACE_STREAMS (what the caller's buffers hold). */
long qgemm_trace_size(void) { return (long)(sizeof trace_calls / sizeof(long)); }

/* Copy the counts to out [qgemm_trace_size()] (PRODUCTS x TRACE_ISAS x TRACE_ROWS x TRACE_STREAMS, row-major). */
void qgemm_trace_read(long *out) { memcpy(out, trace_calls, sizeof trace_calls); }

/* The row chunks of a product over R rows taken `chunk` at a time, each read with `streams` weight streams. */
static void add_walk(long (*t)[TRACE_ISAS][TRACE_ROWS][TRACE_STREAMS], int product, int isa, long R, int chunk,
                     int streams) {
    for (long r0 = 0; r0 < R; r0 += chunk) t[product][isa][R - r0 < chunk ? R - r0 : chunk][streams]++;
}

static void trace_walk(int product, int isa, long R, int chunk, int streams) {
    if (trace_on) add_walk(trace_calls, product, isa, R, chunk, streams);
}

static int check(long R, long K, long G, long N, int variant, int threads) {
    if (R < 1 || K < 1 || N < 1 || G < 16 || G % 16 || K % G || threads < 1) return -1;
    if (variant < 0 || variant > 4 || !(qgemm_variants() & (1 << variant))) return -2;
    return 0;
}

/* y [R, N] = x [R, K] @ w^T with w in the q4 layout. Returns 0, -1 for bad sizes (K % 32 != 0, ...),
 * -2 for a variant this CPU cannot run. */
int q4_gemm(const float *x, long R, long K, const uint8_t *qs, const float *d, const float *m, float *y, long N,
            int variant, int threads) {
    int rc = check(R, K, QK, N, variant, threads);
    if (rc) return rc;
    variant = act_variant(variant);
    trace_walk(PRODUCT_Q4, variant, R, CHUNK[variant], 1);
    long nblocks = (N + OBLOCK - 1) / OBLOCK;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && nblocks > 1)
    for (long ob = 0; ob < nblocks; ob++) {
        long b = ob * OBLOCK, e = b + OBLOCK < N ? b + OBLOCK : N;
        for (long r0 = 0; r0 < R; r0 += CHUNK[variant]) {
            int rc_ = R - r0 < CHUNK[variant] ? (int)(R - r0) : CHUNK[variant];
            const float *xr = x + r0 * K;
            float *yr = y + r0 * N;
            if (variant == 0) {
                q4_tile_c((int)(e - b), rc_, xr, K, qs, d, m, yr, N, b);
                continue;
            }
            int nc = WIDE_NC[rc_];
            long n = b;
            for (; n + nc <= e; n += nc) Q4_WIDE[variant][rc_](xr, K, qs, d, m, yr, N, n);
            for (; n < e; n++) Q4_ONE[variant][rc_](xr, K, qs, d, m, yr, N, n);
        }
    }
    return 0;
}

/* y [R, N] = x [R, K] @ w^T with w in the q8 layout (group G). Returns 0, -1 for bad sizes, -2 for a
 * variant this CPU cannot run. */
int q8_gemm(const float *x, long R, long K, long G, const int8_t *qs, const float *d, float *y, long N,
            int variant, int threads) {
    int rc = check(R, K, G, N, variant, threads);
    if (rc) return rc;
    variant = act_variant(variant);
    trace_walk(PRODUCT_Q8, variant, R, CHUNK[variant], 1);
    long nblocks = (N + OBLOCK - 1) / OBLOCK;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && nblocks > 1)
    for (long ob = 0; ob < nblocks; ob++) {
        long b = ob * OBLOCK, e = b + OBLOCK < N ? b + OBLOCK : N;
        for (long r0 = 0; r0 < R; r0 += CHUNK[variant]) {
            int rc_ = R - r0 < CHUNK[variant] ? (int)(R - r0) : CHUNK[variant];
            const float *xr = x + r0 * K;
            float *yr = y + r0 * N;
            if (variant == 0) {
                q8_tile_c((int)(e - b), rc_, xr, K, G, qs, d, yr, N, b);
                continue;
            }
            int nc = WIDE_NC[rc_];
            long n = b;
            for (; n + nc <= e; n += nc) Q8_WIDE[variant][rc_](xr, K, G, qs, d, yr, N, n);
            for (; n < e; n++) Q8_ONE[variant][rc_](xr, K, G, qs, d, yr, N, n);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------- half weights
 * y [R, N] = x [R, K] @ w^T with w [N, K] kept as the checkpoint's 16-bit values: IEEE fp16 (bf = 0) or
 * bfloat16 (bf = 1). Every weight widens to fp32 exactly (bf16: the bits shifted up by 16; fp16: the
 * hardware conversion, F16C / AVX-512F, or h16_to_f32 in the portable variant), so a product is the
 * fp32 product of the dequantized weight; per output, lane l sums the elements k = l mod LANES in K
 * order and one fixed reduction ends it (LANES: 16 portable and AVX-512, 8 AVX2): row-invariant as the
 * q4 / q8 products are. K must be a multiple of 16. */
static float h16_to_f32(uint16_t h, int bf) {
    uint32_t bits;
    if (bf) {
        bits = (uint32_t)h << 16;
    } else {
        uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
        if (e == 0) { /* zero or subnormal: m * 2^-24, exact in fp32 */
            float f = (float)m * 5.9604644775390625e-8f;
            return sign ? -f : f;
        }
        bits = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static void h16_tile_c(int NC, int RC, const float *x, long K, const uint16_t *w, int bf, float *y, long N,
                       long n0) {
    for (int c = 0; c < NC; c++) {
        const uint16_t *wn = w + (n0 + c) * K;
        for (int r = 0; r < RC; r++) {
            float acc[16];
            memset(acc, 0, sizeof acc);
            const float *xr = x + r * K;
            for (long k = 0; k < K; k++) acc[k & 15] += xr[k] * h16_to_f32(wn[k], bf);
            float s = 0.f;
            for (int j = 0; j < 16; j++) s += acc[j];
            y[r * N + n0 + c] = s;
        }
    }
}

#define H16_AVX2(NC, RC, BF, NAME)                                                                               \
    __attribute__((target("avx2,fma,f16c"))) static void NAME##_avx2_##NC##x##RC(                               \
        const float *x, long K, const uint16_t *w, float *y, long N, long n0) {                                 \
        __m256 acc[NC][RC];                                                                                     \
        for (int c = 0; c < NC; c++)                                                                            \
            for (int r = 0; r < RC; r++) acc[c][r] = _mm256_setzero_ps();                                       \
        for (long k = 0; k < K; k += 8) {                                                                       \
            if ((k & 31) == 0)                                                                                  \
                for (int c = 0; c < NC; c++)                                                                    \
                    _mm_prefetch((const char *)(w + (n0 + c + PF_TILES * NC) * K + k), _MM_HINT_T0);            \
            for (int c = 0; c < NC; c++) {                                                                      \
                __m128i raw = _mm_loadu_si128((const __m128i *)(w + (n0 + c) * K + k));                         \
                __m256 wv = (BF) ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16))       \
                                 : _mm256_cvtph_ps(raw);                                                        \
                for (int r = 0; r < RC; r++)                                                                    \
                    acc[c][r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * K + k), wv, acc[c][r]);                 \
            }                                                                                                   \
        }                                                                                                       \
        for (int c = 0; c < NC; c++)                                                                            \
            for (int r = 0; r < RC; r++) y[r * N + n0 + c] = hsum8(acc[c][r]);                                  \
    }

#define H16_AVX512(NC, RC, BF, NAME)                                                                             \
    __attribute__((target("avx512f,fma"))) static void NAME##_avx512_##NC##x##RC(                              \
        const float *x, long K, const uint16_t *w, float *y, long N, long n0) {                                 \
        __m512 acc[NC][RC];                                                                                     \
        for (int c = 0; c < NC; c++)                                                                            \
            for (int r = 0; r < RC; r++) acc[c][r] = _mm512_setzero_ps();                                       \
        for (long k = 0; k < K; k += 16) {                                                                      \
            if ((k & 31) == 0)                                                                                  \
                for (int c = 0; c < NC; c++)                                                                    \
                    _mm_prefetch((const char *)(w + (n0 + c + PF_TILES * NC) * K + k), _MM_HINT_T0);            \
            for (int c = 0; c < NC; c++) {                                                                      \
                __m256i raw = _mm256_loadu_si256((const __m256i *)(w + (n0 + c) * K + k));                      \
                __m512 wv = (BF) ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16))       \
                                 : _mm512_cvtph_ps(raw);                                                        \
                for (int r = 0; r < RC; r++)                                                                    \
                    acc[c][r] = _mm512_fmadd_ps(_mm512_loadu_ps(x + r * K + k), wv, acc[c][r]);                 \
            }                                                                                                   \
        }                                                                                                       \
        for (int c = 0; c < NC; c++)                                                                            \
            for (int r = 0; r < RC; r++) y[r * N + n0 + c] = _mm512_reduce_add_ps(acc[c][r]);                   \
    }

#define H16_ALL(BF, NAME)                                                                                        \
    H16_AVX2(4, 1, BF, NAME) H16_AVX2(4, 2, BF, NAME) H16_AVX2(2, 3, BF, NAME) H16_AVX2(2, 4, BF, NAME)          \
    H16_AVX2(1, 1, BF, NAME) H16_AVX2(1, 2, BF, NAME) H16_AVX2(1, 3, BF, NAME) H16_AVX2(1, 4, BF, NAME)          \
    H16_AVX512(4, 1, BF, NAME) H16_AVX512(4, 2, BF, NAME) H16_AVX512(2, 3, BF, NAME) H16_AVX512(2, 4, BF, NAME)  \
    H16_AVX512(1, 1, BF, NAME) H16_AVX512(1, 2, BF, NAME) H16_AVX512(1, 3, BF, NAME) H16_AVX512(1, 4, BF, NAME)  \
    H16_AVX512(1, 5, BF, NAME) H16_AVX512(1, 6, BF, NAME) H16_AVX512(1, 7, BF, NAME) H16_AVX512(1, 8, BF, NAME)
H16_ALL(0, f16)
H16_ALL(1, bf16)

typedef void (*h16_fn)(const float *, long, const uint16_t *, float *, long, long);
#define H16_TABLE(NAME, A, B)                                                                                    \
    {{0}, {0, NAME##_avx2_##A##x1, NAME##_avx2_##A##x2, NAME##_avx2_##B##x3, NAME##_avx2_##B##x4},             \
     {0, NAME##_avx512_##A##x1, NAME##_avx512_##A##x2, NAME##_avx512_##B##x3, NAME##_avx512_##B##x4,           \
      NAME##_avx512_1x5, NAME##_avx512_1x6, NAME##_avx512_1x7, NAME##_avx512_1x8}}
/* [bf][variant][rows in the chunk] */
static const h16_fn H16_WIDE[2][3][9] = {H16_TABLE(f16, 4, 2), H16_TABLE(bf16, 4, 2)};
static const h16_fn H16_ONE[2][3][9] = {H16_TABLE(f16, 1, 1), H16_TABLE(bf16, 1, 1)};

/* y [R, N] = x [R, K] @ w^T with w [N, K] fp16 (bf = 0) or bf16 (bf = 1). Returns 0, -1 for bad sizes
 * (K % 16 != 0, ...), -2 for a variant this CPU cannot run. */
int h16_gemm(const float *x, long R, long K, const uint16_t *w, int bf, float *y, long N, int variant, int threads) {
    int rc = check(R, K, 16, N, variant, threads);
    if (rc) return rc;
    variant = act_variant(variant);
    trace_walk(PRODUCT_H16, variant, R, CHUNK[variant], 1);
    bf = bf ? 1 : 0;
    long nblocks = (N + OBLOCK - 1) / OBLOCK;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && nblocks > 1)
    for (long ob = 0; ob < nblocks; ob++) {
        long b = ob * OBLOCK, e = b + OBLOCK < N ? b + OBLOCK : N;
        for (long r0 = 0; r0 < R; r0 += CHUNK[variant]) {
            int rc_ = R - r0 < CHUNK[variant] ? (int)(R - r0) : CHUNK[variant];
            const float *xr = x + r0 * K;
            float *yr = y + r0 * N;
            if (variant == 0) {
                h16_tile_c((int)(e - b), rc_, xr, K, w, bf, yr, N, b);
                continue;
            }
            int nc = WIDE_NC[rc_];
            long n = b;
            for (; n + nc <= e; n += nc) H16_WIDE[bf][variant][rc_](xr, K, w, yr, N, n);
            for (; n < e; n++) H16_ONE[bf][variant][rc_](xr, K, w, yr, N, n);
        }
    }
    return 0;
}

/* y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w   (RMSNorm, Zhang & Sennrich 2019) for x [R, H] fp32.
 * The sum of squares runs in 8 interleaved fp32 partial sums (then summed in a fixed order): the same
 * operations for every row and R. */
__attribute__((target_clones("avx512f", "avx2", "default")))
void rms_norm_f32(const float *x, long R, long H, const float *w, float eps, float *y) {
    for (long r = 0; r < R; r++) {
        const float *xr = x + r * H;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        long k = 0;
        for (; k + 8 <= H; k += 8)
            for (int j = 0; j < 8; j++) acc[j] += xr[k + j] * xr[k + j];
        float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        for (; k < H; k++) s += xr[k] * xr[k];
        float inv = 1.0f / __builtin_sqrtf(s / (float)H + eps);
        float *yr = y + r * H;
        for (long i = 0; i < H; i++) yr[i] = (xr[i] * inv) * w[i];
    }
}


/* Thread-local work buffers, grown as needed and kept for the thread's life: a fresh allocation per call
 * would map and fault its pages in anew every time. grow() returns NULL when out of memory. */
static void *grow(void **buf, long *cap, long bytes) {
    if (bytes > *cap) {
        void *nb = realloc(*buf, bytes);
        if (!nb) return 0;
        *buf = nb;
        *cap = bytes;
    }
    return *buf;
}

/* this thread's index in the current OpenMP team (0 outside one, or without OpenMP) */
static inline int thread_index(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

static __thread void *xq_buf = 0, *xs_buf = 0, *scratch_buf = 0;
static __thread long xq_cap = 0, xs_cap = 0, scratch_cap = 0;

static int8_t *xq_buffer(long n) { return (int8_t *)grow(&xq_buf, &xq_cap, n); }
static float *xs_buffer(long n) { return (float *)grow(&xs_buf, &xs_cap, n * (long)sizeof(float)); }
static float *scratch(long n) { return (float *)grow(&scratch_buf, &scratch_cap, n * (long)sizeof(float)); }

/* ------------------------------------------------------------------------------------- packed int8 (q4, Q8_0)
 * Variant 3 multiplies q4 weights the way llama.cpp does on x86 (ggml-quants.c, block_q8_1 activations;
 * ggml-cpu/amx/mmq.cpp's VNNI layout): each activation row is quantized per 32-block to int8 (xq =
 * round(x / dx), dx = max|x| / 127, sx = dx * sum(xq)), and a block contributes
 * d * dx * sum(code * xq) + m * sx, the integer dot by vpdpbusd (codes unsigned, xq signed).
 * Weights are repacked 16 output rows at a time so one instruction multiplies 4 inputs x 16 outputs, one
 * record per (group of 16 outputs, block), records in (group, block) order (one stream):
 *   256 bytes of codes: for quad q of the block, byte 64 q + 4 c + t holds output c's code of input
 *     4q + t in its low nibble and of input 16 + 4q + t in its high nibble;
 *   then d of the 16 outputs, then m: fp16 (f16 = 1, used when every scale is exactly an fp16, as
 *   Q4_0 / Q4_1's are) or fp32. N is rounded up to 16 (padding outputs have zero scales).
 * Q8_0 weights have their own records (below); every other operation runs the AVX-512F code. Variant 4
 * runs the same records on AVX2 tiles (Q4A, Q8A). Row-invariant like the others: a row's quantization
 * and each output's accumulation order do not depend on the other rows. */

#ifndef PFV
#define PFV 4 /* records (16 outputs x one block) ahead to prefetch */
#endif

static long q4v_record(int f16) { return 256 + (f16 ? 64 : 128); }

static void put_scale(uint8_t *rec, int f16, int which, int c, float v) {
    if (f16) {
        _Float16 h = (_Float16)v;
        memcpy(rec + 256 + which * 32 + c * 2, &h, 2);
    } else {
        memcpy(rec + 256 + which * 64 + c * 4, &v, 4);
    }
}

static float get_scale(const uint8_t *rec, int f16, int which, int c) {
    if (f16) {
        _Float16 h;
        memcpy(&h, rec + 256 + which * 32 + c * 2, 2);
        return (float)h;
    }
    float v;
    memcpy(&v, rec + 256 + which * 64 + c * 4, 4);
    return v;
}

/* bytes of the packed layout of an [N, K] q4 weight */
long q4v_bytes(long N, long K, int f16) { return (N + 15) / 16 * (K / QK) * q4v_record(f16); }

void q4v_pack(const uint8_t *qs, const float *d, const float *m, long N, long K, int f16, uint8_t *out) {
    long nb = K / QK, rec = q4v_record(f16);
    memset(out, 0, q4v_bytes(N, K, f16));
    for (long n = 0; n < N; n++) {
        long g = n / 16, c = n % 16;
        for (long b = 0; b < nb; b++) {
            const uint8_t *q = qs + (n * nb + b) * 16; /* byte j: code j (low), code j + 16 (high) */
            uint8_t *o = out + (g * nb + b) * rec;
            for (int qd = 0; qd < 4; qd++)
                for (int t = 0; t < 4; t++) o[qd * 64 + c * 4 + t] = q[4 * qd + t];
            put_scale(o, f16, 0, (int)c, d[n * nb + b]);
            put_scale(o, f16, 1, (int)c, m[n * nb + b]);
        }
    }
}

void q4v_unpack(const uint8_t *in, long N, long K, int f16, uint8_t *qs, float *d, float *m) {
    long nb = K / QK, rec = q4v_record(f16);
    for (long n = 0; n < N; n++) {
        long g = n / 16, c = n % 16;
        for (long b = 0; b < nb; b++) {
            const uint8_t *o = in + (g * nb + b) * rec;
            for (int qd = 0; qd < 4; qd++)
                for (int t = 0; t < 4; t++) qs[(n * nb + b) * 16 + 4 * qd + t] = o[qd * 64 + c * 4 + t];
            d[n * nb + b] = get_scale(o, f16, 0, (int)c);
            m[n * nb + b] = get_scale(o, f16, 1, (int)c);
        }
    }
}

/* row x [K] -> xq int8 [K], dx, sx fp32 [K/32] (per 32-block scale and dx * sum(xq)). Rounding to nearest
 * even by adding and subtracting 1.5 * 2^23 (exact for |v| <= 127, the same result as nearbyintf in the
 * default rounding mode), so every clone below computes the same bits. */
__attribute__((target_clones("avx512f", "avx2", "default")))
static void quant_row(const float *x, long K, int8_t *xq, float *dx, float *sx) {
    for (long b = 0; b < K / QK; b++) {
        const float *xb = x + b * QK;
        float amax = 0.f;
        for (int j = 0; j < QK; j++) {
            float a = xb[j] < 0.f ? -xb[j] : xb[j];
            amax = a > amax ? a : amax;
        }
        float dd = amax / 127.f, inv = dd > 0.f ? 1.f / dd : 0.f;
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            const float big = 12582912.f; /* not folded: no -ffast-math; not fused: -ffp-contract=off */
            float v = (xb[j] * inv + big) - big;
            int iv = (int)v;
            xq[b * QK + j] = (int8_t)iv;
            sum += iv;
        }
        dx[b] = dd;
        sx[b] = dd * (float)sum;
    }
}

/* A tile computes RC activation rows x 16 outputs of each of S output groups gs[0..S). The S groups are
 * far apart in the weight (the caller splits the groups into S ranges and walks them side by side), so
 * S sequential weight streams are read at once: one core's hardware prefetchers fetch ahead on each
 * stream, which draws more memory bandwidth than one stream does (a one-row product is bound by the
 * rate the weights arrive at). Each output's arithmetic is the same whatever S and RC. */
/* y[n0 .. n0 + 16) = v, the lanes at or past N left out */
__attribute__((target("avx512f"))) static inline void store16_512(float *y, long N, long n0, __m512 v) {
    __mmask16 keep = N - n0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (N - n0)) - 1);
    _mm512_mask_storeu_ps(y + n0, keep, v);
}

/* The tiles of the packed walks as (rows, streams) lists, for a macro X: one-stream tiles for 1..8 rows,
 * and the multi-stream tiles, the one place their stream counts are written (the tiles, the tables of
 * tiles and the stream tables below all come from these lists). More streams where a tile is bound by
 * memory (few rows), one where its integer work is (many rows); AVX2 has 16 vector registers, so its
 * tiles (two accumulators per row and group) take fewer. */
#define ONE_STREAM_TILES(X, F16)                                                                                \
    X(1, 1, F16) X(2, 1, F16) X(3, 1, F16) X(4, 1, F16) X(5, 1, F16) X(6, 1, F16) X(7, 1, F16) X(8, 1, F16)
#define VNNI_MULTI(X, F16) X(1, 4, F16) X(2, 4, F16) X(3, 4, F16) X(4, 4, F16) X(5, 2, F16) X(6, 2, F16)
#define AVX2_MULTI(X, F16) X(1, 4, F16) X(2, 2, F16)
#define MAX_STREAMS 4
#define STREAMS_AT(RC, S, F16) [RC] = S,

#define Q4V(RC, S, F16)                                                                                         \
    __attribute__((target("avx512f,avx512vnni"))) static void q4v_tile_##RC##_##S##_##F16(                     \
        const int8_t *xq, const float *dx, const float *sx, long K, const uint8_t *pk, float *y, long N,       \
        const long *gs) {                                                                                       \
        long nb = K / QK, rec = 256 + (F16 ? 64 : 128);                                                         \
        __m512 acc[S][RC];                                                                                      \
        for (int s = 0; s < S; s++)                                                                             \
            for (int r = 0; r < RC; r++) acc[s][r] = _mm512_setzero_ps();                                       \
        const __m512i lo4 = _mm512_set1_epi8(15);                                                               \
        for (long b = 0; b < nb; b++) {                                                                         \
            for (int s = 0; s < S; s++) {                                                                       \
                const uint8_t *blk = pk + (gs[s] * nb + b) * rec;                                               \
                if (PFV)                                                                                        \
                    for (int pf = 0; pf < rec; pf += 64) _mm_prefetch((const char *)(blk + PFV * rec + pf), _MM_HINT_T0); \
                /* two independent integer chains per row (low / high nibbles), summed at the block's end: \
                 * integer sums are exact, so the split changes no bit, only the dependency chain length */ \
                __m512i ai[RC], bi[RC];                                                                         \
                for (int r = 0; r < RC; r++) ai[r] = bi[r] = _mm512_setzero_si512();                            \
                for (int qd = 0; qd < 4; qd++) {                                                                \
                    __m512i raw = _mm512_loadu_si512((const void *)(blk + qd * 64));                            \
                    __m512i lo = _mm512_and_si512(raw, lo4), hi = _mm512_and_si512(_mm512_srli_epi32(raw, 4), lo4); \
                    for (int r = 0; r < RC; r++) {                                                              \
                        const int8_t *xr = xq + r * K + b * QK;                                                 \
                        int32_t a0, a1;                                                                         \
                        memcpy(&a0, xr + 4 * qd, 4);                                                            \
                        memcpy(&a1, xr + 16 + 4 * qd, 4);                                                       \
                        ai[r] = _mm512_dpbusd_epi32(ai[r], lo, _mm512_set1_epi32(a0));                          \
                        bi[r] = _mm512_dpbusd_epi32(bi[r], hi, _mm512_set1_epi32(a1));                          \
                    }                                                                                           \
                }                                                                                               \
                for (int r = 0; r < RC; r++) ai[r] = _mm512_add_epi32(ai[r], bi[r]);                            \
                __m512 dv, mv;                                                                                  \
                if (F16) {                                                                                      \
                    dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 256)));                     \
                    mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 288)));                     \
                } else {                                                                                        \
                    dv = _mm512_loadu_ps((const float *)(blk + 256));                                           \
                    mv = _mm512_loadu_ps((const float *)(blk + 320));                                           \
                }                                                                                               \
                for (int r = 0; r < RC; r++) {                                                                  \
                    acc[s][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[r]),                                      \
                                                _mm512_mul_ps(dv, _mm512_set1_ps(dx[r * nb + b])), acc[s][r]);  \
                    acc[s][r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(sx[r * nb + b]), acc[s][r]);                 \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
        for (int s = 0; s < S; s++)                                                                             \
            for (int r = 0; r < RC; r++) store16_512(y + r * N, N, gs[s] * 16, acc[s][r]);                      \
    }

ONE_STREAM_TILES(Q4V, 0) ONE_STREAM_TILES(Q4V, 1) VNNI_MULTI(Q4V, 0) VNNI_MULTI(Q4V, 1)

/* weight streams read side by side by rows in the chunk (0 and 7..8 rows: one) */
static const int VSTREAMS[9] = {[0 ... 8] = 1, VNNI_MULTI(STREAMS_AT, 0)};
static const int ASTREAMS[9] = {[0 ... 8] = 1, AVX2_MULTI(STREAMS_AT, 0)};
static int max_streams = MAX_STREAMS; /* a cap on the stream tables (1: one stream), for measurements */

/* Cap the weight streams of the packed products, VNNI and AVX2 alike (n >= 1; a row count whose tile reads
 * more streams than n reads one). Returns 0, -1 for n < 1. Results do not depend on it. */
int qgemm_set_streams(int n) {
    if (n < 1) return -1;
    max_streams = n;
    return 0;
}

typedef void (*q4v_fn)(const int8_t *, const float *, const float *, long, const uint8_t *, float *, long, const long *);
/* [f16][rows in the chunk]: one group per call, and VSTREAMS[rows] groups per call */
#define Q4V_AT(RC, S, F16) [RC] = q4v_tile_##RC##_##S##_##F16,
static const q4v_fn Q4V_TILE[2][9] = {{ONE_STREAM_TILES(Q4V_AT, 0)}, {ONE_STREAM_TILES(Q4V_AT, 1)}};
static const q4v_fn Q4V_MULTI[2][9] = {{VNNI_MULTI(Q4V_AT, 0)}, {VNNI_MULTI(Q4V_AT, 1)}};

/* The weight streams a packed walk over R rows reads side by side (its multi-stream tiles' S; 1 past 8 rows) */
static int walk_streams(const int *streams, long R) { return R <= 8 && streams[R] <= max_streams ? streams[R] : 1; }

/* The groups [0, groups) of a product over R rows (R <= 8 rows in one chunk; more: chunks of 8, one
 * stream). The groups are split into one contiguous part per thread, and each part into S = STREAMS[R]
 * ranges of near-equal length walked side by side: step i computes group i of every range, with one
 * MULTI tile while every range has one left, else one ONE call per range that has. ONE(rc, gs) and
 * MULTI(rc, gs) compute rows r0 .. r0 + rc - 1 (set by the walk) of the group gs[0] and of the S groups
 * gs[0..S). The OpenMP pragma reads the caller's variable `threads`. Each output's arithmetic is its
 * tile's whatever the split, so neither the threads nor S change a bit. Measured on one core of a Xeon
 * (Sapphire Rapids class, AVX-512 VNNI): four streams draw weights about half as fast again as one
 * (tools/bench_matmul.py --quantized, its 1stream column). */
#define WALK_GROUPS(groups, R, STREAMS, ONE, MULTI)                                                            \
    do {                                                                                                        \
        int S_ = walk_streams(STREAMS, R);                                                                      \
        long parts_ = threads < (groups) ? threads : (groups);                                                  \
        _Pragma("omp parallel for num_threads(threads) schedule(static) if (parts_ > 1)")                     \
        for (long p_ = 0; p_ < parts_; p_++) {                                                                  \
            long g0_ = (groups) * p_ / parts_, len_ = (groups) * (p_ + 1) / parts_ - g0_;                       \
            long start_[MAX_STREAMS + 1];                                                                       \
            for (int s_ = 0; s_ <= S_; s_++) start_[s_] = g0_ + len_ * s_ / S_;                                 \
            for (long i_ = 0; i_ < (len_ + S_ - 1) / S_; i_++) {                                                \
                long gs_[MAX_STREAMS];                                                                          \
                int n_ = 0;                                                                                     \
                for (int s_ = 0; s_ < S_; s_++)                                                                 \
                    if (start_[s_] + i_ < start_[s_ + 1]) gs_[n_++] = start_[s_] + i_;                          \
                for (long r0 = 0; r0 < (R); r0 += 8) {                                                          \
                    int rc = (R) - r0 < 8 ? (int)((R) - r0) : 8;                                                \
                    if (S_ > 1 && n_ == S_) {                                                                   \
                        MULTI(rc, gs_);                                                                         \
                    } else {                                                                                    \
                        for (int k_ = 0; k_ < n_; k_++) ONE(rc, gs_ + k_);                                      \
                    }                                                                                           \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
    } while (0)


/* The same products on AVX2 (variant 4, avx2int8: AMD and Intel parts without AVX-512 VNNI), as
 * llama.cpp's AVX2 q4 x q8 dot products do: vpmaddubsw (unsigned code x signed int8 activation, pairs
 * summed to int16: at most 2 * 15 * 127, no saturation) then vpmaddwd by ones (int16 pairs to int32) give
 * each 32-bit lane the sum of its four products, the integer vpdpbusd computes. The 16 outputs of a
 * record run as two 8-lane halves; every float operation is the VNNI tile's, lane for lane, so both
 * variants give the same bits. */
#define Q4A(RC, S, F16)                                                                                         \
    __attribute__((target("avx2,fma,f16c"))) static void q4a_tile_##RC##_##S##_##F16(                          \
        const int8_t *xq, const float *dx, const float *sx, long K, const uint8_t *pk, float *y, long N,       \
        const long *gs) {                                                                                       \
        long nb = K / QK, rec = 256 + (F16 ? 64 : 128);                                                         \
        __m256 acc[S][RC][2];                                                                                   \
        for (int s = 0; s < S; s++)                                                                             \
            for (int r = 0; r < RC; r++) acc[s][r][0] = acc[s][r][1] = _mm256_setzero_ps();                     \
        const __m256i lo4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);                                  \
        for (long b = 0; b < nb; b++) {                                                                         \
            for (int s = 0; s < S; s++) {                                                                       \
                const uint8_t *blk = pk + (gs[s] * nb + b) * rec;                                               \
                if (PFV)                                                                                        \
                    for (int pf = 0; pf < rec; pf += 64) _mm_prefetch((const char *)(blk + PFV * rec + pf), _MM_HINT_T0); \
                __m256i ai[RC][2];                                                                              \
                for (int r = 0; r < RC; r++) ai[r][0] = ai[r][1] = _mm256_setzero_si256();                      \
                for (int qd = 0; qd < 4; qd++)                                                                  \
                    for (int h = 0; h < 2; h++) {                                                               \
                        __m256i raw = _mm256_loadu_si256((const __m256i *)(blk + qd * 64 + h * 32));            \
                        __m256i lo = _mm256_and_si256(raw, lo4);                                                \
                        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), lo4);                          \
                        for (int r = 0; r < RC; r++) {                                                          \
                            const int8_t *xr = xq + r * K + b * QK;                                             \
                            int32_t a0, a1;                                                                     \
                            memcpy(&a0, xr + 4 * qd, 4);                                                        \
                            memcpy(&a1, xr + 16 + 4 * qd, 4);                                                   \
                            __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(a0)), ones); \
                            __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, _mm256_set1_epi32(a1)), ones); \
                            ai[r][h] = _mm256_add_epi32(ai[r][h], _mm256_add_epi32(p0, p1));                    \
                        }                                                                                       \
                    }                                                                                           \
                for (int h = 0; h < 2; h++) {                                                                   \
                    __m256 dv, mv;                                                                              \
                    if (F16) {                                                                                  \
                        dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 256 + h * 16)));           \
                        mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 288 + h * 16)));           \
                    } else {                                                                                    \
                        dv = _mm256_loadu_ps((const float *)(blk + 256 + h * 32));                              \
                        mv = _mm256_loadu_ps((const float *)(blk + 320 + h * 32));                              \
                    }                                                                                           \
                    for (int r = 0; r < RC; r++) {                                                              \
                        acc[s][r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ai[r][h]),                            \
                                                       _mm256_mul_ps(dv, _mm256_set1_ps(dx[r * nb + b])), acc[s][r][h]); \
                        acc[s][r][h] = _mm256_fmadd_ps(mv, _mm256_set1_ps(sx[r * nb + b]), acc[s][r][h]);       \
                    }                                                                                           \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
        for (int s = 0; s < S; s++)                                                                             \
            for (int r = 0; r < RC; r++) store16_avx2(y + r * N, N, gs[s] * 16, acc[s][r]);                     \
    }

/* y[n0 .. n0 + 16) = the two 8-lane halves v, the lanes at or past N left out */
__attribute__((target("avx2"))) static inline void store16_avx2(float *y, long N, long n0, const __m256 *v) {
    for (int h = 0; h < 2; h++) {
        long at = n0 + 8 * h, left = N - at;
        if (left >= 8) {
            _mm256_storeu_ps(y + at, v[h]);
        } else if (left > 0) {
            __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            _mm256_maskstore_ps(y + at, _mm256_cmpgt_epi32(_mm256_set1_epi32((int)left), idx), v[h]);
        }
    }
}

ONE_STREAM_TILES(Q4A, 0) ONE_STREAM_TILES(Q4A, 1) AVX2_MULTI(Q4A, 0) AVX2_MULTI(Q4A, 1)

#define Q4A_AT(RC, S, F16) [RC] = q4a_tile_##RC##_##S##_##F16,
static const q4v_fn Q4A_TILE[2][9] = {{ONE_STREAM_TILES(Q4A_AT, 0)}, {ONE_STREAM_TILES(Q4A_AT, 1)}};
static const q4v_fn Q4A_MULTI[2][9] = {{AVX2_MULTI(Q4A_AT, 0)}, {AVX2_MULTI(Q4A_AT, 1)}};

/* The packed products' instruction set for a qgemm variant: 3 (AVX-512 VNNI) or 4 (AVX2 int8); any other
 * variant (the fp32-activation ones) takes the best one this CPU runs. -2 when it runs neither. */
static int packed_isa(int variant) {
    int have = qgemm_variants();
    if ((variant == 3 && (have & 8)) || (variant == 4 && (have & 16))) return variant;
    if (variant == 3 || variant == 4) return -2;
    return (have & 8) ? 3 : (have & 16) ? 4 : -2;
}

/* y [R, N] = x [R, K] @ w^T with w in the packed layout, on the VNNI tiles (variant 3) or the AVX2 int8 ones
 * (variant 4; other variants: see packed_isa). Returns 0, -1 for bad sizes, -2 when the CPU runs neither,
 * -3 when out of memory. */
int q4v_gemm(const float *x, long R, long K, const uint8_t *pk, int f16, float *y, long N, int variant,
             int threads) {
    if (R < 1 || K < 1 || N < 1 || K % QK || threads < 1) return -1;
    int isa = packed_isa(variant);
    if (isa < 0) return isa;
    long nb = K / QK, groups = (N + 15) / 16;
    int8_t *xq = xq_buffer(R * K);
    float *xs = xs_buffer(2 * R * nb);
    if (!xq || !xs) return -3;
    float *dx = xs, *sx = xs + R * nb;
    for (long r = 0; r < R; r++) quant_row(x + r * K, K, xq + r * K, dx + r * nb, sx + r * nb);
    int v = isa == 3;
    const q4v_fn *one = v ? Q4V_TILE[f16 ? 1 : 0] : Q4A_TILE[f16 ? 1 : 0];
    const q4v_fn *multi = v ? Q4V_MULTI[f16 ? 1 : 0] : Q4A_MULTI[f16 ? 1 : 0];
    const int *streams = v ? VSTREAMS : ASTREAMS;
#define Q4V_ONE(rc, gs) one[rc](xq + r0 * K, dx + r0 * nb, sx + r0 * nb, K, pk, y + r0 * N, N, gs)
#define Q4V_MANY(rc, gs) multi[rc](xq + r0 * K, dx + r0 * nb, sx + r0 * nb, K, pk, y + r0 * N, N, gs)
    trace_walk(PRODUCT_Q4V, isa, R, 8, walk_streams(streams, R));
    WALK_GROUPS(groups, R, streams, Q4V_ONE, Q4V_MANY);
#undef Q4V_ONE
#undef Q4V_MANY
    return 0;
}

/* q8 (group 32: Q8_0) weights for variants 3 and 4, in the same 16-output records: 8 quads x 64 bytes of codes
 * stored as code + 128 (vpdpbusd multiplies unsigned by signed bytes; sum((q + 128) xq) - 128 sum(xq) =
 * sum(q xq) exactly in int32), then the 16 d's (fp16 when exact, as Q8_0's are, else fp32). A block
 * contributes d * dx * (dot - 128 sum(xq)). */
static long q8v_record(int f16) { return 512 + (f16 ? 32 : 64); }

long q8v_bytes(long N, long K, int f16) { return (N + 15) / 16 * (K / QK) * q8v_record(f16); }

void q8v_pack(const int8_t *qs, const float *d, long N, long K, int f16, uint8_t *out) {
    long nb = K / QK, rec = q8v_record(f16);
    memset(out, 0, q8v_bytes(N, K, f16));
    for (long g = 0; g < (N + 15) / 16; g++) /* padding outputs: code 0 (byte 128), d 0 */
        for (long b = 0; b < nb; b++) memset(out + (g * nb + b) * rec, 128, 512);
    for (long n = 0; n < N; n++) {
        long g = n / 16, c = n % 16;
        for (long b = 0; b < nb; b++) {
            const int8_t *q = qs + (n * nb + b) * QK;
            uint8_t *o = out + (g * nb + b) * rec;
            for (int qd = 0; qd < 8; qd++)
                for (int t = 0; t < 4; t++) o[qd * 64 + c * 4 + t] = (uint8_t)(q[4 * qd + t] + 128);
            float v = d[n * nb + b];
            if (f16) {
                _Float16 h = (_Float16)v;
                memcpy(o + 512 + c * 2, &h, 2);
            } else {
                memcpy(o + 512 + c * 4, &v, 4);
            }
        }
    }
}

/* rows ids[0..n) of a packed q8 weight dequantized to out [n, K] fp32 (d * code, exact): embedding lookups */
void q8v_rows(const uint8_t *pk, int f16, long N, long K, const long *ids, long n, float *out) {
    long nb = K / QK, rec = q8v_record(f16);
    for (long i = 0; i < n; i++) {
        long r = ids[i];
        if (r < 0 || r >= N) r = 0;
        long g = r / 16, c = r % 16;
        for (long b = 0; b < nb; b++) {
            const uint8_t *o = pk + (g * nb + b) * rec;
            float dv;
            if (f16) {
                _Float16 h;
                memcpy(&h, o + 512 + c * 2, 2);
                dv = (float)h;
            } else {
                memcpy(&dv, o + 512 + c * 4, 4);
            }
            for (int qd = 0; qd < 8; qd++)
                for (int t = 0; t < 4; t++) out[i * K + b * QK + 4 * qd + t] = dv * (float)((int)o[qd * 64 + c * 4 + t] - 128);
        }
    }
}

void q8v_unpack(const uint8_t *pk, int f16, long N, long K, int8_t *qs, float *d) {
    long nb = K / QK, rec = q8v_record(f16);
    for (long n = 0; n < N; n++) {
        long g = n / 16, c = n % 16;
        for (long b = 0; b < nb; b++) {
            const uint8_t *o = pk + (g * nb + b) * rec;
            for (int qd = 0; qd < 8; qd++)
                for (int t = 0; t < 4; t++) qs[(n * nb + b) * QK + 4 * qd + t] = (int8_t)((int)o[qd * 64 + c * 4 + t] - 128);
            if (f16) {
                _Float16 h;
                memcpy(&h, o + 512 + c * 2, 2);
                d[n * nb + b] = (float)h;
            } else {
                memcpy(d + n * nb + b, o + 512 + c * 4, 4);
            }
        }
    }
}

/* S output groups side by side, as the q4 tiles (see Q4V) */
#define Q8V(RC, S, F16)                                                                                         \
    __attribute__((target("avx512f,avx512vnni"))) static void q8v_tile_##RC##_##S##_##F16(                     \
        const int8_t *xq, const float *dx, const int32_t *xsum, long K, const uint8_t *pk, float *y, long N,    \
        const long *gs) {                                                                                       \
        long nb = K / QK, rec = 512 + (F16 ? 32 : 64);                                                          \
        __m512 acc[S][RC];                                                                                      \
        for (int s = 0; s < S; s++)                                                                             \
            for (int r = 0; r < RC; r++) acc[s][r] = _mm512_setzero_ps();                                       \
        for (long b = 0; b < nb; b++) {                                                                         \
            for (int s = 0; s < S; s++) {                                                                       \
                const uint8_t *blk = pk + (gs[s] * nb + b) * rec;                                               \
                if (PFV)                                                                                        \
                    for (int pf = 0; pf < rec; pf += 64) _mm_prefetch((const char *)(blk + PFV * rec + pf), _MM_HINT_T0); \
                __m512i ai[RC], bi[RC]; /* two exact integer chains per row (even / odd quads) */           \
                for (int r = 0; r < RC; r++) ai[r] = bi[r] = _mm512_setzero_si512();                            \
                for (int qd = 0; qd < 8; qd += 2) {                                                             \
                    __m512i raw0 = _mm512_loadu_si512((const void *)(blk + qd * 64));                           \
                    __m512i raw1 = _mm512_loadu_si512((const void *)(blk + qd * 64 + 64));                      \
                    for (int r = 0; r < RC; r++) {                                                              \
                        int32_t a0, a1;                                                                         \
                        memcpy(&a0, xq + r * K + b * QK + 4 * qd, 4);                                           \
                        memcpy(&a1, xq + r * K + b * QK + 4 * qd + 4, 4);                                       \
                        ai[r] = _mm512_dpbusd_epi32(ai[r], raw0, _mm512_set1_epi32(a0));                        \
                        bi[r] = _mm512_dpbusd_epi32(bi[r], raw1, _mm512_set1_epi32(a1));                        \
                    }                                                                                           \
                }                                                                                               \
                for (int r = 0; r < RC; r++) ai[r] = _mm512_add_epi32(ai[r], bi[r]);                            \
                __m512 dv = F16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 512)))             \
                                : _mm512_loadu_ps((const float *)(blk + 512));                                  \
                for (int r = 0; r < RC; r++) {                                                                  \
                    __m512i dot = _mm512_sub_epi32(ai[r], _mm512_set1_epi32(128 * xsum[r * nb + b]));           \
                    acc[s][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),                                        \
                                                _mm512_mul_ps(dv, _mm512_set1_ps(dx[r * nb + b])), acc[s][r]);  \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
        for (int s = 0; s < S; s++)                                                                             \
            for (int r = 0; r < RC; r++) store16_512(y + r * N, N, gs[s] * 16, acc[s][r]);                      \
    }

ONE_STREAM_TILES(Q8V, 0) ONE_STREAM_TILES(Q8V, 1) VNNI_MULTI(Q8V, 0) VNNI_MULTI(Q8V, 1)

typedef void (*q8v_fn)(const int8_t *, const float *, const int32_t *, long, const uint8_t *, float *, long, const long *);
#define Q8V_AT(RC, S, F16) [RC] = q8v_tile_##RC##_##S##_##F16,
static const q8v_fn Q8V_TILE[2][9] = {{ONE_STREAM_TILES(Q8V_AT, 0)}, {ONE_STREAM_TILES(Q8V_AT, 1)}};
static const q8v_fn Q8V_MULTI[2][9] = {{VNNI_MULTI(Q8V_AT, 0)}, {VNNI_MULTI(Q8V_AT, 1)}};


/* Q8 on AVX2 (variant 4): the stored byte is code + 128, so code = byte ^ 0x80 as int8; |code| (at most
 * 128, unsigned) times the activation with code's sign (vpsignb) is code * x, pairs at most 2 * 128 * 127:
 * no saturation. The lane sums are the integer dots the VNNI tile forms (sum (code + 128) x - 128 sum x),
 * and the float operations are its own, lane for lane: the same bits. */
#define Q8A(RC, S, F16)                                                                                         \
    __attribute__((target("avx2,fma,f16c"))) static void q8a_tile_##RC##_##S##_##F16(                          \
        const int8_t *xq, const float *dx, const int32_t *xsum, long K, const uint8_t *pk, float *y, long N,    \
        const long *gs) {                                                                                       \
        (void)xsum;                                                                                             \
        long nb = K / QK, rec = 512 + (F16 ? 32 : 64);                                                          \
        __m256 acc[S][RC][2];                                                                                   \
        for (int s = 0; s < S; s++)                                                                             \
            for (int r = 0; r < RC; r++) acc[s][r][0] = acc[s][r][1] = _mm256_setzero_ps();                     \
        const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);                         \
        for (long b = 0; b < nb; b++) {                                                                         \
            for (int s = 0; s < S; s++) {                                                                       \
                const uint8_t *blk = pk + (gs[s] * nb + b) * rec;                                               \
                if (PFV)                                                                                        \
                    for (int pf = 0; pf < rec; pf += 64) _mm_prefetch((const char *)(blk + PFV * rec + pf), _MM_HINT_T0); \
                __m256i ai[RC][2];                                                                              \
                for (int r = 0; r < RC; r++) ai[r][0] = ai[r][1] = _mm256_setzero_si256();                      \
                for (int qd = 0; qd < 8; qd++)                                                                  \
                    for (int h = 0; h < 2; h++) {                                                               \
                        __m256i c = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + qd * 64 + h * 32)), flip); \
                        __m256i ac = _mm256_abs_epi8(c);                                                        \
                        for (int r = 0; r < RC; r++) {                                                          \
                            int32_t a;                                                                          \
                            memcpy(&a, xq + r * K + b * QK + 4 * qd, 4);                                        \
                            __m256i sxv = _mm256_sign_epi8(_mm256_set1_epi32(a), c);                            \
                            ai[r][h] = _mm256_add_epi32(ai[r][h], _mm256_madd_epi16(_mm256_maddubs_epi16(ac, sxv), ones)); \
                        }                                                                                       \
                    }                                                                                           \
                for (int h = 0; h < 2; h++) {                                                                   \
                    __m256 dv = F16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 512 + h * 16)))   \
                                    : _mm256_loadu_ps((const float *)(blk + 512 + h * 32));                     \
                    for (int r = 0; r < RC; r++)                                                                \
                        acc[s][r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ai[r][h]),                            \
                                                       _mm256_mul_ps(dv, _mm256_set1_ps(dx[r * nb + b])), acc[s][r][h]); \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
        for (int s = 0; s < S; s++)                                                                             \
            for (int r = 0; r < RC; r++) store16_avx2(y + r * N, N, gs[s] * 16, acc[s][r]);                     \
    }

ONE_STREAM_TILES(Q8A, 0) ONE_STREAM_TILES(Q8A, 1) AVX2_MULTI(Q8A, 0) AVX2_MULTI(Q8A, 1)

#define Q8A_AT(RC, S, F16) [RC] = q8a_tile_##RC##_##S##_##F16,
static const q8v_fn Q8A_TILE[2][9] = {{ONE_STREAM_TILES(Q8A_AT, 0)}, {ONE_STREAM_TILES(Q8A_AT, 1)}};
static const q8v_fn Q8A_MULTI[2][9] = {{AVX2_MULTI(Q8A_AT, 0)}, {AVX2_MULTI(Q8A_AT, 1)}};

/* y [R, N] = x [R, K] @ w^T with w packed by q8v_pack, on the VNNI or the AVX2 int8 tiles as q4v_gemm.
 * Returns 0, -1 for bad sizes, -2 when the CPU runs neither, -3 when out of memory. */
int q8v_gemm(const float *x, long R, long K, const uint8_t *pk, int f16, float *y, long N, int variant,
             int threads) {
    if (R < 1 || K < 1 || N < 1 || K % QK || threads < 1) return -1;
    int isa = packed_isa(variant);
    if (isa < 0) return isa;
    long nb = K / QK, groups = (N + 15) / 16;
    int8_t *xq = xq_buffer(R * K);
    float *xs = xs_buffer(3 * R * nb);
    if (!xq || !xs) return -3;
    float *dx = xs, *sx = xs + R * nb;
    int32_t *xsum = (int32_t *)(xs + 2 * R * nb);
    for (long r = 0; r < R; r++) {
        quant_row(x + r * K, K, xq + r * K, dx + r * nb, sx + r * nb);
        for (long b = 0; b < nb; b++) {
            int32_t sum = 0;
            for (int j = 0; j < QK; j++) sum += xq[r * K + b * QK + j];
            xsum[r * nb + b] = sum;
        }
    }
    int v = isa == 3;
    const q8v_fn *one = v ? Q8V_TILE[f16 ? 1 : 0] : Q8A_TILE[f16 ? 1 : 0];
    const q8v_fn *multi = v ? Q8V_MULTI[f16 ? 1 : 0] : Q8A_MULTI[f16 ? 1 : 0];
    const int *streams = v ? VSTREAMS : ASTREAMS;
#define Q8V_ONE(rc, gs) one[rc](xq + r0 * K, dx + r0 * nb, xsum + r0 * nb, K, pk, y + r0 * N, N, gs)
#define Q8V_MANY(rc, gs) multi[rc](xq + r0 * K, dx + r0 * nb, xsum + r0 * nb, K, pk, y + r0 * N, N, gs)
    trace_walk(PRODUCT_Q8V, isa, R, 8, walk_streams(streams, R));
    WALK_GROUPS(groups, R, streams, Q8V_ONE, Q8V_MANY);
#undef Q8V_ONE
#undef Q8V_MANY
    return 0;
}

/* The counts one call of `product` (PRODUCT_Q4 .. PRODUCT_Q8V) over R rows under qgemm variant `variant` adds to
 * the trace, written to out (the shape qgemm_trace_read writes, zeroed first): the tiles the product's walk
 * picks for R, from the same tables the products read. Returns 0, -1 for a bad product or R, -2 for a variant
 * this CPU cannot run (packed products: when it runs neither packed variant). */
int qgemm_walk(int product, int variant, long R, long *out) {
    memset(out, 0, sizeof trace_calls);
    if (product < 0 || product >= PRODUCTS || R < 1) return -1;
    long (*t)[TRACE_ISAS][TRACE_ROWS][TRACE_STREAMS] = (long (*)[TRACE_ISAS][TRACE_ROWS][TRACE_STREAMS])out;
    if (product == PRODUCT_Q4V || product == PRODUCT_Q8V) {
        int isa = packed_isa(variant);
        if (isa < 0) return isa;
        add_walk(t, product, isa, R, 8, walk_streams(isa == 3 ? VSTREAMS : ASTREAMS, R));
        return 0;
    }
    if (variant < 0 || variant > 4 || !(qgemm_variants() & (1 << variant))) return -2;
    int v = act_variant(variant);
    add_walk(t, product, v, R, CHUNK[v], 1);
    return 0;
}

/* rows ids[0..n) of a packed q4 weight dequantized to out [n, K] fp32 (d * code + m): embedding lookups */
void q4v_rows(const uint8_t *pk, int f16, long N, long K, const long *ids, long n, float *out) {
    long nb = K / QK, rec = q4v_record(f16);
    for (long i = 0; i < n; i++) {
        long r = ids[i];
        if (r < 0 || r >= N) r = 0;
        long g = r / 16, c = r % 16;
        for (long b = 0; b < nb; b++) {
            const uint8_t *o = pk + (g * nb + b) * rec;
            float dv = get_scale(o, f16, 0, (int)c), mv = get_scale(o, f16, 1, (int)c);
            for (int qd = 0; qd < 4; qd++)
                for (int t = 0; t < 4; t++) {
                    uint8_t byte = o[qd * 64 + c * 4 + t];
                    out[i * K + b * QK + 4 * qd + t] = dv * (float)(byte & 15) + mv;
                    out[i * K + b * QK + 16 + 4 * qd + t] = dv * (float)(byte >> 4) + mv;
                }
        }
    }
}

/* ------------------------------------------------------------------------------------- fused layer parts
 * One call per decoder-layer half, so a decode step pays no interpreter work between the products. A
 * linear is (kind 4 = q4, 5 / 6 = q4 packed for VNNI with fp32 / fp16 scales, 8 = q8, 9 / 10 = q8 packed,
 * 16 / 17 = fp16 / bf16 values; group, codes, d, m) with N outputs over K inputs;
 * the products are q4_gemm / q4v_gemm / q8_gemm / q8v_gemm / h16_gemm, so these parts are row-invariant
 * as they are. */

static int qlin(int kind, long G, const void *qs, const float *d, const float *m, long N, long K, const float *x,
                long R, float *y, int variant, int threads) {
    if (kind == 16 || kind == 17) return h16_gemm(x, R, K, (const uint16_t *)qs, kind == 17, y, N, variant, threads);
    if (kind == 5 || kind == 6) return q4v_gemm(x, R, K, (const uint8_t *)qs, kind == 6, y, N, variant, threads);
    if (kind == 9 || kind == 10) return q8v_gemm(x, R, K, (const uint8_t *)qs, kind == 10, y, N, variant, threads);
    if (kind == 4) return q4_gemm(x, R, K, (const uint8_t *)qs, d, m, y, N, variant, threads);
    if (kind == 8) return q8_gemm(x, R, K, G, (const int8_t *)qs, d, y, N, variant, threads);
    return -1;
}

/* y [R, N] = rms_norm(x [R, H]; w, eps) @ W^T: the input norm and the fused q/k/v product. */
int norm_linear(const float *x, long R, long H, const float *nw, float eps, int kind, long G, const void *qs,
                const float *d, const float *m, long N, float *y, int variant, int threads) {
    float *xn = scratch(R * H);
    if (!xn) return -3;
    rms_norm_f32(x, R, H, nw, eps, xn);
    return qlin(kind, G, qs, d, m, N, H, xn, R, y, variant, threads);
}

static void silu_mul(const float *gu, long R, long I, float *act);

/* out [R, H] = h + W2 (silu(g) * u), (g | u) = W13 rms_norm(h), h = x + Wo a   (SwiGLU, Shazeer 2020):
 * the attention output projection, the residual, the FFN norm, the MLP and its residual.
 * a [R, Q]; x [R, H]; Wo [H, Q], W13 [2I, H] (gate rows then up rows), W2 [H, I]. */
int ffn_block(const float *a, const float *x, long R, long H, long Q, long I,
              int ko, long go, const void *qo, const float *dO, const float *mo,
              int k13, long g13, const void *q13, const float *d13, const float *m13,
              int k2, long g2, const void *q2, const float *d2, const float *m2,
              const float *nw, float eps, float *out, int variant, int threads) {
    float *buf = scratch(R * (2 * H + 3 * I));
    if (!buf) return -3;
    float *h = buf, *hn = buf + R * H, *gu = hn + R * H, *act = gu + 2 * R * I;
    int rc = qlin(ko, go, qo, dO, mo, H, Q, a, R, out, variant, threads); /* out = Wo a (scratch use) */
    if (rc) return rc;
    for (long i = 0; i < R * H; i++) h[i] = x[i] + out[i];
    rms_norm_f32(h, R, H, nw, eps, hn);
    if ((rc = qlin(k13, g13, q13, d13, m13, 2 * I, H, hn, R, gu, variant, threads))) return rc;
    silu_mul(gu, R, I, act);
    if ((rc = qlin(k2, g2, q2, d2, m2, H, I, act, R, out, variant, threads))) return rc;
    for (long i = 0; i < R * H; i++) out[i] = h[i] + out[i];
    return 0;
}

/* ------------------------------------------------------------------------------------- attention
 * The fp32 attention of one decoder layer for the native path (Vaswani et al. 2017; GQA by grouping query
 * heads, query head h reading kv head h / g as HF's repeat_kv; RoPE in HF's half-split layout):
 *   1. for every token (b, n): q and k heads rotated by cos / sin (sin carries the sign of rotate_half:
 *      x * cos + swap_halves(x) * sin), k and v written to the cache at row rows[b], slot slots[b, n];
 *   2. for every query head: scores s_j = scale * q . k_j + mask[b, n, j] over the first S slots of its
 *      row, softmax (max subtracted, fp32), out = sum_j p_j v_j.
 * qkv [B, N, nh D + 2 nkv D] fp32 (q heads, k heads, v heads); cos, sin [B, N, D]; caches
 * [rows, nkv, Smax, D]; mask [B, N, S] additive (0 = attend, fp32-min = masked); out [B, N, nh D].
 * Each query's result depends on its own row, the cache and its mask row only, and every sum over slots
 * (the softmax denominator, the weighted values) runs in slot order with masked slots adding exact zeros:
 * a query computes the same bits whatever N, S, the batch and where masked slots fall between the ones
 * it attends (a tree verify's ancestors sit among masked siblings; the plain step's are contiguous). That
 * matters beyond rounding: the int8 activation quantization of the VNNI variant turns a last-bit
 * difference into a visible one. The q . k dot products run in 16 fixed lanes over the head dimension
 * (lane l takes the elements with index l mod 16), vectorized without reordering a sum. */
#define LANES 16
#define HC 4 /* most query heads of one kv head scored in one pass (AVX-512 attention) */
#define MASKED (-1e30f) /* an additive mask value at or below this hides its slot (torch.finfo(fp32).min) */

/* The slots a query scores: its mask row mk [S] without the trailing masked slots. A masked slot weighs
 * exactly 0 (its exp underflows to 0), so leaving the trailing ones out changes no bit of the result; it
 * saves the keys and values a shorter row of a batch does not see (the batch attends up to its longest
 * row). 0 for a query that sees no slot: a padding position of a ragged batch (the caller masks its whole
 * row), whose output no one reads; it gets zeros without touching the cache. */
static inline long visible_slots(const float *mk, long S) {
    long n = S;
    while (n > 0 && mk[n - 1] <= MASKED) n--;
    return n;
}

static inline float dot_lanes(const float *a, const float *b, long n) {
    float acc[LANES] = {0};
    long i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += a[i + l] * b[i + l];
    for (; i < n; i++) acc[i % LANES] += a[i] * b[i];
    float s = 0.f;
    for (int l = 0; l < LANES; l++) s += acc[l];
    return s;
}

static inline void rope(const float *x, const float *c, const float *s, long D, float *o) {
    long h = D / 2;
    for (long i = 0; i < h; i++) {
        o[i] = x[i] * c[i] + x[i + h] * s[i];
        o[i + h] = x[i + h] * c[i + h] + x[i] * s[i + h];
    }
}

__attribute__((target_clones("avx2", "default")))
static int attn_f32_generic(const float *qkv, long B, long N, long nh, long nkv, long D, const float *cs, const float *sn,
             float *kc, float *vc, long Smax, const long *rows, const long *slots, const float *mask, long S,
             float scale, float *out) {
    if (B < 1 || N < 1 || nh < 1 || nkv < 1 || nh % nkv || D < 2 || D % 2 || S < 1 || S > Smax) return -1;
    long g = nh / nkv, width = (nh + 2 * nkv) * D;
    float *q = scratch(B * N * nh * D + S);
    if (!q) return -3;
    float *p = q + B * N * nh * D;
    for (long b = 0; b < B; b++)
        for (long n = 0; n < N; n++) {
            long t = b * N + n;
            const float *row = qkv + t * width, *c = cs + t * D, *s = sn + t * D;
            long slot = slots[t];
            if (slot < 0 || slot >= Smax) return -1;
            for (long h = 0; h < nh; h++) rope(row + h * D, c, s, D, q + (t * nh + h) * D);
            for (long h = 0; h < nkv; h++) {
                long at = ((rows[b] * nkv + h) * Smax + slot) * D;
                rope(row + (nh + h) * D, c, s, D, kc + at);
                memcpy(vc + at, row + (nh + nkv + h) * D, sizeof(float) * D);
            }
        }
    for (long b = 0; b < B; b++)
        for (long h = 0; h < nh; h++) {
            long kvh = h / g;
            const float *K = kc + (rows[b] * nkv + kvh) * Smax * D, *V = vc + (rows[b] * nkv + kvh) * Smax * D;
            for (long n = 0; n < N; n++) {
                long t = b * N + n;
                const float *qv = q + (t * nh + h) * D, *mk = mask + t * S;
                long St = visible_slots(mk, S);
                if (St == 0) {
                    memset(out + t * nh * D + h * D, 0, sizeof(float) * D);
                    continue;
                }
                float mx = -INFINITY;
                for (long j = 0; j < St; j++) {
                    p[j] = scale * dot_lanes(qv, K + j * D, D) + mk[j];
                    mx = fmaxf(mx, p[j]);
                }
                float sum = 0.f; /* in slot order, one accumulator: masked slots add exact zeros */
                long j;
                for (j = 0; j < St; j++) {
                    p[j] = expf(p[j] - mx);
                    sum += p[j];
                }
                float inv = 1.f / sum, *o = out + t * nh * D + h * D;
                for (long i = 0; i < D; i++) o[i] = 0.f;
                for (j = 0; j < St; j++) {
                    float w = p[j] * inv;
                    const float *vj = V + j * D;
                    for (long i = 0; i < D; i++) o[i] += w * vj[i];
                }
            }
        }
    return 0;
}


/* exp(x) for 16 lanes: 2^n * p(r), n = round(x log2 e), r = x - n ln 2 (Cody-Waite split), p a degree-6
 * polynomial (Taylor, |r| <= ln2/2: relative error ~2e-7); 0 below -87 (where expf is denormal or 0), so
 * masked slots (score fp32-min) weigh exactly 0. Element by element: no lane sees another. */
__attribute__((target("avx512f"))) static inline __m512 exp16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.0f);
    __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
    x = _mm512_max_ps(x, lo);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), 0);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}

/* One pass of the AVX-512 attention: hc query heads (q [hc, D], consecutive) of one kv head against the
 * S keys K [S, D] and values V [S, D] under the additive mask row mk [S]; p: hc rows of S + 16 floats of
 * scratch; out [hc, D]. Per head: s_j = scale * (q . k_j) + mk[j] (D/16 vector FMAs in order, then a fixed
 * horizontal sum), p_j = exp(s_j - max), the denominator summed in slot order, out = sum_j (p_j / sum) v_j
 * accumulated in slot order. Always inlined with constant hc and V16 so the loops unroll into registers. */
__attribute__((target("avx512f"), always_inline)) static inline void attn_pass(const float *q, const float *K,
                                                                              const float *V, const float *mk,
                                                                              long S, float scale, float *p,
                                                                              float *out, const long hc,
                                                                              const long V16) {
    const long D = 16 * V16, P = S + 16;
    float mx[HC], sum[HC];
    for (long h = 0; h < hc; h++) {
        mx[h] = -INFINITY;
        sum[h] = 0.f;
    }
    for (long j = 0; j < S; j++) { /* each key loaded once for the heads of the pass */
        const float *kj = K + j * D;
        /* the value row too: V then streams in beside K (a second stream) instead of after it */
        for (long l = 0; l < D; l += 16) _mm_prefetch((const char *)(V + j * D + l), _MM_HINT_T0);
        for (long h = 0; h < hc; h++) {
            const float *qv = q + h * D;
            __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qv), _mm512_loadu_ps(kj));
            for (long v = 1; v < V16; v++) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qv + 16 * v), _mm512_loadu_ps(kj + 16 * v), acc);
            float sc = scale * _mm512_reduce_add_ps(acc) + mk[j];
            p[h * P + j] = sc;
            mx[h] = sc > mx[h] ? sc : mx[h];
        }
    }
    for (long h = 0; h < hc; h++) {
        float *ph = p + h * P;
        __m512 mv = _mm512_set1_ps(mx[h]);
        long j = 0;
        for (; j + 16 <= S; j += 16) _mm512_storeu_ps(ph + j, exp16(_mm512_sub_ps(_mm512_loadu_ps(ph + j), mv)));
        if (j < S) {
            __mmask16 tail = (__mmask16)((1u << (S - j)) - 1);
            _mm512_mask_storeu_ps(ph + j, tail, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, ph + j), mv)));
        }
    }
    for (long j = 0; j < S; j++) /* slot order, one accumulator per head */
        for (long h = 0; h < hc; h++) sum[h] += p[h * P + j];
    __m512 inv[HC], o[16];
    for (long h = 0; h < hc; h++) inv[h] = _mm512_set1_ps(1.f / sum[h]);
    for (long i = 0; i < hc * V16; i++) o[i] = _mm512_setzero_ps();
    for (long j = 0; j < S; j++) { /* each value row loaded once for the heads of the pass */
        const float *vj = V + j * D;
        for (long h = 0; h < hc; h++) {
            __m512 w = _mm512_mul_ps(_mm512_set1_ps(p[h * P + j]), inv[h]);
            for (long v = 0; v < V16; v++) o[h * V16 + v] = _mm512_fmadd_ps(w, _mm512_loadu_ps(vj + 16 * v), o[h * V16 + v]);
        }
    }
    for (long h = 0; h < hc; h++)
        for (long v = 0; v < V16; v++) _mm512_storeu_ps(out + h * D + 16 * v, o[h * V16 + v]);
}

/* attn_f32 on AVX-512 for head dimensions that are multiples of 16 (<= 256): up to HC query heads of a
 * kv head in one pass, so each key and value row is loaded once for them; per query head one dot of D/16
 * vector FMAs and a fixed horizontal sum per key, exp16 over 16 slots at a time, the denominator summed
 * in slot order with one accumulator and the values accumulated in slot order (per element): each head's
 * arithmetic does not depend on the heads beside it, and it is slot-invariant as the generic version. */
__attribute__((target("avx512f"))) static int attn_f32_avx512(const float *qkv, long B, long N, long nh, long nkv,
                                                             long D, const float *cs, const float *sn, float *kc,
                                                             float *vc, long Smax, const long *rows,
                                                             const long *slots, const float *mask, long S,
                                                             float scale, float *out, int threads) {
    long g = nh / nkv, width = (nh + 2 * nkv) * D, V16 = D / 16;
    float *q = scratch(B * N * nh * D + threads * HC * (S + 16));
    if (!q) return -3;
    for (long b = 0; b < B; b++)
        for (long n = 0; n < N; n++) {
            long t = b * N + n;
            const float *row = qkv + t * width, *c = cs + t * D, *s = sn + t * D;
            long slot = slots[t];
            if (slot < 0 || slot >= Smax) return -1;
            for (long h = 0; h < nh; h++) rope(row + h * D, c, s, D, q + (t * nh + h) * D);
            for (long h = 0; h < nkv; h++) {
                long at = ((rows[b] * nkv + h) * Smax + slot) * D;
                rope(row + (nh + h) * D, c, s, D, kc + at);
                memcpy(vc + at, row + (nh + nkv + h) * D, sizeof(float) * D);
            }
        }
    long hc_max = 16 / V16 < 1 ? 1 : 16 / V16; /* query heads per pass: their accumulators fit 16 registers */
    if (hc_max > HC) hc_max = HC;
    long tasks = B * nkv * N; /* (row, kv head, token): independent, each its own output rows */
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && tasks > 1)
    for (long task = 0; task < tasks; task++) {
        long b = task / (nkv * N), kvh = task / N % nkv, t = b * N + task % N;
        float *pbuf = q + B * N * nh * D + thread_index() * HC * (S + 16);
        const float *K = kc + (rows[b] * nkv + kvh) * Smax * D, *V = vc + (rows[b] * nkv + kvh) * Smax * D;
        const float *mk = mask + t * S;
        long St = visible_slots(mk, S);
        if (St == 0) {
            memset(out + t * nh * D + kvh * g * D, 0, sizeof(float) * g * D);
            continue;
        }
        for (long g0 = 0; g0 < g; g0 += hc_max) {
            long hc = g - g0 < hc_max ? g - g0 : hc_max;
            const float *qh = q + (t * nh + kvh * g + g0) * D;
            float *dst = out + t * nh * D + (kvh * g + g0) * D;
            /* constant head counts and widths for the common shapes: the pass unrolls into registers */
            if (V16 == 4 && hc == 3) attn_pass(qh, K, V, mk, St, scale, pbuf, dst, 3, 4);
            else if (V16 == 4 && hc == 4) attn_pass(qh, K, V, mk, St, scale, pbuf, dst, 4, 4);
            else if (V16 == 4 && hc == 2) attn_pass(qh, K, V, mk, St, scale, pbuf, dst, 2, 4);
            else if (V16 == 8 && hc == 2) attn_pass(qh, K, V, mk, St, scale, pbuf, dst, 2, 8);
            else if (V16 == 4) attn_pass(qh, K, V, mk, St, scale, pbuf, dst, 1, 4);
            else if (V16 == 8) attn_pass(qh, K, V, mk, St, scale, pbuf, dst, 1, 8);
            else for (long h = 0; h < hc; h++) attn_pass(qh + h * D, K, V, mk, St, scale, pbuf, dst + h * D, 1, V16);
        }
    }
    return 0;
}

int attn_f32(const float *qkv, long B, long N, long nh, long nkv, long D, const float *cs, const float *sn,
             float *kc, float *vc, long Smax, const long *rows, const long *slots, const float *mask, long S,
             float scale, float *out, int threads) {
    if (B < 1 || N < 1 || nh < 1 || nkv < 1 || nh % nkv || D < 2 || D % 2 || S < 1 || S > Smax) return -1;
    if ((qgemm_variants() & 4) && D % 16 == 0 && D <= 256)
        return attn_f32_avx512(qkv, B, N, nh, nkv, D, cs, sn, kc, vc, Smax, rows, slots, mask, S, scale, out,
                               threads < 1 ? 1 : threads);
    return attn_f32_generic(qkv, B, N, nh, nkv, D, cs, sn, kc, vc, Smax, rows, slots, mask, S, scale, out);
}


/* act [R, I] = silu(g) * u = g / (1 + exp(-g)) * u for gu [R, 2I] (gate columns, then up): exp16 on AVX-512,
 * expf elsewhere; element by element. */
__attribute__((target("avx512f"))) static void silu_mul_avx512(const float *gu, long R, long I, float *act) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (long r = 0; r < R; r++) {
        const float *g = gu + r * 2 * I, *u = g + I;
        float *o = act + r * I;
        long j = 0;
        for (; j + 16 <= I; j += 16) {
            __m512 gv = _mm512_loadu_ps(g + j);
            __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
            _mm512_storeu_ps(o + j, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + j)));
        }
        for (; j < I; j++) o[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
    }
}

static void silu_mul(const float *gu, long R, long I, float *act) {
    if (qgemm_variants() & 4) {
        silu_mul_avx512(gu, R, I, act);
        return;
    }
    for (long r = 0; r < R; r++)
        for (long j = 0; j < I; j++) {
            float g = gu[r * 2 * I + j];
            act[r * I + j] = g / (1.0f + expf(-g)) * gu[r * 2 * I + I + j];
        }
}


/* ------------------------------------------------------------------------------------- decoder stack
 * Every decoder layer of one forward in one call: per layer norm_linear (input norm, q/k/v), attn_f32 and
 * ffn_block, exactly the three calls a layer makes from Python (the same bits), with no interpreter work
 * between layers. One layer_args per layer, built once per cache placement (see qgemm.py). x [R, H] is
 * updated in place (layer by layer); hidden, when not NULL, holds per layer a [R, H] destination for that
 * layer's output, or NULL. A ragged batch packs its R = T real tokens of the B x N grid: pack_index [T]
 * gives each packed token's position in the grid, and the attention runs over the grid with zero q/k/v at
 * the padding positions (whose K/V the caller sends to a trash slot and whose mask rows it masks whole, so
 * their attention is skipped), as DecoderLayer._fused does. */
typedef struct {
    const float *n1, *n2;        /* input and FFN RMSNorm weights [H] */
    float e1, e2;                /* their epsilons */
    int kq, ko, k13, k2;         /* kinds of the q/k/v, wo, w13, w2 linears (see qlin) */
    long gq, go, g13, g2;        /* their groups */
    const void *qq, *qo, *q13, *q2;
    const float *dq, *dO, *d13, *d2;
    const float *mq, *mo, *m13, *m2;
    float *kc, *vc;              /* the layer's K and V caches [rows, nkv, Smax, D] */
} layer_args;

static __thread void *stack_buf = 0;
static __thread long stack_cap = 0;

int decoder_stack(const layer_args *L, long nl, float *x, long R, long H, long Q, long I, long nh, long nkv,
                  long D, long Smax, float scale, long B, long N, const float *cs, const float *sn,
                  const long *rows, const long *slots, const float *mask, long S, const long *pack_index,
                  float **hidden, int variant, int threads) {
    long nq = (nh + 2 * nkv) * D, G = B * N;
    if (nl < 1 || R < 1 || (pack_index ? R > G : R != G)) return -1;
    long need = R * nq + G * Q + R * H + (pack_index ? G * nq + R * Q : 0);
    float *buf = (float *)grow(&stack_buf, &stack_cap, need * (long)sizeof(float));
    if (!buf) return -3;
    float *qkv = buf, *a = qkv + R * nq, *out = a + G * Q, *grid = out + R * H, *ap = grid + G * nq;
    for (long l = 0; l < nl; l++) {
        const layer_args *p = L + l;
        int rc = norm_linear(x, R, H, p->n1, p->e1, p->kq, p->gq, p->qq, p->dq, p->mq, nq, qkv, variant, threads);
        if (rc) return rc;
        const float *q_in = qkv;
        if (pack_index) {
            memset(grid, 0, G * nq * sizeof(float));
            for (long t = 0; t < R; t++) memcpy(grid + pack_index[t] * nq, qkv + t * nq, nq * sizeof(float));
            q_in = grid;
        }
        if ((rc = attn_f32(q_in, B, N, nh, nkv, D, cs, sn, p->kc, p->vc, Smax, rows, slots, mask, S, scale, a,
                            threads)))
            return rc;
        const float *a_in = a;
        if (pack_index) {
            for (long t = 0; t < R; t++) memcpy(ap + t * Q, a + pack_index[t] * Q, Q * sizeof(float));
            a_in = ap;
        }
        if ((rc = ffn_block(a_in, x, R, H, Q, I, p->ko, p->go, p->qo, p->dO, p->mo, p->k13, p->g13, p->q13, p->d13,
                            p->m13, p->k2, p->g2, p->q2, p->d2, p->m2, p->n2, p->e2, out, variant, threads)))
            return rc;
        memcpy(x, out, R * H * sizeof(float));
        if (hidden && hidden[l]) memcpy(hidden[l], x, R * H * sizeof(float));
    }
    return 0;
}
