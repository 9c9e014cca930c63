// x W^T for quantized W with 8-bit activations on AVX2 (the W4A8 / W8A8 arithmetic llama.cpp uses on this CPU kind).
//
// Why hand-written: torch's CPU int4 kernel (_weight_int4pack_mm_for_cpu) widens every weight to float; on an
// AVX2-only CPU it ran a 1.5B model's one-token step in ~500 ms where llama.cpp takes ~55 ms. No library installable
// here multiplies GGUF-style group-quantized weights by int8 activations on AVX2 (torchao's da8w4 kernel needs AVX512
// VNNI / AMX; fbgemm's dynamic linear has one scale per output row). See model/qkernel.py for the formats.
//
// Activations: each row is quantized per block of 32 to int8 with scale dx = max|x| / 127 (round to nearest).
// Weights, per output row, per group:
//   q4: u in 0..15, two per byte (byte i of a group: element i in the low nibble, element i + 16 in the high),
//       w = d * u + c  (groups of 32)
//   q8: s int8, w = d * s (+ c when given; groups of 32, or 16 without c: GGUF Q6_K's sub-blocks)
// y[m, n] = sum_g d[n,g] dx[m,g] (u . xq) + c[n,g] dx[m,g] sum(xq). Each output is computed from its own row in a fixed
// order whatever the number of rows: a tree's rows get exactly the logits a one-row step would.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <algorithm>
#include <cstring>
#include <vector>

namespace {

constexpr int BLOCK = 32;

struct Quantized {
  std::vector<int8_t> q;   // [M, K]
  std::vector<float> d;    // [M, K / 32]
  std::vector<float> s;    // [M, K / 32]: d * sum(q)
};

Quantized quantize_rows(const float* x, int64_t M, int64_t K) {
  const int64_t B = K / BLOCK;
  Quantized out{std::vector<int8_t>(M * K), std::vector<float>(M * B), std::vector<float>(M * B)};
  at::parallel_for(0, M * B, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* v = x + i * BLOCK;
      float amax = 0.f;
      for (int k = 0; k < BLOCK; ++k) amax = std::max(amax, std::fabs(v[k]));
      const float d = amax / 127.f;
      const float id = d > 0.f ? 1.f / d : 0.f;
      int sum = 0;
      int8_t* q = out.q.data() + i * BLOCK;
      for (int k = 0; k < BLOCK; ++k) {
        const int r = static_cast<int>(std::nearbyint(v[k] * id));
        q[k] = static_cast<int8_t>(r);
        sum += r;
      }
      out.d[i] = d;
      out.s[i] = d * static_cast<float>(sum);
    }
  });
  return out;
}

inline float hsum(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

void check(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& d, int64_t K) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: contiguous float32 [M, K]");
  TORCH_CHECK(K % BLOCK == 0, "K must be a multiple of 32");
  TORCH_CHECK(w.is_contiguous() && d.is_contiguous() && d.scalar_type() == torch::kFloat32, "weights: contiguous");
}

}  // namespace

// The offsets' share of one output: sum_g c[g] * sx[g], the same vector order for every caller.
inline float offset_dot(const float* c, const float* sx, int64_t G) {
  __m256 acc = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 8 <= G; g += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(c + g), _mm256_loadu_ps(sx + g), acc);
  float sum = hsum(acc);
  for (; g < G; ++g) sum += c[g] * sx[g];
  return sum;
}

constexpr int CHUNK = 8;  // groups whose scales d * dx are formed in one vector multiply

// One weight row against R activation rows at a time: the weights are unpacked once and used R times (a tree's rows
// then cost a fraction of a one-row step each). Per row the operations and their order are the same for every R.
template <int R>
inline void q4_rows(const uint8_t* wn, const float* dn, const float* cn, int64_t G, int64_t K, const Quantized& a,
                    int64_t m0, float* out, int64_t N, int64_t n) {
  const __m128i low = _mm_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][2];
  alignas(32) float scale[R][CHUNK];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t g0 = 0; g0 < G; g0 += CHUNK) {
    const int64_t count = std::min<int64_t>(CHUNK, G - g0);
    for (int r = 0; r < R; ++r) {
      const float* dx = a.d.data() + (m0 + r) * G + g0;
      if (count == CHUNK) {
        _mm256_store_ps(scale[r], _mm256_mul_ps(_mm256_loadu_ps(dn + g0), _mm256_loadu_ps(dx)));
      } else {
        for (int64_t j = 0; j < count; ++j) scale[r][j] = dn[g0 + j] * dx[j];
      }
    }
    auto group = [&](int64_t j, int k) __attribute__((always_inline)) {
      const int64_t g = g0 + j;
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wn + g * 16));
      const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), low), _mm_and_si128(b, low));
      for (int r = 0; r < R; ++r) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q.data() + (m0 + r) * K + g * 32));
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), ones);
        acc[r][k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&scale[r][j]), acc[r][k]);
      }
    };
    int64_t j = 0;
    for (; j + 1 < count; j += 2) group(j, 0), group(j + 1, 1);  // constant accumulator indices: registers
    if (j < count) group(j, 0);
  }
  for (int r = 0; r < R; ++r)
    out[(m0 + r) * N + n] = hsum(_mm256_add_ps(acc[r][0], acc[r][1])) + offset_dot(cn, a.s.data() + (m0 + r) * G, G);
}

template <int R>
inline void q8_rows(const int8_t* wn, const float* dn, const float* cn, int64_t G, int64_t K, int64_t per_block,
                    const Quantized& a, int64_t m0, float* out, int64_t N, int64_t n) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][2];
  alignas(32) float scale[R][2 * CHUNK];  // per group: the scale of elements 0-15, then of 16-31
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t g0 = 0; g0 < G; g0 += CHUNK) {
    const int64_t count = std::min<int64_t>(CHUNK, G - g0);
    for (int r = 0; r < R; ++r) {
      const float* dx = a.d.data() + (m0 + r) * G + g0;
      for (int64_t j = 0; j < count; ++j) {
        scale[r][2 * j] = dn[(g0 + j) * per_block] * dx[j];
        scale[r][2 * j + 1] = dn[(g0 + j) * per_block + per_block - 1] * dx[j];
      }
    }
    auto group = [&](int64_t j, int k) __attribute__((always_inline)) {
      const int64_t g = g0 + j;
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wn + g * 32));
      const __m256i wabs = _mm256_sign_epi8(w, w);
      for (int r = 0; r < R; ++r) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q.data() + (m0 + r) * K + g * 32));
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, _mm256_sign_epi8(x, w)), ones);
        // lanes 0-3 hold elements 0-15, lanes 4-7 elements 16-31
        const __m256 sc = _mm256_set_m128(_mm_broadcast_ss(&scale[r][2 * j + 1]), _mm_broadcast_ss(&scale[r][2 * j]));
        acc[r][k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc[r][k]);
      }
    };
    int64_t j = 0;
    for (; j + 1 < count; j += 2) group(j, 0), group(j + 1, 1);
    if (j < count) group(j, 0);
  }
  for (int r = 0; r < R; ++r) {
    const float offset = cn ? offset_dot(cn, a.s.data() + (m0 + r) * G, G) : 0.f;
    out[(m0 + r) * N + n] = hsum(_mm256_add_ps(acc[r][0], acc[r][1])) + offset;
  }
}

constexpr int TILE = 4;

// x float32 [M, K]; u uint8 [N, K / 2] (q4 layout above); d, c float32 [N, K / 32]  ->  float32 [M, N]
torch::Tensor q4_linear(torch::Tensor x, torch::Tensor u, torch::Tensor d, torch::Tensor c) {
  const int64_t M = x.size(0), K = x.size(1), N = u.size(0), G = K / BLOCK;
  check(x, u, d, K);
  TORCH_CHECK(u.size(1) == K / 2 && d.size(1) == G && c.sizes() == d.sizes(), "q4 weight shapes");
  const Quantized a = quantize_rows(x.data_ptr<float>(), M, K);
  auto y = torch::empty({M, N}, x.options());
  float* out = y.data_ptr<float>();
  const uint8_t* W = u.data_ptr<uint8_t>();
  const float* D = d.data_ptr<float>();
  const float* C = c.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const uint8_t* wn = W + n * (K / 2);
      int64_t m = 0;
      for (; m + TILE <= M; m += TILE) q4_rows<TILE>(wn, D + n * G, C + n * G, G, K, a, m, out, N, n);
      switch (M - m) {
        case 3: q4_rows<3>(wn, D + n * G, C + n * G, G, K, a, m, out, N, n); break;
        case 2: q4_rows<2>(wn, D + n * G, C + n * G, G, K, a, m, out, N, n); break;
        case 1: q4_rows<1>(wn, D + n * G, C + n * G, G, K, a, m, out, N, n); break;
        default: break;
      }
    }
  });
  return y;
}

// x float32 [M, K]; s int8 [N, K]; d float32 [N, K / group] (group 16 or 32); c float32 [N, K / 32] or empty
torch::Tensor q8_linear(torch::Tensor x, torch::Tensor s, torch::Tensor d, torch::Tensor c, int64_t group) {
  const int64_t M = x.size(0), K = x.size(1), N = s.size(0), G = K / BLOCK;
  check(x, s, d, K);
  TORCH_CHECK(group == 16 || group == 32, "q8 groups of 16 or 32");
  TORCH_CHECK(s.size(1) == K && d.size(1) == K / group, "q8 weight shapes");
  const bool has_c = c.numel() > 0;
  TORCH_CHECK(!has_c || (group == 32 && c.sizes() == d.sizes()), "q8 offsets need groups of 32");
  const Quantized a = quantize_rows(x.data_ptr<float>(), M, K);
  auto y = torch::empty({M, N}, x.options());
  float* out = y.data_ptr<float>();
  const int8_t* W = s.data_ptr<int8_t>();
  const float* D = d.data_ptr<float>();
  const float* C = has_c ? c.data_ptr<float>() : nullptr;
  const int64_t per_block = BLOCK / group;  // weight groups in one activation block
  const int64_t dg = K / group;
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const int8_t* wn = W + n * K;
      const float* cn = C ? C + n * G : nullptr;
      int64_t m = 0;
      for (; m + TILE <= M; m += TILE) q8_rows<TILE>(wn, D + n * dg, cn, G, K, per_block, a, m, out, N, n);
      switch (M - m) {
        case 3: q8_rows<3>(wn, D + n * dg, cn, G, K, per_block, a, m, out, N, n); break;
        case 2: q8_rows<2>(wn, D + n * dg, cn, G, K, per_block, a, m, out, N, n); break;
        case 1: q8_rows<1>(wn, D + n * dg, cn, G, K, per_block, a, m, out, N, n); break;
        default: break;
      }
    }
  });
  return y;
}

// GGUF Q6_K as the file holds it (0.82 bytes a weight, where int8 in groups of 16 took 1.25): per group of 32, the
// low nibbles as q4 (16 bytes), the two high bits in 8 bytes (byte j: elements j, j + 8, j + 16, j + 24 at bits 0-1,
// 2-3, 4-5, 6-7), an int8 scale per 16 and a float d per 256: w = d sc (q - 32).
template <int R>
inline void q6_rows(const uint8_t* lo, const uint8_t* hi, const int8_t* sc, const float* dn, int64_t G, int64_t K,
                    const Quantized& a, int64_t m0, float* out, int64_t N, int64_t n) {
  const __m128i low = _mm_set1_epi8(0x0F);
  const __m256i two = _mm256_set1_epi8(0x03);
  const __m256i shifts = _mm256_set_epi64x(6, 4, 2, 0);
  const __m256i m32 = _mm256_set1_epi8(32);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][2];
  alignas(32) float scale[R][2 * CHUNK];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t g0 = 0; g0 < G; g0 += CHUNK) {
    const int64_t count = std::min<int64_t>(CHUNK, G - g0);
    for (int r = 0; r < R; ++r) {
      const float* dx = a.d.data() + (m0 + r) * G + g0;
      for (int64_t j = 0; j < 2 * count; ++j)
        scale[r][j] = dn[(2 * g0 + j) / 16] * static_cast<float>(sc[2 * g0 + j]) * dx[j / 2];
    }
    auto group = [&](int64_t j, int k) __attribute__((always_inline)) {
      const int64_t g = g0 + j;
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lo + g * 16));
      int64_t h;
      std::memcpy(&h, hi + g * 8, 8);
      const __m256i high = _mm256_and_si256(_mm256_srlv_epi64(_mm256_set1_epi64x(h), shifts), two);
      const __m256i q = _mm256_or_si256(
          _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), low), _mm_and_si128(b, low)),
          _mm256_slli_epi16(high, 4));  // high < 4: shifting 16-bit lanes cannot carry into the next byte
      const __m256i w = _mm256_sub_epi8(q, m32);
      const __m256i wabs = _mm256_sign_epi8(w, w);
      for (int r = 0; r < R; ++r) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q.data() + (m0 + r) * K + g * 32));
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, _mm256_sign_epi8(x, w)), ones);
        const __m256 s = _mm256_set_m128(_mm_broadcast_ss(&scale[r][2 * j + 1]), _mm_broadcast_ss(&scale[r][2 * j]));
        acc[r][k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[r][k]);
      }
    };
    int64_t j = 0;
    for (; j + 1 < count; j += 2) group(j, 0), group(j + 1, 1);
    if (j < count) group(j, 0);
  }
  for (int r = 0; r < R; ++r) out[(m0 + r) * N + n] = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
}

// x float32 [M, K]; lo uint8 [N, K / 2]; hi uint8 [N, K / 4]; sc int8 [N, K / 16]; d float32 [N, K / 256]
torch::Tensor q6_linear(torch::Tensor x, torch::Tensor lo, torch::Tensor hi, torch::Tensor sc, torch::Tensor d) {
  const int64_t M = x.size(0), K = x.size(1), N = lo.size(0), G = K / BLOCK;
  check(x, lo, d, K);
  TORCH_CHECK(K % 256 == 0 && lo.size(1) == K / 2 && hi.size(1) == K / 4 && sc.size(1) == K / 16 &&
              d.size(1) == K / 256 && hi.is_contiguous() && sc.is_contiguous(), "q6 weight shapes");
  const Quantized a = quantize_rows(x.data_ptr<float>(), M, K);
  auto y = torch::empty({M, N}, x.options());
  float* out = y.data_ptr<float>();
  const uint8_t* L = lo.data_ptr<uint8_t>();
  const uint8_t* H = hi.data_ptr<uint8_t>();
  const int8_t* S = sc.data_ptr<int8_t>();
  const float* D = d.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const uint8_t* ln = L + n * (K / 2);
      const uint8_t* hn = H + n * (K / 4);
      const int8_t* sn = S + n * (K / 16);
      const float* dn = D + n * (K / 256);
      int64_t m = 0;
      for (; m + TILE <= M; m += TILE) q6_rows<TILE>(ln, hn, sn, dn, G, K, a, m, out, N, n);
      switch (M - m) {
        case 3: q6_rows<3>(ln, hn, sn, dn, G, K, a, m, out, N, n); break;
        case 2: q6_rows<2>(ln, hn, sn, dn, G, K, a, m, out, N, n); break;
        case 1: q6_rows<1>(ln, hn, sn, dn, G, K, a, m, out, N, n); break;
        default: break;
      }
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("q4_linear", &q4_linear, "x W^T, W 4-bit in groups of 32, activations int8");
  m.def("q8_linear", &q8_linear, "x W^T, W int8 in groups of 16 or 32, activations int8");
  m.def("q6_linear", &q6_linear, "x W^T, W as GGUF Q6_K (6 bits, a scale per 16), activations int8");
}
