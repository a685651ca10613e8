// MatMulNBits (com.microsoft) at 4 bits on the CPU: Y[M, N] = A[M, K] @ dequantize(B)^T, read packed.
//
// B is uint8 [N, n_blocks * block_size / 2] (or [N, n_blocks, block_size / 2]): row n (output feature n) cut along K into blocks of block_size
// values, two values a byte, lowest nibble first. Block (n, b) is (q - zero_point[n, b]) * scale[n, b]; the
// zero point is absent (8), packed uint8 [N, ceil(n_blocks / 2)] (two a byte, lowest first) or float [N, n_blocks].
//
// Two ways, as onnxruntime's CPU kernel (MLAS SQNBitGemm) has them:
// - accuracy 4 (int8): each block of A is rounded to int8 (scale = max|a| / 127, a * (127 / max|a|) rounded
//   half to even: MLAS's QuantizeARow_CompInt8 multiplies by 127 / max, which differs from 1 / scale in the
//   last bit for some max and then moves a value near a half by one step), the block's
//   integer dot with (q - zero_point) is exact, and the blocks add up as dot * a_scale * b_scale in float;
// - otherwise (float): each row of B is dequantized to float (a block at a time, into a buffer the size of
//   one row) and multiplied with every row of A: the weight is never materialised whole.
//
// Work is split over N in chunks run on XLA's intra-op thread pool (the calling thread takes chunks too and
// waits only for chunks already claimed, so nothing waits on a task that has not started). On x86-64 the
// inner loops use AVX2 (and AVX512-VNNI's u8 x s8 dot for int8) where the CPU has them (checked at run time),
// plain C++ otherwise; the attribute `simd` caps them (0 plain, 1 AVX2, 2 all; the tests compare each with
// onnxruntime). Blocks of 32 and more unpack B's bytes in registers for up to 4 rows of A at a time (float
// compute with K a multiple of 128: as 32-bit lanes, lanes_tile); from 8 rows of A float compute runs a GEMM
// over K-major panels of dequantized rows (panel_product); blocks of 16 go through a row buffer.
//
// A row of A is permuted within each chunk of C values (C = 32, or 16 for blocks of 16) so that a chunk of
// B's packed bytes needs no interleaving: its low nibbles meet A's even positions, its high nibbles the odd.

#include <Python.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define O2J_X86 1
#endif

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kPanelRows = 8;  // from this many rows of A, float compute dequantizes B into panels (AVX-512)

struct Problem {
  int64_t M, N, K, block, blocks, chunk;  // chunk: C values a SIMD step (32, or 16 for blocks of 16)
  const uint8_t* b;                        // [N, blocks * block / 2]
  const float* scales;                     // [N, blocks]
  int zp_kind;                             // 0 none, 1 packed uint8, 2 float
  const uint8_t* zp_packed;                // [N, ceil(blocks / 2)]
  const float* zp_float;                   // [N, blocks]
  float* y;                                // [M, N]
  // Prepared A, rows of Kp = blocks * block values, permuted per chunk:
  const float* af;   // float path
  const int8_t* aq;  // int8 path
  const float* ascale;  // [M, blocks] int8 path
  const int32_t* asum;  // [M, blocks] int8 path: each block's sum of A's int8 values
  int simd;             // 0 plain C++, 1 AVX2, 2 AVX-512 (F, BW, DQ, VL, VNNI) where the CPU has them
};

inline float zero_point(const Problem& p, int64_t n, int64_t b) {
  if (p.zp_kind == 1) {
    uint8_t byte = p.zp_packed[n * ((p.blocks + 1) / 2) + b / 2];
    return static_cast<float>((b & 1) ? (byte >> 4) : (byte & 15));
  }
  if (p.zp_kind == 2) return p.zp_float[n * p.blocks + b];
  return 8.0f;
}

inline int zero_point_int(const Problem& p, int64_t n, int64_t b) {
  if (p.zp_kind == 1) {
    uint8_t byte = p.zp_packed[n * ((p.blocks + 1) / 2) + b / 2];
    return (b & 1) ? (byte >> 4) : (byte & 15);
  }
  return 8;
}

// The value of B at packed chunk position j (0 <= j < C) of a chunk starting at byte `bytes`: positions below
// C/2 are the low nibbles, the others the high nibbles (A is permuted to match).
inline int nibble(const uint8_t* bytes, int64_t j, int64_t half) {
  return j < half ? (bytes[j] & 15) : (bytes[j - half] >> 4);
}

// ---- float path ----

// Row n of B dequantized into w[Kp] (chunk-permuted like A).
void dequantize_row(const Problem& p, int64_t n, float* w) {
  const int64_t row_bytes = p.blocks * p.block / 2, half = p.chunk / 2;
  const uint8_t* row = p.b + n * row_bytes;
  for (int64_t b = 0; b < p.blocks; ++b) {
    const float s = p.scales[n * p.blocks + b], z = zero_point(p, n, b);
    for (int64_t c = 0; c < p.block; c += p.chunk) {
      const uint8_t* bytes = row + (b * p.block + c) / 2;
      float* out = w + b * p.block + c;
      for (int64_t j = 0; j < p.chunk; ++j) out[j] = (static_cast<float>(nibble(bytes, j, half)) - z) * s;
    }
  }
}

float dot_plain(const float* a, const float* w, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * w[i + j];
  float total = 0;
  for (int j = 0; j < 8; ++j) total += acc[j];
  for (; i < n; ++i) total += a[i] * w[i];
  return total;
}

#ifdef O2J_X86
__attribute__((target("avx2,fma"))) inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) void dequantize_row_avx2(const Problem& p, int64_t n, float* w) {
  const int64_t row_bytes = p.blocks * p.block / 2;
  const uint8_t* row = p.b + n * row_bytes;
  const __m128i low = _mm_set1_epi8(15);
  for (int64_t b = 0; b < p.blocks; ++b) {
    const __m256 s = _mm256_set1_ps(p.scales[n * p.blocks + b]);
    const __m256 z = _mm256_set1_ps(zero_point(p, n, b));
    for (int64_t c = 0; c < p.block; c += p.chunk) {
      const uint8_t* bytes = row + (b * p.block + c) / 2;
      float* out = w + b * p.block + c;
      __m128i v;
      if (p.chunk == 32) {
        const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes));
        const __m128i lo = _mm_and_si128(packed, low), hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
        const __m128i parts[2] = {lo, hi};
        for (int h = 0; h < 2; ++h) {
          v = parts[h];
          __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
          __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
          _mm256_storeu_ps(out + 16 * h, _mm256_mul_ps(_mm256_sub_ps(f0, z), s));
          _mm256_storeu_ps(out + 16 * h + 8, _mm256_mul_ps(_mm256_sub_ps(f1, z), s));
        }
      } else {  // chunk of 16: 8 bytes
        const __m128i packed = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes));
        const __m128i lo = _mm_and_si128(packed, low), hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
        __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
        __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
        _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_sub_ps(f0, z), s));
        _mm256_storeu_ps(out + 8, _mm256_mul_ps(_mm256_sub_ps(f1, z), s));
      }
    }
  }
}

// Four rows of A against one dequantized row w (Kp a multiple of 16).
__attribute__((target("avx2,fma"))) void dot4_avx2(const float* a, int64_t lda, int64_t rows, const float* w,
                                                   int64_t kp, float* out) {
  __m256 acc[4][2];
  for (int r = 0; r < 4; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < kp; k += 16) {
    const __m256 w0 = _mm256_loadu_ps(w + k), w1 = _mm256_loadu_ps(w + k + 8);
    for (int r = 0; r < 4; ++r) {
      if (r < rows) {
        acc[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(a + r * lda + k), w0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(a + r * lda + k + 8), w1, acc[r][1]);
      }
    }
  }
  for (int r = 0; r < rows; ++r) out[r] = hsum256(_mm256_add_ps(acc[r][0], acc[r][1]));
}
#endif

void rows_float(const Problem& p, int64_t n0, int64_t n1) {
  const int64_t kp = p.blocks * p.block;
  std::vector<float> w(kp);
  for (int64_t n = n0; n < n1; ++n) {
#ifdef O2J_X86
    if (p.simd) {
      dequantize_row_avx2(p, n, w.data());
      float out[4];
      for (int64_t m = 0; m < p.M; m += 4) {
        const int64_t rows = std::min<int64_t>(4, p.M - m);
        dot4_avx2(p.af + m * kp, kp, rows, w.data(), kp, out);
        for (int64_t r = 0; r < rows; ++r) p.y[(m + r) * p.N + n] = out[r];
      }
      continue;
    }
#endif
    dequantize_row(p, n, w.data());
    for (int64_t m = 0; m < p.M; ++m) p.y[m * p.N + n] = dot_plain(p.af + m * kp, w.data(), kp);
  }
}

// ---- int8 path ----

void rows_int8_plain(const Problem& p, int64_t n0, int64_t n1) {
  const int64_t kp = p.blocks * p.block, row_bytes = kp / 2, half = p.chunk / 2;
  std::vector<int8_t> w(kp);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = p.b + n * row_bytes;
    for (int64_t b = 0; b < p.blocks; ++b) {
      const int z = zero_point_int(p, n, b);
      for (int64_t c = 0; c < p.block; c += p.chunk)
        for (int64_t j = 0; j < p.chunk; ++j)
          w[b * p.block + c + j] = static_cast<int8_t>(nibble(row + (b * p.block + c) / 2, j, half) - z);
    }
    for (int64_t m = 0; m < p.M; ++m) {
      const int8_t* a = p.aq + m * kp;
      float total = 0;
      for (int64_t b = 0; b < p.blocks; ++b) {
        int32_t dot = 0;
        for (int64_t j = 0; j < p.block; ++j) dot += int32_t(a[b * p.block + j]) * int32_t(w[b * p.block + j]);
        total += static_cast<float>(dot) * (p.ascale[m * p.blocks + b] * p.scales[n * p.blocks + b]);
      }
      p.y[m * p.N + n] = total;
    }
  }
}

#ifdef O2J_X86
// One row of B as signed int8 (q - zero point), chunk-permuted, into w[Kp]; |w| <= 15.
__attribute__((target("avx2,fma"))) void signed_row_avx2(const Problem& p, int64_t n, int8_t* w) {
  const int64_t row_bytes = p.blocks * p.block / 2;
  const uint8_t* row = p.b + n * row_bytes;
  const __m128i low = _mm_set1_epi8(15);
  for (int64_t b = 0; b < p.blocks; ++b) {
    const __m128i z = _mm_set1_epi8(static_cast<char>(zero_point_int(p, n, b)));
    for (int64_t c = 0; c < p.block; c += p.chunk) {
      const uint8_t* bytes = row + (b * p.block + c) / 2;
      int8_t* out = w + b * p.block + c;
      if (p.chunk == 32) {
        const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_sub_epi8(_mm_and_si128(packed, low), z));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16),
                         _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(packed, 4), low), z));
      } else {
        const __m128i packed = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes));
        const __m128i lo = _mm_and_si128(packed, low), hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_sub_epi8(_mm_unpacklo_epi64(lo, hi), z));
      }
    }
  }
}

// The int32 dot of 32 int8 values a and w (|w| <= 15, |a| <= 127: no saturation), as 8 int32 lanes.
__attribute__((target("avx2,fma"))) inline __m256i dot32(__m256i a, __m256i w) {
  const __m256i prod = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
  return _mm256_madd_epi16(prod, _mm256_set1_epi16(1));
}

__attribute__((target("avx2,fma"))) void rows_int8_avx2(const Problem& p, int64_t n0, int64_t n1) {
  const int64_t kp = p.blocks * p.block;
  std::vector<int8_t> w(kp);
  std::vector<float> s(p.blocks);
  for (int64_t n = n0; n < n1; ++n) {
    signed_row_avx2(p, n, w.data());
    for (int64_t b = 0; b < p.blocks; ++b) s[b] = p.scales[n * p.blocks + b];
    for (int64_t m = 0; m < p.M; ++m) {
      const int8_t* a = p.aq + m * kp;
      const float* as = p.ascale + m * p.blocks;
      __m256 acc = _mm256_setzero_ps();
      if (p.block >= 32) {
        for (int64_t b = 0; b < p.blocks; ++b) {
          __m256i dot = _mm256_setzero_si256();
          for (int64_t c = b * p.block; c < (b + 1) * p.block; c += 32) {
            const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + c));
            const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.data() + c));
            dot = _mm256_add_epi32(dot, dot32(av, wv));
          }
          acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(as[b] * s[b]), acc);
        }
      } else {  // blocks of 16: two blocks a 32-byte step, each half with its own scale
        int64_t b = 0;
        for (; b + 2 <= p.blocks; b += 2) {
          const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + b * 16));
          const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.data() + b * 16));
          const __m256 scale = _mm256_setr_m128(_mm_set1_ps(as[b] * s[b]), _mm_set1_ps(as[b + 1] * s[b + 1]));
          acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32(av, wv)), scale, acc);
        }
        if (b < p.blocks) {
          const __m128i av = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + b * 16));
          const __m128i wv = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.data() + b * 16));
          const __m128i prod = _mm_maddubs_epi16(_mm_abs_epi8(wv), _mm_sign_epi8(av, wv));
          const __m128i dot = _mm_madd_epi16(prod, _mm_set1_epi16(1));
          const __m128 part = _mm_mul_ps(_mm_cvtepi32_ps(dot), _mm_set1_ps(as[b] * s[b]));
          acc = _mm256_add_ps(acc, _mm256_insertf128_ps(_mm256_setzero_ps(), part, 0));
        }
      }
      p.y[m * p.N + n] = hsum256(acc);
    }
  }
}
#endif

#ifdef O2J_X86
// ---- fused loops (blocks of 32 and more): B's bytes unpacked in registers, up to 4 rows of A at once ----

// Int8: the unsigned nibbles (0..15) times A's int8 values summed exactly per block (u8 x s8 products), the
// zero point's share taken off as an integer (zero_point * the block's sum of A), then scaled in float.
#define O2J_INT8_FUSED(NAME, TARGET, DOT)                                                                       \
  template <int R>                                                                                              \
  __attribute__((target(TARGET))) void NAME(const Problem& p, int64_t n, int64_t m0) {                         \
    const int64_t kp = p.blocks * p.block;                                                                      \
    const uint8_t* row = p.b + n * (kp / 2);                                                                    \
    const __m128i low = _mm_set1_epi8(15);                                                                      \
    __m256 acc[R];                                                                                              \
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();                                                   \
    for (int64_t b = 0; b < p.blocks; ++b) {                                                                    \
      __m256i dot[R];                                                                                           \
      for (int r = 0; r < R; ++r) dot[r] = _mm256_setzero_si256();                                              \
      for (int64_t c = b * p.block; c < (b + 1) * p.block; c += 32) {                                           \
        const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c / 2));                 \
        const __m256i w = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(packed, low)),           \
                                                  _mm_and_si128(_mm_srli_epi16(packed, 4), low), 1);            \
        for (int r = 0; r < R; ++r)                                                                             \
          dot[r] = DOT(dot[r], w, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.aq + (m0 + r) * kp + c))); \
      }                                                                                                         \
      const float ws = p.scales[n * p.blocks + b];                                                              \
      const int z = zero_point_int(p, n, b);                                                                    \
      for (int r = 0; r < R; ++r) {                                                                             \
        const int64_t i = (m0 + r) * p.blocks + b;                                                              \
        const __m256i fix = _mm256_zextsi128_si256(_mm_cvtsi32_si128(z * p.asum[i]));                           \
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(dot[r], fix)),                             \
                                 _mm256_set1_ps(p.ascale[i] * ws), acc[r]);                                     \
      }                                                                                                         \
    }                                                                                                           \
    for (int r = 0; r < R; ++r) p.y[(m0 + r) * p.N + n] = hsum256(acc[r]);                                      \
  }

#define O2J_DOT_AVX2(acc, w, a) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1)))
#define O2J_DOT_VNNI(acc, w, a) _mm256_dpbusd_epi32(acc, w, a)
O2J_INT8_FUSED(int8_fused_avx2, "avx2,fma", O2J_DOT_AVX2)
O2J_INT8_FUSED(int8_fused_vnni, "avx2,fma,avx512f,avx512vl,avx512vnni", O2J_DOT_VNNI)

// Float: (q - zero_point) times A summed per block in float, then times the block's scale.
template <int R>
__attribute__((target("avx2,fma"))) void float_fused_avx2(const Problem& p, int64_t n, int64_t m0) {
  const int64_t kp = p.blocks * p.block;
  const uint8_t* row = p.b + n * (kp / 2);
  const __m128i low = _mm_set1_epi8(15);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < p.blocks; ++b) {
    const __m256 z = _mm256_set1_ps(zero_point(p, n, b));
    __m256 block[R];
    for (int r = 0; r < R; ++r) block[r] = _mm256_setzero_ps();
    for (int64_t c = b * p.block; c < (b + 1) * p.block; c += 32) {
      const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c / 2));
      const __m128i lo = _mm_and_si128(packed, low), hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
      __m256 w[4];
      w[0] = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), z);
      w[1] = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), z);
      w[2] = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), z);
      w[3] = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), z);
      for (int r = 0; r < R; ++r) {
        const float* a = p.af + (m0 + r) * kp + c;
        for (int j = 0; j < 4; ++j) block[r] = _mm256_fmadd_ps(_mm256_loadu_ps(a + 8 * j), w[j], block[r]);
      }
    }
    const __m256 s = _mm256_set1_ps(p.scales[n * p.blocks + b]);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(block[r], s, acc[r]);
  }
  for (int r = 0; r < R; ++r) p.y[(m0 + r) * p.N + n] = hsum256(acc[r]);
}

// The 16 values block b of row n can take, (q - zero_point) * scale for q = 0..15, as onnxruntime dequantizes
// them: a chunk's 16 nibbles then dequantize with one `vpermps` each (the nibble the index), not a convert,
// a subtract and a multiply.
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) inline __m512 dequantized_values(const Problem& p,
                                                                                               int64_t n, int64_t b) {
  const __m512 q = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  return _mm512_mul_ps(_mm512_sub_ps(q, _mm512_set1_ps(zero_point(p, n, b))), _mm512_set1_ps(p.scales[n * p.blocks + b]));
}

// Float, AVX-512: a tile of RB rows of B by RA rows of A. Each row of B is dequantized a chunk of 32 at a time
// in registers (dequantized_values) and multiplied into RA x RB accumulators of 16 lanes along K, added up
// once at the end.
template <int RA, int RB>
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) void float_tile_avx512(const Problem& p, int64_t n0,
                                                                                       int64_t m0) {
  const int64_t kp = p.blocks * p.block;
  const uint8_t* next = p.b + (n0 + RB) * (kp / 2);
  __m512 acc[RA][RB];
  for (int r = 0; r < RA; ++r)
    for (int q = 0; q < RB; ++q) acc[r][q] = _mm512_setzero_ps();
  for (int64_t b = 0; b < p.blocks; ++b) {
    __m512 table[RB];
    for (int q = 0; q < RB; ++q) table[q] = dequantized_values(p, n0 + q, b);
    for (int64_t c = b * p.block; c < (b + 1) * p.block; c += 32) {
      // The next RB rows a cache line at a time (a chunk here is RB * 16 bytes): from DRAM the hardware
      // prefetcher alone lags behind RB short streams read 16 bytes at a time. A prefetch past B's end does not fault.
      _mm_prefetch(reinterpret_cast<const char*>(next + (c / 32) * 16 * RB), _MM_HINT_T0);
      __m512 w[RB][2];
      for (int q = 0; q < RB; ++q) {
        const __m512i bytes = _mm512_cvtepu8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(p.b + (n0 + q) * (kp / 2) + c / 2)));
        w[q][0] = _mm512_permutexvar_ps(bytes, table[q]);  // the index's low 4 bits: the low nibble
        w[q][1] = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table[q]);
      }
      for (int r = 0; r < RA; ++r) {
        const float* a = p.af + (m0 + r) * kp + c;
        const __m512 a0 = _mm512_loadu_ps(a), a1 = _mm512_loadu_ps(a + 16);
        for (int q = 0; q < RB; ++q) {
          acc[r][q] = _mm512_fmadd_ps(a0, w[q][0], acc[r][q]);
          acc[r][q] = _mm512_fmadd_ps(a1, w[q][1], acc[r][q]);
        }
      }
    }
  }
  for (int r = 0; r < RA; ++r)
    for (int q = 0; q < RB; ++q) p.y[(m0 + r) * p.N + n0 + q] = _mm512_reduce_add_ps(acc[r][q]);
}

template <int RB>
void float_tiles_avx512(const Problem& p, int64_t n) {
  int64_t m = 0;
  for (; m + 4 <= p.M; m += 4) float_tile_avx512<4, RB>(p, n, m);
  switch (p.M - m) {
    case 3: float_tile_avx512<3, RB>(p, n, m); break;
    case 2: float_tile_avx512<2, RB>(p, n, m); break;
    case 1: float_tile_avx512<1, RB>(p, n, m); break;
    default: break;
  }
}

void float_rows_avx512(const Problem& p, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) float_tiles_avx512<4>(p, n);
  switch (n1 - n) {
    case 3: float_tiles_avx512<3>(p, n); break;
    case 2: float_tiles_avx512<2>(p, n); break;
    case 1: float_tiles_avx512<1>(p, n); break;
    default: break;
  }
}

// Float, AVX-512, few rows of A (decode), K a multiple of 128: B's packed bytes read as 32-bit lanes. A group
// of 128 values of a row of B is 64 bytes, 16 lanes of 8 nibbles; the i-th nibble of lane d is value 8d + i of
// the group, so shifting the whole register by 4i and masking gives 16 values (one a lane) that meet A's values
// 8d + i (A is permuted to that order per group: lane_permute_row). A nibble becomes the float q - zero_point
// exactly with one `vpternlogd` ((bits & 15) | the exponent of 2^23, i.e. 2^23 + q) and one subtract of
// 2^23 + zero_point: no shuffles, where the chunk loops spend three shuffle-port operations per 32 values.
// Each lane's sum over a group is scaled by its block's scale (lanes 4b..4b+3 hold block b at block 32).
// Integer zero points only (2^23 + z is exact); float ones go through the chunk loops.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"))) inline __m512 lane_scales(const Problem& p,
                                                                                                int64_t n, int64_t g) {
  const float* s = p.scales + n * p.blocks;
  if (p.block == 32)
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                 _mm512_castps128_ps512(_mm_loadu_ps(s + 4 * g)));
  if (p.block == 64)
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                 _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(s + 2 * g)))));
  return _mm512_set1_ps(s[g * 128 / p.block]);
}

// 2^23 + zero_point for each lane of group g of row n.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"))) inline __m512 lane_offsets(const Problem& p,
                                                                                                 int64_t n, int64_t g) {
  if (p.zp_kind == 0) return _mm512_set1_ps(8388616.0f);
  const int64_t per = std::max<int64_t>(1, 128 / p.block), first = g * 128 / p.block;
  alignas(16) float z[4] = {0, 0, 0, 0};
  for (int64_t j = 0; j < per; ++j) z[j] = 8388608.0f + static_cast<float>(zero_point_int(p, n, first + j));
  const __m512i spread = per == 4   ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
                         : per == 2 ? _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
                                    : _mm512_setzero_si512();
  return _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_load_ps(z)));
}

template <int RA, int RB>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"))) void lanes_tile(const Problem& p, int64_t n0,
                                                                                      int64_t m0) {
  const int64_t kp = p.blocks * p.block, row_bytes = kp / 2, groups = kp / 128;
  const __m512i mask = _mm512_set1_epi32(15), magic = _mm512_set1_epi32(0x4B000000);
  const uint8_t* next = p.b + (n0 + RB) * row_bytes;
  __m512 acc[RA][RB];
  #pragma GCC unroll 8
  for (int r = 0; r < RA; ++r)
    #pragma GCC unroll 8
    for (int q = 0; q < RB; ++q) acc[r][q] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 inner[RA][RB], offset[RB];
    __m512i x[RB];
    #pragma GCC unroll 8
    for (int q = 0; q < RB; ++q) {
      // The next tile's line of this group (a group is one cache line a row): from DRAM the hardware
      // prefetcher lags behind RB streams. A prefetch past B's end does not fault.
      _mm_prefetch(reinterpret_cast<const char*>(next + q * row_bytes + g * 64), _MM_HINT_T0);
      x[q] = _mm512_loadu_si512(p.b + (n0 + q) * row_bytes + g * 64);
      offset[q] = lane_offsets(p, n0 + q, g);
      #pragma GCC unroll 8
      for (int r = 0; r < RA; ++r) inner[r][q] = _mm512_setzero_ps();
    }
    #pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      __m512 a[RA];
      #pragma GCC unroll 8
      for (int r = 0; r < RA; ++r) a[r] = _mm512_loadu_ps(p.af + (m0 + r) * kp + g * 128 + 16 * i);
      #pragma GCC unroll 8
      for (int q = 0; q < RB; ++q) {
        const __m512 w = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_ternarylogic_epi32(x[q], mask, magic, 0xEA)), offset[q]);
        x[q] = _mm512_srli_epi32(x[q], 4);
        #pragma GCC unroll 8
        for (int r = 0; r < RA; ++r) inner[r][q] = _mm512_fmadd_ps(a[r], w, inner[r][q]);
      }
    }
    #pragma GCC unroll 8
    for (int q = 0; q < RB; ++q) {
      const __m512 s = lane_scales(p, n0 + q, g);
      #pragma GCC unroll 8
      for (int r = 0; r < RA; ++r) acc[r][q] = _mm512_fmadd_ps(inner[r][q], s, acc[r][q]);
    }
  }
  #pragma GCC unroll 8
  for (int r = 0; r < RA; ++r)
    #pragma GCC unroll 8
    for (int q = 0; q < RB; ++q) p.y[(m0 + r) * p.N + n0 + q] = _mm512_reduce_add_ps(acc[r][q]);
}

template <int RB>
void lanes_tiles(const Problem& p, int64_t n) {
  int64_t m = 0;
  for (; m + 2 <= p.M; m += 2) lanes_tile<2, RB>(p, n, m);
  if (m < p.M) lanes_tile<1, RB>(p, n, m);
}

void lanes_rows(const Problem& p, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) lanes_tiles<4>(p, n);
  switch (n1 - n) {
    case 3: lanes_tiles<3>(p, n); break;
    case 2: lanes_tiles<2>(p, n); break;
    case 1: lanes_tiles<1>(p, n); break;
    default: break;
  }
}

// Many rows of A (a prompt), AVX-512: a GEMM over a K-major panel. 32 rows of B (two registers of 16 lanes)
// are dequantized once, (q - zero_point) * scale as onnxruntime computes it, and stored K-major (value k of
// the 32 rows contiguous), so that the micro-kernel keeps 8 rows of A by 32 outputs in 16 accumulators, each
// step one broadcast value of A times two loaded rows of the panel: no horizontal sums (the 4 x 4 tiles this
// replaces reduced 16 accumulators along K at the end of every tile, a large share at K of 128-512). The
// panel (kp x 32 floats, 64 KB at K 512) stays in L2 while every row of A passes over it. Float compute only:
// int8 compute at any M goes through int8_rows_vnni, whose integer block dots beat float FMAs.
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) void panel_dequantize(const Problem& p, int64_t n,
                                                                                    float* row_out) {
  const int64_t kp = p.blocks * p.block;
  const uint8_t* row = p.b + n * (kp / 2);
  for (int64_t b = 0; b < p.blocks; ++b) {
    const __m512 table = dequantized_values(p, n, b);
    for (int64_t c = b * p.block; c < (b + 1) * p.block; c += 32) {
      const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c / 2)));
      _mm512_storeu_ps(row_out + c, _mm512_permutexvar_ps(bytes, table));
      _mm512_storeu_ps(row_out + c + 16, _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table));
    }
  }
}

constexpr int64_t kPanel = 32;  // rows of B a panel: two registers of 16 lanes

// 16 rows of `rows` (row-major, stride kp) transposed into panel[k * kPanel + 16 * half + j], 16 values of K at a
// time (a 16 x 16 transpose in registers).
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) void panel_transpose(const float* rows, int64_t kp,
                                                                                  float* panel, int half) {
  for (int64_t k = 0; k < kp; k += 16) {
    __m512 r[16], t[16];
    for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_ps(rows + j * kp + k);
    for (int j = 0; j < 16; j += 2) {  // pairs of 32-bit values
      t[j] = _mm512_unpacklo_ps(r[j], r[j + 1]);
      t[j + 1] = _mm512_unpackhi_ps(r[j], r[j + 1]);
    }
    for (int j = 0; j < 16; j += 4) {  // 64-bit pairs
      r[j] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[j]), _mm512_castps_pd(t[j + 2])));
      r[j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[j]), _mm512_castps_pd(t[j + 2])));
      r[j + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[j + 1]), _mm512_castps_pd(t[j + 3])));
      r[j + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[j + 1]), _mm512_castps_pd(t[j + 3])));
    }
    // r[4g + i] now holds, in each 128-bit lane L, values k + 4L + i of rows 4g..4g+3. Gather the lanes.
    for (int i = 0; i < 4; ++i) {
      const __m512 a = r[i], b = r[4 + i], c = r[8 + i], d = r[12 + i];
      const __m512 ab_lo = _mm512_shuffle_f32x4(a, b, 0x44), ab_hi = _mm512_shuffle_f32x4(a, b, 0xEE);
      const __m512 cd_lo = _mm512_shuffle_f32x4(c, d, 0x44), cd_hi = _mm512_shuffle_f32x4(c, d, 0xEE);
      t[i] = _mm512_shuffle_f32x4(ab_lo, cd_lo, 0x88);       // lane 0 of a, b, c, d: value k + i
      t[4 + i] = _mm512_shuffle_f32x4(ab_lo, cd_lo, 0xDD);   // lane 1: k + 4 + i
      t[8 + i] = _mm512_shuffle_f32x4(ab_hi, cd_hi, 0x88);   // lane 2: k + 8 + i
      t[12 + i] = _mm512_shuffle_f32x4(ab_hi, cd_hi, 0xDD);  // lane 3: k + 12 + i
    }
    for (int j = 0; j < 16; ++j) _mm512_storeu_ps(panel + (k + j) * kPanel + 16 * half, t[j]);
  }
}

template <int MR>
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) void panel_kernel(const Problem& p, const float* a,
                                                                                const float* panel, int64_t n0,
                                                                                int64_t m0, __mmask16 mask0,
                                                                                __mmask16 mask1) {
  const int64_t kp = p.blocks * p.block;
  __m512 acc[MR][2];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const float* x = a + m0 * kp;
  for (int64_t k = 0; k < kp; ++k) {
    const __m512 w0 = _mm512_load_ps(panel + k * kPanel), w1 = _mm512_load_ps(panel + k * kPanel + 16);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 v = _mm512_set1_ps(x[r * kp + k]);
      acc[r][0] = _mm512_fmadd_ps(v, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(v, w1, acc[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    float* y = p.y + (m0 + r) * p.N + n0;
    _mm512_mask_storeu_ps(y, mask0, acc[r][0]);
    _mm512_mask_storeu_ps(y + 16, mask1, acc[r][1]);
  }
}

void panel_product(const Problem& p, const float* a, int64_t n0, int64_t n1) {
  const int64_t kp = p.blocks * p.block;
  thread_local std::vector<float> rows, storage;
  rows.assign(kPanel * kp, 0.0f);
  storage.resize(kPanel * kp + 16);
  float* panel = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(storage.data()) + 63) & ~uintptr_t(63));
  for (int64_t n = n0; n < n1; n += kPanel) {
    const int64_t count = std::min<int64_t>(kPanel, n1 - n);
    for (int64_t q = 0; q < count; ++q) panel_dequantize(p, n + q, rows.data() + q * kp);
    if (count < kPanel) std::fill(rows.begin() + count * kp, rows.end(), 0.0f);
    panel_transpose(rows.data(), kp, panel, 0);
    panel_transpose(rows.data() + 16 * kp, kp, panel, 1);
    const __mmask16 mask0 = count >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << count) - 1);
    const __mmask16 mask1 = count >= 32 ? 0xFFFF : count <= 16 ? 0 : static_cast<__mmask16>((1u << (count - 16)) - 1);
    int64_t m = 0;
    for (; m + 8 <= p.M; m += 8) panel_kernel<8>(p, a, panel, n, m, mask0, mask1);
    switch (p.M - m) {
      case 7: panel_kernel<7>(p, a, panel, n, m, mask0, mask1); break;
      case 6: panel_kernel<6>(p, a, panel, n, m, mask0, mask1); break;
      case 5: panel_kernel<5>(p, a, panel, n, m, mask0, mask1); break;
      case 4: panel_kernel<4>(p, a, panel, n, m, mask0, mask1); break;
      case 3: panel_kernel<3>(p, a, panel, n, m, mask0, mask1); break;
      case 2: panel_kernel<2>(p, a, panel, n, m, mask0, mask1); break;
      case 1: panel_kernel<1>(p, a, panel, n, m, mask0, mask1); break;
      default: break;
    }
  }
}

// Rows [n0, n1) of B against every row of A, 4 rows of A at a time.
template <template <int> class Kernel>
void fused_rows(const Problem& p, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    int64_t m = 0;
    for (; m + 4 <= p.M; m += 4) Kernel<4>::run(p, n, m);
    switch (p.M - m) {
      case 3: Kernel<3>::run(p, n, m); break;
      case 2: Kernel<2>::run(p, n, m); break;
      case 1: Kernel<1>::run(p, n, m); break;
      default: break;
    }
  }
}
template <int R> struct Int8Avx2 { static void run(const Problem& p, int64_t n, int64_t m) { int8_fused_avx2<R>(p, n, m); } };
template <int R> struct Int8Vnni { static void run(const Problem& p, int64_t n, int64_t m) { int8_fused_vnni<R>(p, n, m); } };
template <int R> struct FloatAvx2 { static void run(const Problem& p, int64_t n, int64_t m) { float_fused_avx2<R>(p, n, m); } };

// Int8, AVX-512 VNNI, few rows of A (decode): a tile of 4 * G rows of B by RA rows of A. Four rows of B share
// a register, a 128-bit lane each: one chunk of 32 values is 16 bytes a row, so its low nibbles (A's even
// positions, as A is permuted) fill one register and its high nibbles another, each against A's 16 values
// broadcast to the four lanes, u8 (nibble, 0..15) x s8 (A) with `vpdpbusd`. Each row's block dot then sits
// in 4 lanes; the zero point's share (zero_point * the block's sum of A) is taken off in the first of them,
// in float but exactly (all small integers), and the block is scaled by a_scale * b_scale as onnxruntime
// does. One convert and two float operations a block serve four rows of B.
template <int RA, int G>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma"))) void int8_quad_vnni(
    const Problem& p, int64_t n0, int64_t m0) {
  const int64_t kp = p.blocks * p.block, row_bytes = kp / 2;
  const __m512i low = _mm512_set1_epi8(15);
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const __m512 eight = _mm512_maskz_mov_ps(0x1111, _mm512_set1_ps(8.0f));
  const uint8_t* next = p.b + (n0 + 4 * G) * row_bytes;
  __m512 acc[RA][G];
  for (int r = 0; r < RA; ++r)
    for (int g = 0; g < G; ++g) acc[r][g] = _mm512_setzero_ps();
  const float* next_scales = p.scales + (n0 + 4 * G) * p.blocks;  // the next tile's, prefetched like its rows
  __m512 ws[G], ws_odd[G];
  for (int64_t b = 0; b < p.blocks; ++b) {
    __m512 zs[G];
    _mm_prefetch(reinterpret_cast<const char*>(next_scales + b * 4 * G), _MM_HINT_T0);
    for (int g = 0; g < G; ++g) {
      const int64_t n = n0 + 4 * g;
      const float* s = p.scales + n * p.blocks + b;
      if (b & 1) {
        ws[g] = ws_odd[g];
      } else if (b + 1 < p.blocks) {  // blocks b and b + 1 of the 4 rows: 4 loads of two scales each
        auto two = [](const float* x) { return _mm_load_sd(reinterpret_cast<const double*>(x)); };
        const __m128 r01 = _mm_castpd_ps(_mm_loadh_pd(two(s), reinterpret_cast<const double*>(s + p.blocks)));
        const __m128 r23 = _mm_castpd_ps(
            _mm_loadh_pd(two(s + 2 * p.blocks), reinterpret_cast<const double*>(s + 3 * p.blocks)));
        ws[g] = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_shuffle_ps(r01, r23, _MM_SHUFFLE(2, 0, 2, 0))));
        ws_odd[g] = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_shuffle_ps(r01, r23, _MM_SHUFFLE(3, 1, 3, 1))));
      } else {
        ws[g] = _mm512_permutexvar_ps(
            spread, _mm512_castps128_ps512(_mm_setr_ps(s[0], s[p.blocks], s[2 * p.blocks], s[3 * p.blocks])));
      }
      zs[g] = p.zp_kind == 0 ? eight
                             : _mm512_maskz_permutexvar_ps(
                                   0x1111, spread,
                                   _mm512_castps128_ps512(_mm_setr_ps(
                                       static_cast<float>(zero_point_int(p, n, b)), static_cast<float>(zero_point_int(p, n + 1, b)),
                                       static_cast<float>(zero_point_int(p, n + 2, b)), static_cast<float>(zero_point_int(p, n + 3, b)))));
    }
    __m512i dot[RA][G];
    for (int r = 0; r < RA; ++r)
      for (int g = 0; g < G; ++g) dot[r][g] = _mm512_setzero_si512();
    for (int64_t c = b * p.block; c < (b + 1) * p.block; c += 32) {
      // The next tile's rows (contiguous after this tile's) into cache as this one is read: a chunk of this
      // tile is G cache lines, so the next tile's G lines a chunk arrive by its start. From DRAM (a model's
      // weights do not fit in the caches) the hardware prefetcher alone lagged: 8 rows read 16 bytes at a
      // time are 8 short streams. A prefetch past B's end does not fault.
      for (int g = 0; g < G; ++g)
        _mm_prefetch(reinterpret_cast<const char*>(next + (c / 32) * 64 * G + 64 * g), _MM_HINT_T0);
      __m512i lo[G], hi[G];
      for (int g = 0; g < G; ++g) {
        const uint8_t* row = p.b + (n0 + 4 * g) * row_bytes + c / 2;
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row)));
        v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + row_bytes)), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * row_bytes)), 2);
        v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 3 * row_bytes)), 3);
        lo[g] = _mm512_and_si512(v, low);
        hi[g] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
      for (int r = 0; r < RA; ++r) {
        const int8_t* a = p.aq + (m0 + r) * kp + c;
        const __m512i a_lo = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a)));
        const __m512i a_hi = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 16)));
        for (int g = 0; g < G; ++g) {
          dot[r][g] = _mm512_dpbusd_epi32(dot[r][g], lo[g], a_lo);
          dot[r][g] = _mm512_dpbusd_epi32(dot[r][g], hi[g], a_hi);
        }
      }
    }
    for (int r = 0; r < RA; ++r) {
      const int64_t i = (m0 + r) * p.blocks + b;
      const __m512 asum = _mm512_set1_ps(static_cast<float>(p.asum[i])), as = _mm512_set1_ps(p.ascale[i]);
      for (int g = 0; g < G; ++g) {
        const __m512 exact = _mm512_fnmadd_ps(asum, zs[g], _mm512_cvtepi32_ps(dot[r][g]));
        acc[r][g] = _mm512_fmadd_ps(exact, _mm512_mul_ps(as, ws[g]), acc[r][g]);
      }
    }
  }
  for (int r = 0; r < RA; ++r)
    for (int g = 0; g < G; ++g) {
      __m512 v = acc[r][g];
      v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));  // lanes (0+1, 2+3) of each group of 4
      v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));  // the group's sum in each of its lanes
      alignas(64) float out[16];
      _mm512_store_ps(out, v);
      for (int q = 0; q < 4; ++q) p.y[(m0 + r) * p.N + n0 + 4 * g + q] = out[4 * q];
    }
}

template <int G>
void int8_quads_vnni(const Problem& p, int64_t n) {
  int64_t m = 0;
  for (; m + 4 <= p.M; m += 4) int8_quad_vnni<4, G>(p, n, m);
  switch (p.M - m) {
    case 3: int8_quad_vnni<3, G>(p, n, m); break;
    case 2: int8_quad_vnni<2, G>(p, n, m); break;
    case 1: int8_quad_vnni<1, G>(p, n, m); break;
    default: break;
  }
}

// Rows [n0, n1): 8 rows of B a tile, then 4; the last few through the one-row loop.
void int8_rows_vnni(const Problem& p, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 8 <= n1; n += 8) int8_quads_vnni<2>(p, n);
  if (n + 4 <= n1) {
    int8_quads_vnni<1>(p, n);
    n += 4;
  }
  if (n < n1) fused_rows<Int8Vnni>(p, n, n1);
}
#endif

// ---- A prepared: padded to whole blocks, permuted per chunk; int8 blocks for accuracy 4 ----

void permute_row(const float* src, int64_t k, int64_t kp, int64_t chunk, float* dst) {
  const int64_t half = chunk / 2;
  for (int64_t c = 0; c < kp; c += chunk)
    for (int64_t j = 0; j < half; ++j) {
      const int64_t even = c + 2 * j, odd = even + 1;
      dst[c + j] = even < k ? src[even] : 0.0f;
      dst[c + half + j] = odd < k ? src[odd] : 0.0f;
    }
}

// A's row in the order of lanes_tile: per group of 128 values, value 8d + i of the group at 16i + d.
void lane_permute_row(const float* src, int64_t k, int64_t kp, float* dst) {
  for (int64_t g = 0; g < kp; g += 128)
    for (int64_t i = 0; i < 8; ++i)
      for (int64_t d = 0; d < 16; ++d) {
        const int64_t j = g + 8 * d + i;
        dst[g + 16 * i + d] = j < k ? src[j] : 0.0f;
      }
}

void quantize_row(const float* a, int64_t blocks, int64_t block, int8_t* q, float* scale, int32_t* sum) {
  for (int64_t b = 0; b < blocks; ++b) {
    float amax = 0;
    for (int64_t j = 0; j < block; ++j) amax = std::max(amax, std::fabs(a[b * block + j]));
    const float s = amax / 127.0f;
    const float inverse = amax != 0.0f ? 127.0f / amax : 0.0f;  // as MLAS: 127 / max, not 1 / s (see header)
    scale[b] = s;
    int32_t total = 0;
    for (int64_t j = 0; j < block; ++j) {
      const float v = std::nearbyint(a[b * block + j] * inverse);  // half to even
      q[b * block + j] = static_cast<int8_t>(std::max(-127.0f, std::min(127.0f, v)));
      total += q[b * block + j];
    }
    sum[b] = total;
  }
}

#ifdef O2J_X86
// quantize_row with AVX2, the same arithmetic (max |a|, s = max / 127, a * (127 / max) rounded half to even), 8
// values a step: the scalar loop calls libm's nearbyint per value, about 2 ms of a 128-row prompt's product.
__attribute__((target("avx2,fma"))) void quantize_row_avx2(const float* a, int64_t blocks, int64_t block, int8_t* q,
                                                           float* scale, int32_t* sum) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 top = _mm256_set1_ps(127.0f), bottom = _mm256_set1_ps(-127.0f);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* x = a + b * block;
    __m256 m = _mm256_setzero_ps();
    for (int64_t j = 0; j < block; j += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + j), magnitude));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h), s = amax / 127.0f;
    const __m256 inverse = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    scale[b] = s;
    __m256i total = _mm256_setzero_si256();
    for (int64_t j = 0; j < block; j += 8) {
      __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j), inverse), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m256i i = _mm256_cvtps_epi32(_mm256_max_ps(bottom, _mm256_min_ps(top, v)));
      total = _mm256_add_epi32(total, i);
      const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(q + b * block + j), _mm_packs_epi16(words, words));
    }
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
    sum[b] = _mm_cvtsi128_si32(t);
  }
}
#endif

// ---- threads ----

// A chunk of work handed to another thread is at least this many multiply-adds (10-20 us on one core). Handing
// work to XLA's pool costs several us of CPU a call (waking a thread, its steal loop, the wait): with chunks of
// 64K, a [1, 512] x [512, 1408] product took 54-58 us of CPU on 2 threads against 38-42 on one, and a
// [1, 512] x [512, 512] one 25-32 against 14-16 (loaded 2-core machine, alternated in one process).
constexpr int64_t kMinChunk = 262144;

// Runs body(n0, n1) over [0, N) in chunks (4 per thread for balance, each of at least kMinChunk multiply-adds)
// on XLA's intra-op pool and the calling thread.
template <typename Body>
void parallel_rows(ffi::ThreadPool* pool, int64_t N, int64_t work_per_row, Body body) {
  const int64_t threads = pool ? std::max<int64_t>(1, pool->num_threads()) : 1;
  int64_t step = std::max<int64_t>(1, (kMinChunk + work_per_row - 1) / std::max<int64_t>(1, work_per_row));
  step = std::max(step, (N + 4 * threads - 1) / (4 * threads));
  step = std::min((step + 7) / 8 * 8, N);  // whole tiles of 8 rows of B (int8_rows_vnni)
  const int64_t chunks = (N + step - 1) / step;
  if (threads == 1 || chunks == 1) {
    body(0, N);
    return;
  }
  struct Shared {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    std::mutex mutex;
    std::condition_variable finished;
  };
  auto shared = std::make_shared<Shared>();
  auto run = [shared, chunks, step, N, body]() {
    for (;;) {
      const int64_t c = shared->next.fetch_add(1);
      if (c >= chunks) return;
      body(c * step, std::min(N, (c + 1) * step));
      if (shared->done.fetch_add(1) + 1 == chunks) {
        std::lock_guard<std::mutex> lock(shared->mutex);
        shared->finished.notify_all();
      }
    }
  };
  const int64_t helpers = std::min(threads, chunks) - 1;
  for (int64_t t = 0; t < helpers; ++t) {
    auto task = run;
    pool->Schedule(std::move(task));
  }
  run();
  std::unique_lock<std::mutex> lock(shared->mutex);
  shared->finished.wait(lock, [&] { return shared->done.load() == chunks; });
}

bool have_vnni() {
#ifdef O2J_X86
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vnni");
  return yes;
#else
  return false;
#endif
}

bool have_avx2() {
#ifdef O2J_X86
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
#else
  return false;
#endif
}

ffi::Error MatMulNBitsImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::U8> b,
                           ffi::Buffer<ffi::F32> scales, ffi::AnyBuffer zero_points,
                           ffi::ResultBuffer<ffi::F32> y, int64_t block_size, int64_t accuracy,
                           int64_t zp_kind, int64_t simd) {
  const auto a_dims = a.dimensions(), b_dims = b.dimensions();
  if (a_dims.size() != 2 || b_dims.size() < 2) return ffi::Error::InvalidArgument("A must be 2-D, B at least 2-D");
  if (block_size < 16 || (block_size & (block_size - 1)))
    return ffi::Error::InvalidArgument("block_size must be a power of two, at least 16");
  Problem p{};
  p.M = a_dims[0];
  p.K = a_dims[1];
  p.N = b_dims[0];
  p.block = block_size;
  p.blocks = (p.K + block_size - 1) / block_size;
  p.chunk = block_size >= 32 ? 32 : 16;
  if (static_cast<int64_t>(b.element_count()) != p.N * p.blocks * block_size / 2)
    return ffi::Error::InvalidArgument("B's row is not ceil(K / block_size) packed blocks");
  if (static_cast<int64_t>(scales.element_count()) != p.N * p.blocks)
    return ffi::Error::InvalidArgument("scales must hold N * ceil(K / block_size) values");
  p.b = b.typed_data();
  p.scales = scales.typed_data();
  p.zp_kind = static_cast<int>(zp_kind);
  if (zp_kind == 1) {
    if (zero_points.element_type() != ffi::U8 ||
        static_cast<int64_t>(zero_points.element_count()) != p.N * ((p.blocks + 1) / 2))
      return ffi::Error::InvalidArgument("packed zero points must be uint8 [N, ceil(blocks / 2)]");
    p.zp_packed = static_cast<const uint8_t*>(zero_points.untyped_data());
  } else if (zp_kind == 2) {
    if (zero_points.element_type() != ffi::F32 || static_cast<int64_t>(zero_points.element_count()) != p.N * p.blocks)
      return ffi::Error::InvalidArgument("float zero points must be float32 [N, blocks]");
    p.zp_float = static_cast<const float*>(zero_points.untyped_data());
  }
  p.y = y->typed_data();
  p.simd = !have_avx2() ? 0 : (simd >= 2 && have_vnni()) ? 2 : std::min<int64_t>(simd, 1);
  const bool int8 = accuracy == 4;
  if (int8 && zp_kind == 2) return ffi::Error::InvalidArgument("int8 compute needs integer zero points");

  const int64_t kp = p.blocks * p.block;
  // A's prepared copies live in buffers of the calling thread, kept between calls (a decode step makes dozens
  // of small calls); the pool's threads only read them while this call waits for them.
  thread_local std::vector<float> af;
  thread_local std::vector<int8_t> aq;
  thread_local std::vector<float> ascale;
  thread_local std::vector<int32_t> asum;
  // Float compute, few rows, K a multiple of 128, integer zero points: lanes_tile, with A in its lane order.
  const bool lanes = p.simd == 2 && !int8 && p.block >= 32 && p.M < kPanelRows && kp % 128 == 0 && zp_kind != 2;
  af.resize(p.M * kp);
  for (int64_t m = 0; m < p.M; ++m) {
    if (lanes)
      lane_permute_row(a.typed_data() + m * p.K, p.K, kp, af.data() + m * kp);
    else
      permute_row(a.typed_data() + m * p.K, p.K, kp, p.chunk, af.data() + m * kp);
  }
  if (int8) {
    aq.resize(p.M * kp);
    ascale.resize(p.M * p.blocks);
    asum.resize(p.M * p.blocks);
    // The permutation stays inside a chunk, and a chunk inside a block: the block's max and values are the same.
    for (int64_t m = 0; m < p.M; ++m) {
      const float* row = af.data() + m * kp;
#ifdef O2J_X86
      if (p.simd) {
        quantize_row_avx2(row, p.blocks, p.block, aq.data() + m * kp, ascale.data() + m * p.blocks,
                          asum.data() + m * p.blocks);
        continue;
      }
#endif
      quantize_row(row, p.blocks, p.block, aq.data() + m * kp, ascale.data() + m * p.blocks, asum.data() + m * p.blocks);
    }
    p.aq = aq.data();
    p.ascale = ascale.data();
    p.asum = asum.data();
  } else {
    p.af = af.data();
  }
  const Problem& q = p;
  parallel_rows(&pool, p.N, p.M * kp, [&q, int8, lanes](int64_t n0, int64_t n1) {
#ifdef O2J_X86
    if (lanes) return lanes_rows(q, n0, n1);
    if (q.simd == 2 && q.block >= 32 && q.M >= kPanelRows && !int8) return panel_product(q, q.af, n0, n1);
    if (q.simd && q.block >= 32) {
      if (!int8) return q.simd == 2 ? float_rows_avx512(q, n0, n1) : fused_rows<FloatAvx2>(q, n0, n1);
      return q.simd == 2 ? int8_rows_vnni(q, n0, n1) : fused_rows<Int8Avx2>(q, n0, n1);
    }
    if (int8 && q.simd) return rows_int8_avx2(q, n0, n1);
#endif
    if (int8) return rows_int8_plain(q, n0, n1);
    rows_float(q, n0, n1);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MatMulNBits4, MatMulNBitsImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("block_size")
                                  .Attr<int64_t>("accuracy")
                                  .Attr<int64_t>("zp_kind")
                                  .Attr<int64_t>("simd"));

// The Python module: the handler as a capsule (jax.ffi.register_ffi_target takes it) and whether this CPU
// runs the AVX2 loops.
static PyMethodDef kMethods[] = {{nullptr, nullptr, 0, nullptr}};
static PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_matmul_nbits", nullptr, -1, kMethods};

PyMODINIT_FUNC PyInit__matmul_nbits(void) {
  PyObject* module = PyModule_Create(&kModule);
  if (module == nullptr) return nullptr;
  PyObject* capsule = PyCapsule_New(reinterpret_cast<void*>(&MatMulNBits4), nullptr, nullptr);
  if (capsule == nullptr || PyModule_AddObject(module, "matmul_nbits4", capsule) < 0) {
    Py_XDECREF(capsule);
    Py_DECREF(module);
    return nullptr;
  }
  PyModule_AddIntConstant(module, "avx2", have_avx2() ? 1 : 0);
  PyModule_AddIntConstant(module, "vnni", have_vnni() ? 1 : 0);
  return module;
}
