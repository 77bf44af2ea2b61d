/* Skinny fp32 GEMM for decoding and speculative verification on x86-64 CPUs (AVX2 + FMA).
 *
 *   y[r, o] = sum_k x[r, k] * w[o, k]      x [R, K], w [O, K] (row-major), y [R, O], R small (1..16)
 *
 * Why: a verify forward multiplies every weight by only R = kappa + 1 rows. BLAS SGEMM packs and
 * tiles for large R and is compute-bound at a poor rate for R = 2..16, so the verify forward cost
 * 1.4-2x a one-token step on this project's CPU; with R this small the product should be bound by
 * streaming w from memory once, whatever R is. Here a group of NO weight rows (4 for R <= 3, else 2)
 * is loaded once per 8-wide K chunk and FMA'd into NO x R accumulators (the R rows of x stay in L1
 * and are read as memory operands); R is split into chunks of at most 6 rows (at most 12
 * accumulators), the next group's weights are prefetched while a group is multiplied, and outputs
 * are walked in blocks of OBLOCK rows so that a block's weights are still in L2 when the next row
 * chunk reads them.
 *
 * Invariance within this kernel: every y[r, o] is the same sequence of fp32 operations (8 lane
 * partial sums in K order, a fixed horizontal reduction, then the K % 8 tail in order) for every R,
 * every row r and every thread count. (specc.models.llama.Linear sends one row on one thread to
 * numpy's GEMV instead, so across row counts the model's logits agree to ~1e-5, not bit for bit.)
 */
#include <immintrin.h>
#include <stdint.h>

#define OBLOCK 64
#ifndef PFG
#define PFG 1 /* prefetch the weight group this many groups ahead */
#endif

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* 4 lanes */
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));                                         /* 2 lanes */
    s = _mm_add_ss(s, _mm_movehdup_ps(s));                                          /* 1 lane */
    return _mm_cvtss_f32(s);
}

/* One output row o: y[r, o] for the R rows of x. */
static inline void one_output(int R, const float *x, long ldx, const float *wo, long K, float *y, long ldy, long o) {
    for (int r = 0; r < R; r++) {
        const float *xr = x + r * ldx;
        __m256 a = _mm256_setzero_ps();
        long k = 0;
        for (; k + 8 <= K; k += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(wo + k), _mm256_loadu_ps(xr + k), a);
        float s = hsum8(a);
        for (; k < K; k++) s += wo[k] * xr[k];
        y[r * ldy + o] = s;
    }
}

/* Rows [0, R) x outputs [o0, o1): R (1..6) and NO (outputs per group: 4 for R <= 3, else 2) are
 * compile-time constants, so the NO x R accumulators stay in registers. While a group of NO weight
 * rows (one contiguous block) is multiplied, the next group's block is prefetched linearly. */
#define DEFINE_ROWS(R, NO)                                                                               \
    static void rows_##R(const float *x, long ldx, const float *w, long K, float *y, long ldy, long o0, \
                         long o1) {                                                                      \
        long o = o0;                                                                                     \
        for (; o + NO <= o1; o += NO) {                                                                  \
            const float *wr[NO];                                                                         \
            __m256 acc[NO][R];                                                                           \
            _Pragma("GCC unroll 4") for (int j = 0; j < NO; j++) {                                       \
                wr[j] = w + (o + j) * K;                                                                 \
                _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) acc[j][r] = _mm256_setzero_ps();     \
            }                                                                                            \
            /* a later group (one contiguous block); an address, never dereferenced, may pass the end */ \
            const uintptr_t next = (uintptr_t)w + (uintptr_t)((o + PFG * NO) * K) * sizeof(float);         \
            long k = 0;                                                                                  \
            for (; k + 8 <= K; k += 8) {                                                                 \
                __m256 v[NO];                                                                            \
                _Pragma("GCC unroll 4") for (int j = 0; j < NO * 8; j += 16)                             \
                    _mm_prefetch((const char *)(next + (uintptr_t)(k * NO + j) * sizeof(float)), _MM_HINT_T0); \
                _Pragma("GCC unroll 4") for (int j = 0; j < NO; j++) v[j] = _mm256_loadu_ps(wr[j] + k);  \
                _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) {                                    \
                    __m256 xv = _mm256_loadu_ps(x + r * ldx + k);                                        \
                    _Pragma("GCC unroll 4") for (int j = 0; j < NO; j++)                                 \
                        acc[j][r] = _mm256_fmadd_ps(v[j], xv, acc[j][r]);                                \
                }                                                                                        \
            }                                                                                            \
            for (int j = 0; j < NO; j++)                                                                 \
                for (int r = 0; r < R; r++) {                                                            \
                    const float *xr = x + r * ldx;                                                       \
                    float s = hsum8(acc[j][r]);                                                          \
                    for (long kk = k; kk < K; kk++) s += wr[j][kk] * xr[kk];                             \
                    y[r * ldy + o + j] = s;                                                              \
                }                                                                                        \
        }                                                                                                \
        for (; o < o1; o++) one_output(R, x, ldx, w + o * K, K, y, ldy, o);                              \
    }

DEFINE_ROWS(1, 4)
DEFINE_ROWS(2, 4)
DEFINE_ROWS(3, 4)
DEFINE_ROWS(4, 2)
DEFINE_ROWS(5, 2)
DEFINE_ROWS(6, 2)

typedef void (*rows_fn)(const float *, long, const float *, long, float *, long, long, long);
static const rows_fn ROWS[7] = {0, rows_1, rows_2, rows_3, rows_4, rows_5, rows_6};

/* y [R, O] (row stride ldy) = x [R, K] (row stride ldx) @ w[o0:o1, :]^T for outputs [o0, o1) only,
 * output blocks shared among `threads` OpenMP threads (results do not depend on the thread count).
 * Any R >= 1. Returns 0, or -1 for bad sizes. */
int skinny_gemm(const float *x, long ldx, const float *w, long K, float *y, long ldy, long R, long o0, long o1,
                int threads) {
    if (R < 1 || K < 1 || o0 < 0 || o1 < o0 || ldx < K || threads < 1) return -1;
    long nblocks = (o1 - o0 + OBLOCK - 1) / OBLOCK;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && nblocks > 1)
    for (long i = 0; i < nblocks; i++) {
        long b = o0 + i * OBLOCK;
        long e = b + OBLOCK < o1 ? b + OBLOCK : o1;
        for (long r0 = 0; r0 < R; r0 += 6) {
            long n = R - r0 < 6 ? R - r0 : 6;
            ROWS[n](x + r0 * ldx, ldx, w, K, y + r0 * ldy, ldy, b, e);
        }
    }
    return 0;
}
