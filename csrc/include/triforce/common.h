// Torch-free scalar helpers shared by the CPU kernels (and usable from host code of CUDA files).
// fp16 / bf16 are carried as raw 16-bit patterns so these headers need neither ATen nor CUDA.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__AVX512F__) || defined(__F16C__)
// GCC 12 warns, wherever an AVX-512 intrinsic is inlined, that the intrinsic's own pass-through operand
// (_mm512_undefined_*) is, or may be, used uninitialized: ~400 false warnings per build, which GCC 13 no
// longer emits. They are silenced for the header's own lines, and only when this is its first inclusion: a
// translation unit includes this header (or one that includes it) before ATen, which includes
// <immintrin.h> too.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#if defined(__AMX_TILE__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define TRIFORCE_AMX_TILES 1
#endif

// Elementwise loops that round each operation on its own, as ATen's kernels do: no contraction of a product and
// a sum into an FMA, which would round once instead of twice.
#if defined(__GNUC__) && !defined(__clang__)
#define TRIFORCE_NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#else  // clang contracts only within one expression (-ffp-contract=on), and the products are statements
#define TRIFORCE_NO_FP_CONTRACT
#endif

namespace triforce {

#if defined(TRIFORCE_AMX_TILES)
// ---- the AMX tiles (Intel Sapphire Rapids and later): what the kernels that use them share ----------
// Whether this process uses the tiles: the CPU has them and Linux grants their data to the process (asked
// once: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)), unless TRIFORCE_AMX=0 (read once). Each
// kernel also asks for the tile instructions it runs (AMX-BF16, AMX-INT8).
inline bool amx_tiles_granted() {
  static const bool on = [] {
    const char* env = std::getenv("TRIFORCE_AMX");
    if (env != nullptr && std::strcmp(env, "0") == 0) return false;
    if (!__builtin_cpu_supports("amx-tile")) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return on;
}

// ldtilecfg's 64-byte form, palette 1: tile t has rows[t] rows of colsb[t] bytes (unused tiles 0 x 0).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Loads a configuration. A kernel configures the tiles for the span of its work and releases them at its end
// (_tile_release), not once per thread: other code in the process (oneDNN's AMX kernels under torch's matmuls)
// releases the tiles after its own use, and a tile instruction without a configuration faults.
inline void amx_load_config(const TileConfig& c) {
  asm volatile("" : : "r"(&c) : "memory");  // GCC 12 models ldtilecfg's operand as one byte
  _tile_loadconfig(&c);
}
#endif

// Parallel regions cost a wake-up. Under OMP_WAIT_POLICY=PASSIVE (set by `import triforce`, see
// triforce/_threads.py) an idle OpenMP worker sleeps, and waking it took ~70 us per region on this
// project's 2-vCPU VM (a 0.44 MB linear: 7 us on one thread, 79 us on two): a SmolLM2-135M decode step
// opens ~270 regions (7 linears and 2 attention regions per layer) and ran 25-50% slower on 2 threads
// than on one (docs/development.md, "CPU threads"). So, when workers sleep, the kernels run work
// estimated below 4 MiB on the calling thread (no region). The estimate is the bytes streamed or, when
// compute-bound, about one byte per multiply-add of a row (one core streams ~25 GB/s and does ~28 G fp32
// multiply-adds per second). Workers that spin (OMP_WAIT_POLICY unset or ACTIVE, or GOMP_SPINCOUNT
// set) wake in a few us: no threshold. TRIFORCE_PARALLEL_MIN_BYTES overrides both (0: every region
// opens). Read once, from the environment of the first call (which may differ from what the OpenMP
// runtime read when it loaded: set the variables before importing torch). Results never depend on it:
// each output gets the same arithmetic whichever thread computes it.
// Inside a cached forward's thread team (team.h: one region for all layers, spinning workers) the linears
// and the attention use the team's threshold instead, Team::kMinBytes (worth_parallel_here).
inline int64_t parallel_min_bytes() {
  static const int64_t v = [] {
    const auto env = [](const char* name) {
      const char* e = std::getenv(name);
      return (e != nullptr && *e != '\0') ? e : nullptr;
    };
    if (const char* e = env("TRIFORCE_PARALLEL_MIN_BYTES")) {
      char* end = nullptr;
      const long long n = std::strtoll(e, &end, 10);
      if (*end == '\0' && n >= 0) return static_cast<int64_t>(n);
    }
    const char* policy = env("OMP_WAIT_POLICY");
    const char* spin = env("GOMP_SPINCOUNT");
    const bool passive = policy != nullptr && (policy[0] == 'p' || policy[0] == 'P');
    return passive && (spin == nullptr || std::strcmp(spin, "0") == 0) ? int64_t(4) << 20 : int64_t(0);
  }();
  return v;
}

inline bool worth_parallel(int64_t work_bytes) { return work_bytes >= parallel_min_bytes(); }

struct f16 { uint16_t bits; };
struct bf16 { uint16_t bits; };

inline float to_float(float x) { return x; }

inline float to_float(bf16 x) {
  uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float to_float(f16 x) {
  // IEEE binary16 -> binary32, exact (subnormals, inf and NaN included).
  uint32_t h = x.bits, sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { ++e; man <<= 1; } while ((man & 0x400u) == 0);
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// float -> 16-bit with round-to-nearest-even, matching torch's .to(dtype).
template <typename T> inline T from_float(float f);
template <> inline float from_float<float>(float f) { return f; }

template <> inline bf16 from_float<bf16>(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

template <> inline f16 from_float<f16>(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f16{static_cast<uint16_t>(sign | 0x7e00u)};  // NaN
  if (a >= 0x477ff000u) return f16{static_cast<uint16_t>(sign | 0x7c00u)};  // overflow -> inf
  if (a < 0x38800000u) {  // result is subnormal or zero: add 0.5 (as float) and take the low bits
    float g;
    std::memcpy(&g, &a, 4);
    g += 0.5f;
    uint32_t r;
    std::memcpy(&r, &g, 4);
    return f16{static_cast<uint16_t>(sign | (r - 0x3f000000u))};
  }
  uint32_t odd = (a >> 13) & 1u;
  a += 0xc8000fffu + odd;  // rebias exponent (-112 << 23) and round to nearest even
  return f16{static_cast<uint16_t>(sign | (a >> 13))};
}

// exp(x) in float, vectorisable (std::exp is a scalar libm call: ~20% of the scoring time at
// C = 16K, Hq = 32 before this). Cephes' expf: x = k ln2 + r with a two-constant Cody-Waite split,
// |r| <= ln2 / 2, degree-6 minimax polynomial; ~1 ulp, like the Sleef exp PyTorch uses. x < -87.3
// (including -inf) gives 0; NaN propagates through r and p. One definition of the reduction and the
// polynomial (exp_reduced) serves the scalar exp_f32 and its AVX-512 form below.
constexpr float kExpLog2e = 1.44269504088896341f;
constexpr float kExpMin = -87.33654475f;  // below this, e^x is under float's smallest normal: 0

// e^(x - k ln2) for k = round(x / ln2), on a float or on a GCC/Clang vector of floats (arithmetic with
// a scalar operand broadcasts it).
template <typename V>
inline V exp_reduced(V x, V k) {
  const V r = x - k * 0.693359375f + k * 2.12194440e-4f;
  V p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}

// a * b + c: one rounding where the CPU fuses (written out, so no path's bits hang on the compiler's contraction),
// else two (and nothing to contract)
inline float madd(float a, float b, float c) {
#ifdef __FMA__
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

inline float exp_f32(float x) {
  // round to nearest by the 1.5 * 2^23 trick (std::floor does not vectorise here); x < -87.3
  // and NaN are handled below, so |x * log2e| < 2^22 wherever the result is used.
  const float k = (x * kExpLog2e + 12582912.f) - 12582912.f;
  const float p = exp_reduced(x, k);
  // Clamp written so that NaN lands on -127 (std::min / std::max pass NaN through, and converting NaN
  // to int is undefined); the result is still NaN, through p.
  const float kc = k > -127.f ? (k < 127.f ? k : 127.f) : -127.f;
  const int32_t ki = static_cast<int32_t>(kc);
  const uint32_t bits = static_cast<uint32_t>(ki + 127) << 23;
  const float scale = __builtin_bit_cast(float, bits);  // (memcpy here blocks vectorisation)
  return x < kExpMin ? 0.f : p * scale;
}

#if defined(__AVX512F__)
// exp_f32 on 16 lanes: k by roundscale, 2^k by scalef. NaN propagates (max returns its second operand,
// x, when either is NaN; NaN is not < kExpMin).
inline __m512 exp_f32(__m512 x) {
  const __m512 lo = _mm512_set1_ps(kExpMin);
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  const __m512 xc = _mm512_max_ps(lo, x);
  const __m512 k = _mm512_roundscale_ps(xc * kExpLog2e, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~tiny), _mm512_scalef_ps(exp_reduced(xc, k), k));
}
#endif

#if defined(__AVX512F__)
// 16 consecutive elements in fp32: a load, bf16 -> fp32 by a 16-bit shift, fp16 -> fp32 in hardware.
// The AVX-512 dot and P V paths read bf16/fp16 caches in place through these (no converted tile).
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const bf16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 load16(const f16* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Lane j of the result = the sum of v[j]'s 16 lanes, for 16 vectors at once: a transpose-and-add tree
// (8 + 4 + 2 + 1 adds and two shuffles per add) instead of 16 separate horizontal reductions, each a
// chain of dependent adds.
inline __m512 hsum16_avx512(const __m512* v) {
  __m512 a[8], b[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3] for (x, y) = v[2i], v[2i+1]
    a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: the lane's sums of v[4i], ..., v[4i + 3]
    const __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
    b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // across the four 128-bit lanes: pairs of lanes, then the pairs' sums; lane block i = v[4i .. 4i + 3]
  const __m512 c01 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], 0x88), _mm512_shuffle_f32x4(b[0], b[1], 0xDD));
  const __m512 c23 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], 0x88), _mm512_shuffle_f32x4(b[2], b[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(c01, c23, 0x88), _mm512_shuffle_f32x4(c01, c23, 0xDD));
}
#endif

}  // namespace triforce
