// Torch-free unit test of the rowwise_linear kernel (ctest; scripts/sanitize.sh runs it under
// ASan/UBSan): float32, bfloat16 and float16 against a float64 reference, and bitwise row independence (row m
// of an M-row product equals the 1-row product of x[m]) for every M up to 13, every weight-row split
// point, K tails of every length mod 32 and partial weight blocks; the int8 and Q4_1 weight formats; the
// integer dot products of linear_i8.h (the build's path, AMX tiles from 32 rows on where the CPU has them
// (TRIFORCE_AMX=0: not), VNNI or portable, against the portable loop called directly: bitwise, and rows
// independent).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "check.h"
#include "triforce/linear.h"
#include "triforce/linear_i8.h"

using namespace triforce;
using namespace triforce::linear;

template <typename T>
void check_case(int64_t M, int64_t K, int64_t N, std::mt19937& g) {
  std::normal_distribution<float> d;
  std::vector<T> x(M * K), w(N * K);
  for (auto& v : x) v = from_float<T>(d(g));
  for (auto& v : w) v = from_float<T>(d(g));
  const int64_t nb = rowwise_linear_num_blocks(N);
  std::vector<T> out(M * N, from_float<T>(std::nanf(""))), row(N);
  // two "threads": blocks [0, s) and [s, nb) with a split point that depends on the case
  const int64_t s = nb == 0 ? 0 : (M * 7 + K) % (nb + 1);
  rowwise_linear_blocks<T, T>(x.data(), M, K, w.data(), N, out.data(), 0, s);
  rowwise_linear_blocks<T, T>(x.data(), M, K, w.data(), N, out.data(), s, nb);
  // error bound: |sum| <= sum |x w| * K * eps (fp32 accumulation), plus the output rounding
  const double eps_out = std::is_same_v<T, bf16> ? 1.0 / 256 : std::is_same_v<T, f16> ? 1.0 / 2048 : 1.2e-7;
  // below float16's normal range (6.1e-5) its spacing is fixed at 2^-24: an output there rounds by up to 2^-25
  const double tiny_out = std::is_same_v<T, f16> ? std::ldexp(1.0, -25) : 1e-30;
  for (int64_t m = 0; m < M; ++m) {
    rowwise_linear_blocks<T, T>(x.data() + m * K, 1, K, w.data(), N, row.data(), 0, nb);
    for (int64_t n = 0; n < N; ++n) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(to_float(x[m * K + k])) * double(to_float(w[n * K + k]));
        ref += p;
        mag += std::fabs(p);
      }
      const double got = to_float(out[m * N + n]);
      EXPECT(std::fabs(got - ref) <= mag * (K + 2) * 1.2e-7 + std::fabs(ref) * eps_out + tiny_out);
      float a = to_float(out[m * N + n]), b = to_float(row[n]);
      EXPECT(std::memcmp(&a, &b, 4) == 0);  // bitwise (and never NaN: every output was written)
    }
  }
}

// Weight-only int8: against the float64 product with the dequantised weights, and bitwise row
// independence, with the same split points as above.
void check_q8(int64_t M, int64_t K, int64_t N, std::mt19937& g) {
  std::normal_distribution<float> d;
  std::uniform_int_distribution<int> qd(-127, 127);
  const int64_t G = q8_groups(K);
  std::vector<float> x(M * K), s(N * G);
  std::vector<int8_t> q(N * K);
  for (auto& v : x) v = d(g);
  for (auto& v : q) v = static_cast<int8_t>(qd(g));
  for (auto& v : s) v = std::fabs(d(g)) / 127.f + 1e-4f;
  const int64_t nb = rowwise_linear_num_blocks(N);
  std::vector<float> out(M * N, std::nanf("")), row(N);
  const int64_t split = nb == 0 ? 0 : (M * 5 + K) % (nb + 1);
  rowwise_linear_q8_blocks(x.data(), M, K, q.data(), s.data(), N, out.data(), 0, split);
  rowwise_linear_q8_blocks(x.data(), M, K, q.data(), s.data(), N, out.data(), split, nb);
  for (int64_t m = 0; m < M; ++m) {
    rowwise_linear_q8_blocks(x.data() + m * K, 1, K, q.data(), s.data(), N, row.data(), 0, nb);
    for (int64_t n = 0; n < N; ++n) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double w = double(static_cast<float>(q[n * K + k]) * s[n * G + k / kQ8Group]);
        ref += double(x[m * K + k]) * w;
        mag += std::fabs(double(x[m * K + k]) * w);
      }
      EXPECT(std::fabs(out[m * N + n] - ref) <= mag * (K + 2) * 1.2e-7 + 1e-30);
      EXPECT(std::memcmp(&out[m * N + n], &row[n], 4) == 0);
    }
  }
}

// Q4_1 blocks: bitwise the float32 kernel on the dequantised weight (the same lanes, steps and tree), and
// bitwise row independence, with the same split points as above. Codes cover 0..15, scales include 0,
// negative minimums and subnormal-range d.
void check_q4_1(int64_t M, int64_t K, int64_t N, std::mt19937& g) {
  std::normal_distribution<float> d;
  std::uniform_int_distribution<int> byte(0, 255);
  const int64_t rb = q4_1_row_bytes(K);
  std::vector<float> x(M * K), w(N * K);
  std::vector<uint8_t> blocks(N * rb);
  for (auto& v : x) v = d(g);
  for (int64_t i = 0; i < N * (K / kQ4Block); ++i) {
    uint8_t* blk = blocks.data() + i * kQ4BlockBytes;
    const int kind = static_cast<int>(i % 5);
    const float scale = kind == 0 ? 0.f : kind == 1 ? 1e-40f : std::fabs(d(g)) / 15.f;
    const float mn = kind == 2 ? 0.f : -std::fabs(d(g));
    std::memcpy(blk, &scale, 4);
    std::memcpy(blk + 4, &mn, 4);
    for (int j = 8; j < kQ4BlockBytes; ++j) blk[j] = static_cast<uint8_t>(byte(g));
  }
  dequant_q4_1_rows(blocks.data(), N, K, w.data());
  const int64_t nb = rowwise_linear_num_blocks(N);
  std::vector<float> out(M * N, std::nanf("")), row(N), want(M * N);
  const int64_t split = nb == 0 ? 0 : (M * 3 + K) % (nb + 1);
  rowwise_linear_q4_1_blocks(x.data(), M, K, blocks.data(), N, out.data(), 0, split);
  rowwise_linear_q4_1_blocks(x.data(), M, K, blocks.data(), N, out.data(), split, nb);
  rowwise_linear_blocks<float, float>(x.data(), M, K, w.data(), N, want.data(), 0, nb);
  for (int64_t m = 0; m < M; ++m) {
    rowwise_linear_q4_1_blocks(x.data() + m * K, 1, K, blocks.data(), N, row.data(), 0, nb);
    for (int64_t n = 0; n < N; ++n) {
      EXPECT(std::memcmp(&out[m * N + n], &want[m * N + n], 4) == 0);
      EXPECT(std::memcmp(&out[m * N + n], &row[n], 4) == 0);
    }
  }
}

// linear_i8::quantize_rows (AVX-512 where compiled) against its scalar loop, bitwise: normal, tiny, subnormal,
// zero and huge values, exact ties (x / d = k + 0.5), a lone inf / NaN per block, both signs.
void check_quantize(std::mt19937& g) {
  namespace li = linear_i8;
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> kind(0, 9);
  for (int64_t M : {1, 3, 9})
    for (int64_t K : {32, 64, 576}) {
      const int64_t G = K / 32;
      std::vector<float> x(M * K);
      for (int64_t b = 0; b < M * G; ++b) {
        float* xb = x.data() + b * 32;
        const int k = kind(g);
        for (int i = 0; i < 32; ++i) {
          const float v = nd(g);
          xb[i] = k == 0 ? v * 1e-40f : k == 1 ? v * 1e30f : k == 2 ? 0.f : k == 3 ? -0.f : v;
        }
        if (k == 4) {  // ties: amax = 127 (d = 1), every value k + 0.5
          xb[0] = 127.f;
          for (int i = 1; i < 32; ++i) xb[i] = static_cast<float>(static_cast<int>(nd(g) * 30)) + 0.5f;
        }
        if (k == 5) xb[kind(g)] = (kind(g) % 2 ? -1 : 1) * INFINITY;
        if (k == 6) xb[31] = std::nanf("");
        if (k == 7) xb[3] = 0.f;  // a zero among normals
      }
      std::vector<int8_t> q1(M * K), q2(M * K);
      std::vector<float> d1(M * G), d2(M * G), s1(M * G), s2(M * G);
      std::vector<int32_t> a1(M * G), a2(M * G), b1(M * G), b2(M * G);
      li::quantize_rows(x.data(), M, K, q1.data(), d1.data(), s1.data(), a1.data(), b1.data());
      li::quantize_rows<true>(x.data(), M, K, q2.data(), d2.data(), s2.data(), a2.data(), b2.data());
      EXPECT(std::memcmp(q1.data(), q2.data(), q1.size()) == 0);
      EXPECT(std::memcmp(d1.data(), d2.data(), 4 * d1.size()) == 0);
      EXPECT(std::memcmp(s1.data(), s2.data(), 4 * s1.size()) == 0);
      EXPECT(a1 == a2 && b1 == b2);
    }
}

// linear_i8: x with an all-zero block, a block of ties and an inf; codes random; scales random float16
// (S = uint16_t) or float32 values with zeros and subnormals (E8M0Scale: exponents 100..139, and 0 and 1, whose
// scales are subnormal). groups<F> over a split of the groups against group_portable<F>.
template <linear_i8::Format F, typename S>
void check_i8(int64_t M, int64_t K, int64_t NG, std::mt19937& g) {
  namespace li = linear_i8;
  std::normal_distribution<float> d;
  std::uniform_int_distribution<int> byte(0, 255);
  const int64_t G = K / li::kBlock, N = NG * li::kGroup;
  std::vector<float> x(M * K);
  for (auto& v : x) v = d(g);
  if (M > 1) std::fill(x.begin() + K, x.begin() + K + 32, 0.f);
  if (M > 2)
    for (int i = 0; i < 32; ++i) x[2 * K + i] = static_cast<float>(i) - 15.5f;
  if (M > 3) x[3 * K + K - 1] = INFINITY;
  if (M > 4)  // subnormal inputs: dx subnormal (1 / dx would overflow)
    for (int i = 0; i < 32; ++i) x[4 * K + i] *= 1e-39f;
  std::vector<uint8_t> codes(NG * li::group_code_bytes<F>(G));  // (grid forms: random grids, -128..127)
  for (auto& c : codes) c = static_cast<uint8_t>(byte(g));
  std::vector<S> scales(NG * li::GroupScales<F, S>::elems(G));
  for (size_t i = 0; i < scales.size(); ++i) {
    const float v = i % 7 == 0 ? 0.f : i % 11 == 0 ? 3e-6f : (i % 2 ? -1.f : 1.f) * std::fabs(d(g)) * 0.02f;
    if constexpr (std::is_same_v<S, float>)
      scales[i] = i % 13 == 0 ? 1e-41f : v;  // a subnormal float32 scale too
    else if constexpr (std::is_same_v<S, uint16_t>)
      scales[i] = from_float<f16>(v).bits;
    else if constexpr (std::is_same_v<S, li::E8M0Scale>)
      scales[i].byte = static_cast<uint8_t>(i % 17 == 0 ? i % 2 : 100 + byte(g) % 40);
    else  // SuperScale: random bytes, then finite float16 bases (with zeros and subnormals)
      scales[i].byte = static_cast<uint8_t>(byte(g));
  }
  if constexpr (std::is_same_v<S, li::SuperScale>)
    for (int64_t sb = 0; sb < NG * G / li::kSuperBlocks; ++sb)
      for (int64_t i = 0; i < 16 * li::super_bases<F>(); ++i) {
        const float v = i % 7 == 0 ? 0.f : i % 11 == 0 ? 3e-6f : (i % 2 ? -1.f : 1.f) * std::fabs(d(g)) * 0.02f;
        const uint16_t h = from_float<f16>(v).bits;
        std::memcpy(&scales[sb * li::super_bytes<F>() + 2 * i], &h, 2);
      }
  std::vector<int8_t> q(M * K);
  std::vector<float> dx(M * G), sm(M * G);
  std::vector<int32_t> sx(M * G), sx0(M * G);
  li::quantize_rows(x.data(), M, K, q.data(), dx.data(), sm.data(), sx.data(), sx0.data());
  for (int64_t i = 0; i < M * G; ++i) {  // sx0: the first 16 codes' sum
    int want0 = 0;
    for (int k = 0; k < 16; ++k) want0 += q[i * 32 + k];
    EXPECT(sx0[i] == want0);
  }
  std::vector<float> out(M * N, std::nanf("")), want(M * N), row(N);
  const int64_t split = (M * 5 + K) % (NG + 1);
  li::groups<F>(q.data(), dx.data(), sm.data(), sx.data(), sx0.data(), M, K, codes.data(), scales.data(), N, out.data(),
                0, split);
  li::groups<F>(q.data(), dx.data(), sm.data(), sx.data(), sx0.data(), M, K, codes.data(), scales.data(), N, out.data(),
                split, NG);
  for (int64_t ng = 0; ng < NG; ++ng)
    li::group_portable<F>(q.data(), dx.data(), sm.data(), sx.data(), sx0.data(), M, K,
                          codes.data() + ng * li::group_code_bytes<F>(G),
                          scales.data() + ng * li::GroupScales<F, S>::elems(G),
                          want.data() + ng * li::kGroup, N);
  for (int64_t m = 0; m < M; ++m) {
    li::groups<F>(q.data() + m * K, dx.data() + m * G, sm.data() + m * G, sx.data() + m * G, sx0.data() + m * G, 1, K,
                  codes.data(), scales.data(), N, row.data(), 0, NG);
    for (int64_t n = 0; n < N; ++n) {
      EXPECT(std::memcmp(&out[m * N + n], &want[m * N + n], 4) == 0);
      EXPECT(std::memcmp(&out[m * N + n], &row[n], 4) == 0);
      EXPECT(std::isnan(out[m * N + n]) == (m == 3));  // the inf's block: NaN, the other rows finite
    }
  }
}

int main() {
  std::mt19937 g(1234);
  int cases = 0;
  for (int64_t M : {1, 2, 4, 5, 9})
    for (int64_t K : {1, 15, 16, 17, 31, 32, 33, 100, 576})
      for (int64_t N : {1, 5, 6, 7, 13}) {
        check_q8(M, K, N, g);
        ++cases;
      }
  for (int64_t M : {1, 2, 3, 4, 5, 9})
    for (int64_t K : {32, 64, 96, 576})
      for (int64_t N : {1, 5, 6, 7, 13, 17}) {
        check_q4_1(M, K, N, g);
        ++cases;
      }
  for (int i = 0; i < 20; ++i, ++cases) check_quantize(g);
  for (int64_t M : {1, 2, 3, 4, 5, 8, 9, 16, 32, 33, 35})  // 32 on: the AMX tiles, where the CPU has them
    for (int64_t K : {32, 64, 576})
      for (int64_t NG : {1, 2, 5}) {
        check_i8<linear_i8::Format::Q4_1, uint16_t>(M, K, NG, g);
        check_i8<linear_i8::Format::Q8_0, uint16_t>(M, K, NG, g);
        check_i8<linear_i8::Format::Q4_1, float>(M, K, NG, g);
        check_i8<linear_i8::Format::Q8_0, float>(M, K, NG, g);
        check_i8<linear_i8::Format::Q8_0_16, uint16_t>(M, K, NG, g);
        check_i8<linear_i8::Format::Q8_0_16, float>(M, K, NG, g);
        check_i8<linear_i8::Format::Q5_1, uint16_t>(M, K, NG, g);
        check_i8<linear_i8::Format::Q5_1, float>(M, K, NG, g);
        check_i8<linear_i8::Format::IQ4_NL, uint16_t>(M, K, NG, g);
        check_i8<linear_i8::Format::IQ4_NL, float>(M, K, NG, g);
        check_i8<linear_i8::Format::Q6_16, uint16_t>(M, K, NG, g);
        check_i8<linear_i8::Format::Q6_16, float>(M, K, NG, g);
        check_i8<linear_i8::Format::Q4_1_16, uint16_t>(M, K, NG, g);
        check_i8<linear_i8::Format::Q4_1_16, float>(M, K, NG, g);
        check_i8<linear_i8::Format::Q2_16, uint16_t>(M, K, NG, g);
        check_i8<linear_i8::Format::Q2_16, float>(M, K, NG, g);
        check_i8<linear_i8::Format::Q3_16, uint16_t>(M, K, NG, g);
        check_i8<linear_i8::Format::Q3_16, float>(M, K, NG, g);
        check_i8<linear_i8::Format::MXFP4, linear_i8::E8M0Scale>(M, K, NG, g);
        check_i8<linear_i8::Format::GRID, uint16_t>(M, K, NG, g);
        check_i8<linear_i8::Format::GRID, float>(M, K, NG, g);
        check_i8<linear_i8::Format::GRID_16, float>(M, K, NG, g);
        check_i8<linear_i8::Format::GRID_16, uint16_t>(M, K, NG, g);
        cases += 23;
      }
  for (int64_t M : {1, 2, 3, 4, 5, 9, 16, 21, 33})  // super-block scales: K a multiple of 256
    for (int64_t K : {256, 512, 2304})
      for (int64_t NG : {1, 3}) {
        check_i8<linear_i8::Format::Q4_1, linear_i8::SuperScale>(M, K, NG, g);
        check_i8<linear_i8::Format::Q5_1, linear_i8::SuperScale>(M, K, NG, g);
        check_i8<linear_i8::Format::Q8_0, linear_i8::SuperScale>(M, K, NG, g);
        check_i8<linear_i8::Format::Q8_0_16, linear_i8::SuperScale>(M, K, NG, g);
        check_i8<linear_i8::Format::IQ4_NL, linear_i8::SuperScale>(M, K, NG, g);
        check_i8<linear_i8::Format::Q6_16, linear_i8::SuperScale>(M, K, NG, g);
        check_i8<linear_i8::Format::Q4_1_16, linear_i8::SuperScale>(M, K, NG, g);
        check_i8<linear_i8::Format::Q2_16, linear_i8::SuperScale>(M, K, NG, g);
        check_i8<linear_i8::Format::Q3_16, linear_i8::SuperScale>(M, K, NG, g);
        cases += 9;
      }
  for (int64_t M : {1, 2, 3, 4, 5, 7, 8, 9, 13})
    for (int64_t K : {1, 15, 16, 17, 31, 32, 33, 64, 100, 576})
      for (int64_t N : {1, 5, 6, 7, 12, 13, 50}) {
        check_case<float>(M, K, N, g);
        check_case<bf16>(M, K, N, g);
        check_case<f16>(M, K, N, g);
        cases += 3;
      }
  for (int64_t K = 1; K <= 70; ++K) {  // every tail length of each element type
    check_case<float>(3, K, 9, g);
    check_case<bf16>(3, K, 9, g);
    check_case<f16>(3, K, 9, g);
    cases += 3;
  }
  if (failures == 0) std::printf("test_linear: ok (%d cases)\n", cases);
  return failures == 0 ? 0 : 1;
}
