// CPU building blocks of the mask-saving operators (relu, leaky_relu, dropout): each works on a range of mask bytes
// [b0, b1) (byte b covers elements 8b .. 8b+7, see bitmask.h) so the operators split the work with at::parallel_for.
//
// float32 and float64 take an AVX2 path when the CPU has it (chosen at run time: the extension is built for the
// baseline x86-64 ISA, like the rest of torch's dispatch-by-capability kernels); every other case, and the last
// partial byte, takes the portable path, which is the per-element math of mask_math.h that the CUDA kernels run too.
// Both paths compute the same bits and values.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include "masks/mask_math.h"
#include "masks/philox.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MEMSAVE_X86_SIMD 1
#include <immintrin.h>
#define MEMSAVE_TARGET_AVX2 __attribute__((target("avx2")))
#else
#define MEMSAVE_X86_SIMD 0
#endif

namespace memsave {
namespace cpu {

// Bytes of mask per parallel task: 4096 bytes = 32768 elements.
constexpr int64_t kGrainBytes = 4096;

inline bool has_avx2() {
#if MEMSAVE_X86_SIMD
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
#else
  return false;
#endif
}

// ---- portable path: the per-element math of mask_math.h, 8 elements (one mask byte) at a time ----------------------

// Forward of an element-wise op with a mask (Op: ReluMask, LeakyReluMask), mask bytes [b0, b1) of n elements.
template <typename Op, typename T>
void mask_forward_generic(const T* in, T* out, uint8_t* mask, int64_t n, int64_t b0, int64_t b1, at::opmath_type<T> a) {
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t i0 = b * 8;
    const int64_t count = std::min<int64_t>(8, n - i0);
    uint8_t bits = 0;
    for (int64_t j = 0; j < count; ++j) {
      bool bit;
      out[i0 + j] = Op::forward(in[i0 + j], a, &bit);
      bits |= static_cast<uint8_t>(bit) << j;
    }
    mask[b] = bits;
  }
}

template <typename T, Apply kMode>
void apply_mask_generic(const T* in, const uint8_t* mask, T* out, int64_t n, int64_t b0, int64_t b1,
                        at::opmath_type<T> a, at::opmath_type<T> b_mul) {
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t i0 = b * 8;
    const int64_t count = std::min<int64_t>(8, n - i0);
    const uint8_t bits = mask[b];
    for (int64_t j = 0; j < count; ++j) {
      out[i0 + j] = apply_mask_value<kMode>(in[i0 + j], (bits >> j) & 1, a, b_mul);
    }
  }
}

// Keep-mask bytes [b0, b1) of dropout over n elements; threshold as philox::keep_threshold.
inline void dropout_mask_generic(uint8_t* mask, int64_t b0, int64_t b1, uint64_t threshold, uint64_t seed) {
  const uint32_t k0 = static_cast<uint32_t>(seed);
  const uint32_t k1 = static_cast<uint32_t>(seed >> 32);
  for (int64_t b = b0; b < b1; ++b) {
    mask[b] = philox::keep_byte(b, static_cast<uint32_t>(threshold), k0, k1, 0, 0);
  }
}

// ---- AVX2 path (float32, float64; whole bytes only) ---------------------------------------------------------------
#if MEMSAVE_X86_SIMD

// An AVX2 register of T (8 floats or 4 doubles): a mask byte covers 8 / kLanes registers.
template <typename T>
struct Vec;

template <>
struct Vec<float> {
  using type = __m256;
  static constexpr int kLanes = 8;
  MEMSAVE_TARGET_AVX2 static type set1(float a) { return _mm256_set1_ps(a); }
  MEMSAVE_TARGET_AVX2 static type load(const float* p) { return _mm256_loadu_ps(p); }
  MEMSAVE_TARGET_AVX2 static void store(float* p, type v) { _mm256_storeu_ps(p, v); }
  MEMSAVE_TARGET_AVX2 static int movemask(type v) { return _mm256_movemask_ps(v); }
  // Lane k is all-ones iff bit k of `bits` is set.
  MEMSAVE_TARGET_AVX2 static type expand(uint32_t bits) {
    const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i b = _mm256_set1_epi32(static_cast<int>(bits));
    return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(b, sel), sel));
  }
};

template <>
struct Vec<double> {
  using type = __m256d;
  static constexpr int kLanes = 4;
  MEMSAVE_TARGET_AVX2 static type set1(double a) { return _mm256_set1_pd(a); }
  MEMSAVE_TARGET_AVX2 static type load(const double* p) { return _mm256_loadu_pd(p); }
  MEMSAVE_TARGET_AVX2 static void store(double* p, type v) { _mm256_storeu_pd(p, v); }
  MEMSAVE_TARGET_AVX2 static int movemask(type v) { return _mm256_movemask_pd(v); }
  // Lane k is all-ones iff bit k of `bits` is set (bits 0..3; the caller shifts in the other half).
  MEMSAVE_TARGET_AVX2 static type expand(uint32_t bits) {
    const __m256i sel = _mm256_setr_epi64x(1, 2, 4, 8);
    const __m256i b = _mm256_set1_epi64x(static_cast<int64_t>(bits));
    return _mm256_castsi256_pd(_mm256_cmpeq_epi64(_mm256_and_si256(b, sel), sel));
  }
};

// The AVX2 form of a mask_math.h forward: the output, and in `pass` the lanes whose bit is set.
template <class Op>
struct Avx2;

// ReluMask: v < 0 ? 0 : v (NaN and -0.0 stay), bit = !(v <= 0) (NaN passes).
template <>
struct Avx2<ReluMask> {
  MEMSAVE_TARGET_AVX2 static __m256 forward(__m256 v, __m256 /*unused*/, __m256* pass) {
    const __m256 zero = _mm256_setzero_ps();
    *pass = _mm256_cmp_ps(v, zero, _CMP_NLE_UQ);
    return _mm256_andnot_ps(_mm256_cmp_ps(v, zero, _CMP_LT_OQ), v);
  }
  MEMSAVE_TARGET_AVX2 static __m256d forward(__m256d v, __m256d /*unused*/, __m256d* pass) {
    const __m256d zero = _mm256_setzero_pd();
    *pass = _mm256_cmp_pd(v, zero, _CMP_NLE_UQ);
    return _mm256_andnot_pd(_mm256_cmp_pd(v, zero, _CMP_LT_OQ), v);
  }
};

// LeakyReluMask: bit = v > 0, v > 0 ? v : v * slope.
template <>
struct Avx2<LeakyReluMask> {
  MEMSAVE_TARGET_AVX2 static __m256 forward(__m256 v, __m256 slope, __m256* pass) {
    *pass = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GT_OQ);
    return _mm256_blendv_ps(_mm256_mul_ps(v, slope), v, *pass);
  }
  MEMSAVE_TARGET_AVX2 static __m256d forward(__m256d v, __m256d slope, __m256d* pass) {
    *pass = _mm256_cmp_pd(v, _mm256_setzero_pd(), _CMP_GT_OQ);
    return _mm256_blendv_pd(_mm256_mul_pd(v, slope), v, *pass);
  }
};

// Forward of Op over whole mask bytes [b0, b1).
template <class Op, typename T>
MEMSAVE_TARGET_AVX2 inline void forward_with_mask_avx2(const T* in, T* out, uint8_t* mask, int64_t b0, int64_t b1,
                                                       T a) {
  using V = Vec<T>;
  const typename V::type va = V::set1(a);
  for (int64_t b = b0; b < b1; ++b) {
    int bits = 0;
    for (int h = 0; h < 8 / V::kLanes; ++h) {
      const int64_t i = b * 8 + h * V::kLanes;
      typename V::type pass;
      V::store(out + i, Avx2<Op>::forward(V::load(in + i), va, &pass));
      bits |= V::movemask(pass) << (h * V::kLanes);
    }
    mask[b] = static_cast<uint8_t>(bits);
  }
}

// apply_mask_value for 8 float or 4 double lanes; lane k of `m` is all-ones iff its bit is set.
template <Apply kMode>
MEMSAVE_TARGET_AVX2 inline __m256 apply_mask_lanes(__m256 m, __m256 v, __m256 va, __m256 vb) {
  if (kMode == Apply::kPass) return _mm256_and_ps(m, v);
  if (kMode == Apply::kPassScaled) return _mm256_and_ps(m, _mm256_mul_ps(v, va));
  return _mm256_blendv_ps(_mm256_mul_ps(v, vb), v, m);
}

template <Apply kMode>
MEMSAVE_TARGET_AVX2 inline __m256d apply_mask_lanes(__m256d m, __m256d v, __m256d va, __m256d vb) {
  if (kMode == Apply::kPass) return _mm256_and_pd(m, v);
  if (kMode == Apply::kPassScaled) return _mm256_and_pd(m, _mm256_mul_pd(v, va));
  return _mm256_blendv_pd(_mm256_mul_pd(v, vb), v, m);
}

template <Apply kMode, typename T>
MEMSAVE_TARGET_AVX2 inline void apply_mask_avx2(const T* in, const uint8_t* mask, T* out, int64_t b0, int64_t b1, T a,
                                                T b_mul) {
  using V = Vec<T>;
  const typename V::type va = V::set1(a);
  const typename V::type vb = V::set1(b_mul);
  for (int64_t b = b0; b < b1; ++b) {
    for (int h = 0; h < 8 / V::kLanes; ++h) {
      const int64_t i = b * 8 + h * V::kLanes;
      const typename V::type m = V::expand(static_cast<uint32_t>(mask[b]) >> (h * V::kLanes));
      V::store(out + i, apply_mask_lanes<kMode>(m, V::load(in + i), va, vb));
    }
  }
}

// 32-bit products of 8 lanes: low and high halves (AVX2 multiplies only even lanes, so odd lanes go separately).
MEMSAVE_TARGET_AVX2 inline void mulhilo_avx2(__m256i a, __m256i m, __m256i* lo, __m256i* hi) {
  const __m256i even = _mm256_mul_epu32(a, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
  *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

// Bits 0..7 of x moved to bits 0, 4, 8, ..., 28.
inline uint32_t spread_nibbles(uint32_t x) {
  x = (x | (x << 12)) & 0x000F000Fu;
  x = (x | (x << 6)) & 0x03030303u;
  x = (x | (x << 3)) & 0x11111111u;
  return x;
}

// Keep-mask bytes [b0, b1), 4 at a time (8 Philox calls side by side); the remainder takes the portable path.
MEMSAVE_TARGET_AVX2 inline void dropout_mask_avx2(uint8_t* mask, int64_t b0, int64_t b1, uint32_t threshold,
                                                  uint64_t seed) {
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(philox::kM0));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(philox::kM1));
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i thr = _mm256_xor_si256(_mm256_set1_epi32(static_cast<int>(threshold)), sign);
  const uint32_t key0 = static_cast<uint32_t>(seed);
  const uint32_t key1 = static_cast<uint32_t>(seed >> 32);
  int64_t b = b0;
  for (; b + 4 <= b1; b += 4) {
    const uint64_t g = static_cast<uint64_t>(b) * 2;  // 8 groups of 4 elements: g .. g+7
    alignas(32) uint32_t lo[8], hi[8];
    for (int k = 0; k < 8; ++k) {
      lo[k] = static_cast<uint32_t>(g + k);
      hi[k] = static_cast<uint32_t>((g + k) >> 32);
    }
    __m256i c0 = _mm256_setzero_si256();
    __m256i c1 = _mm256_setzero_si256();
    __m256i c2 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo));
    __m256i c3 = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi));
    __m256i k0 = _mm256_set1_epi32(static_cast<int>(key0));
    __m256i k1 = _mm256_set1_epi32(static_cast<int>(key1));
    const __m256i w0 = _mm256_set1_epi32(static_cast<int>(philox::kW0));
    const __m256i w1 = _mm256_set1_epi32(static_cast<int>(philox::kW1));
    for (int r = 0; r < philox::kRounds; ++r) {
      __m256i lo0, hi0, lo1, hi1;
      mulhilo_avx2(c0, m0, &lo0, &hi0);
      mulhilo_avx2(c2, m1, &lo1, &hi1);
      c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), k0);
      c1 = lo1;
      c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), k1);
      c3 = lo0;
      k0 = _mm256_add_epi32(k0, w0);
      k1 = _mm256_add_epi32(k1, w1);
    }
    const __m256i words[4] = {c0, c1, c2, c3};
    uint32_t packed = 0;
    for (int j = 0; j < 4; ++j) {
      const __m256i keep = _mm256_cmpgt_epi32(thr, _mm256_xor_si256(words[j], sign));  // word < threshold
      packed |= spread_nibbles(static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(keep)))) << j;
    }
    std::memcpy(mask + b, &packed, 4);  // little-endian: byte 0 holds groups g, g+1
  }
  dropout_mask_generic(mask, b, b1, threshold, seed);
}

#endif  // MEMSAVE_X86_SIMD

// ---- entry points: whole bytes on the fast path when there is one, the partial last byte portably ----------------

// Forward of Op (ReluMask, LeakyReluMask; `a` is its scalar) over mask bytes [b0, b1) of n elements.
template <class Op, typename T>
void forward_with_mask(const T* in, T* out, uint8_t* mask, int64_t n, int64_t b0, int64_t b1, at::opmath_type<T> a) {
#if MEMSAVE_X86_SIMD
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (has_avx2()) {
      const int64_t full = std::min<int64_t>(b1, n / 8);
      if (full > b0) {
        forward_with_mask_avx2<Op>(in, out, mask, b0, full, a);
        b0 = full;
      }
    }
  }
#endif
  mask_forward_generic<Op>(in, out, mask, n, b0, b1, a);
}

template <Apply kMode, typename T>
void apply_mask(const T* in, const uint8_t* mask, T* out, int64_t n, int64_t b0, int64_t b1, at::opmath_type<T> a,
                at::opmath_type<T> b_mul) {
#if MEMSAVE_X86_SIMD
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (has_avx2()) {
      const int64_t full = std::min<int64_t>(b1, n / 8);
      if (full > b0) {
        apply_mask_avx2<kMode>(in, mask, out, b0, full, a, b_mul);
        b0 = full;
      }
    }
  }
#endif
  apply_mask_generic<T, kMode>(in, mask, out, n, b0, b1, a, b_mul);
}

// out = mask applied to `in` (dense, same dtype, strides and numel), split over torch's threads; `a`, `b` as in Apply.
// The CPU counterpart of cuda::launch_apply_mask (mask_kernels.cuh).
template <Apply kMode>
void launch_apply_mask(const at::Tensor& in, const at::Tensor& mask, const at::Tensor& out, double a, double b) {
  const int64_t n = in.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, in.scalar_type(), "memsave_apply_mask_cpu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const scalar_t* src = in.const_data_ptr<scalar_t>();
    const uint8_t* m = mask.const_data_ptr<uint8_t>();
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, mask.numel(), kGrainBytes, [&](int64_t b0, int64_t b1) {
      apply_mask<kMode, scalar_t>(src, m, dst, n, b0, b1, static_cast<opmath_t>(a), static_cast<opmath_t>(b));
    });
  });
}

// Dropout keep mask over n elements, bytes [b0, b1); the unused bits of the last byte are cleared.
inline void dropout_mask(uint8_t* mask, int64_t n, int64_t b0, int64_t b1, uint64_t threshold, uint64_t seed) {
  if (threshold >= (uint64_t{1} << 32)) {
    std::memset(mask + b0, 0xFF, static_cast<size_t>(b1 - b0));
  } else if (threshold == 0) {
    std::memset(mask + b0, 0, static_cast<size_t>(b1 - b0));
  } else {
#if MEMSAVE_X86_SIMD
    if (has_avx2()) {
      dropout_mask_avx2(mask, b0, b1, static_cast<uint32_t>(threshold), seed);
    } else {
      dropout_mask_generic(mask, b0, b1, threshold, seed);
    }
#else
    dropout_mask_generic(mask, b0, b1, threshold, seed);
#endif
  }
  const int64_t last = (n + 7) / 8 - 1;
  if (n % 8 != 0 && b0 <= last && last < b1) {
    mask[last] &= static_cast<uint8_t>((1u << (n % 8)) - 1u);
  }
}

}  // namespace cpu
}  // namespace memsave
