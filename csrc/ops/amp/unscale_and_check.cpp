// memsave::unscale_and_check_ — the unscale half of dynamic loss scaling (the update half: amp_update_scale.cpp).
//
//   unscale_and_check_(Tensor(a!)[] grads, Tensor(b!) found_inf, Tensor inv_scale, Tensor(c!)? per_tensor=None) -> ()
//     One pass over every gradient of a list (one device, any mix of float/double/half/bfloat16): multiplies each
//     element by inv_scale in place and sets found_inf (float32, one element) to 1 when any element was inf or NaN.
//     found_inf is never cleared here (the caller zeroes it), so calls can share one flag. When per_tensor (float32,
//     one element per gradient) is given, per_tensor[i] is set to 1 for every gradient i that held a non-finite value
//     (overflow diagnostics). Values follow torch._amp_foreach_non_finite_check_and_unscale_ exactly: the product is
//     taken in float (double for double tensors) and rounded back; inv_scale == 1 leaves the gradients untouched.
//     Per element: nonfinite and unscaled (amp_math.h), the functions the CUDA kernel (unscale_and_check.cu) calls.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "amp/amp_checks.h"
#include "amp/amp_math.h"

namespace memsave {
namespace {

// Elements per parallel task. Tasks cut the concatenation of all gradients, so a thousand small tensors cost as
// little scheduling as one big one, and the two threads of a small machine share the work evenly.
constexpr int64_t kGrain = 1 << 16;

// x86-64 builds get an AVX2 clone of the hot loops, picked at load time when the CPU has it; the default clone
// is plain SSE2. The loops are written so that the compiler vectorizes them (integer OR reduction, no float
// reduction that would need reassociation).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MEMSAVE_HOT __attribute__((target_clones("avx2", "default"))) __attribute__((noinline))
#else
#define MEMSAVE_HOT __attribute__((noinline))
#endif

// Each returns true when any of the n values was inf or NaN (exponent bits all set), unscaling in place unless
// `unscale` is false (inv_scale == 1: torch then returns the value itself, so the memory is left untouched).
MEMSAVE_HOT bool unscale_f32(float* __restrict p, int64_t n, float inv, bool unscale) {
  uint32_t bad = 0;
  if (unscale) {
    for (int64_t i = 0; i < n; ++i) {
      bad |= static_cast<uint32_t>(nonfinite(p[i]));
      p[i] = unscaled(p[i], inv);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      bad |= static_cast<uint32_t>(nonfinite(p[i]));
    }
  }
  return bad != 0;
}

MEMSAVE_HOT bool unscale_f64(double* __restrict p, int64_t n, float inv, bool unscale) {
  uint64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    bad |= static_cast<uint64_t>(nonfinite(p[i]));
    if (unscale) {
      p[i] = unscaled(p[i], inv);
    }
  }
  return bad != 0;
}

// 16-bit types are checked on their own exponent bits and, when unscaling, unscaled in the same pass (one read
// and one write of the memory) through float, rounded back to nearest even, the rounding torch's kernel uses.
template <typename T>
MEMSAVE_HOT bool any_nonfinite_16(const uint16_t* __restrict raw, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    bad |= static_cast<uint32_t>(nonfinite_bits<T>(raw[i]));
  }
  return bad != 0;
}

// bfloat16 is the top half of a float: widening is a shift, and rounding is c10::BFloat16's round-to-nearest-even
// (NaN -> 0x7fc0) written without branches so that it vectorizes: the value of unscaled<c10::BFloat16>.
MEMSAVE_HOT bool unscale_bf16(uint16_t* __restrict p, int64_t n, float inv) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t raw = p[i];
    bad |= static_cast<uint32_t>(nonfinite_bits<c10::BFloat16>(static_cast<uint16_t>(raw)));
    const uint32_t in_bits = raw << 16;
    float v;
    std::memcpy(&v, &in_bits, sizeof(v));
    v = v * inv;
    uint32_t u;
    std::memcpy(&u, &v, sizeof(u));
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    p[i] = static_cast<uint16_t>(nan ? 0x7fc0u : rounded);
  }
  return bad != 0;
}

bool unscale_f16_portable(uint16_t* __restrict p, int64_t n, float inv) {
  const bool bad = any_nonfinite_16<c10::Half>(p, n);
  c10::Half* h = reinterpret_cast<c10::Half*>(p);
  for (int64_t i = 0; i < n; ++i) {
    h[i] = unscaled(h[i], inv);
  }
  return bad;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define MEMSAVE_X86_16BIT 1
#define MEMSAVE_TARGET_F16C __attribute__((target("avx2,f16c")))

bool cpu_has_avx2_f16c() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return has;
}

// 8 raw halves -> 8 raw halves times `scale`: F16C converts with the IEEE round-to-nearest-even that c10::Half's
// software conversion implements.
struct HalfTimes8 {
  MEMSAVE_TARGET_F16C __m128i operator()(__m128i raw, __m256 scale) const {
    return _mm256_cvtps_ph(_mm256_mul_ps(_mm256_cvtph_ps(raw), scale), _MM_FROUND_TO_NEAREST_INT);
  }
};

// 8 raw bfloat16 -> 8 raw bfloat16 times `scale`, rounded as unscale_bf16 does (the compiler does not vectorize
// that widening loop well).
struct BFloat16Times8 {
  MEMSAVE_TARGET_F16C __m128i operator()(__m128i raw, __m256 scale) const {
    const __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16)), scale);
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    const __m256i nan =
        _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    const __m256i out = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);
    // 8 x 32-bit (each <= 0xffff) -> 8 x 16-bit: pack within 128-bit lanes, then gather the two low quarters.
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(out, out), 0x08));
  }
};

// The vector body of both 16-bit types: 8 values at a time, checked on their raw exponent bits and unscaled in the
// same pass. Returns how many leading values it handled (a multiple of 8); *bad tells whether any was non-finite.
template <typename T, typename Times8>
MEMSAVE_TARGET_F16C int64_t unscale_16_x8(uint16_t* __restrict p, int64_t n, float inv, bool* bad) {
  const __m256 scale = _mm256_set1_ps(inv);
  const __m128i exp = _mm_set1_epi16(static_cast<int16_t>(FloatBits<T>::kExponent));
  __m128i any = _mm_setzero_si128();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
    any = _mm_or_si128(any, _mm_cmpeq_epi16(_mm_and_si128(raw, exp), exp));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + i), Times8{}(raw, scale));
  }
  *bad = _mm_movemask_epi8(any) != 0;
  return i;
}
#endif

// The 16-bit types: the vector body when the CPU has AVX2 and F16C (checked once), the portable loop for the rest.
template <typename T, bool (*kPortable)(uint16_t*, int64_t, float)>
bool unscale_16(uint16_t* p, int64_t n, float inv) {
#ifdef MEMSAVE_X86_16BIT
  if (cpu_has_avx2_f16c()) {
    using Times8 = std::conditional_t<std::is_same_v<T, c10::Half>, HalfTimes8, BFloat16Times8>;
    bool bad = false;
    const int64_t done = unscale_16_x8<T, Times8>(p, n, inv, &bad);
    return kPortable(p + done, n - done, inv) || bad;
  }
#endif
  return kPortable(p, n, inv);
}

bool unscale_segment(at::ScalarType dtype, void* data, int64_t begin, int64_t end, float inv, bool unscale) {
  const int64_t n = end - begin;
  switch (dtype) {
    case at::kFloat:
      return unscale_f32(static_cast<float*>(data) + begin, n, inv, unscale);
    case at::kDouble:
      return unscale_f64(static_cast<double*>(data) + begin, n, inv, unscale);
    case at::kHalf: {
      uint16_t* p = static_cast<uint16_t*>(data) + begin;
      return unscale ? unscale_16<c10::Half, unscale_f16_portable>(p, n, inv) : any_nonfinite_16<c10::Half>(p, n);
    }
    case at::kBFloat16: {
      uint16_t* p = static_cast<uint16_t*>(data) + begin;
      return unscale ? unscale_16<c10::BFloat16, unscale_bf16>(p, n, inv) : any_nonfinite_16<c10::BFloat16>(p, n);
    }
    default:
      TORCH_INTERNAL_ASSERT(false, "unscale_and_check_: unexpected dtype ", dtype);
  }
  return false;
}

void unscale_and_check_cpu(at::TensorList grads, const at::Tensor& found_inf, const at::Tensor& inv_scale,
                           const std::optional<at::Tensor>& per_tensor) {
  check_unscale_args(grads, found_inf, inv_scale, per_tensor, at::kCPU);
  if (grads.empty()) {
    return;
  }
  const float inv = *inv_scale.const_data_ptr<float>();
  const bool unscale = inv != 1.f;

  // Dense gradients are walked as flat memory; the rare strided one goes through a contiguous copy.
  const size_t count = grads.size();
  std::vector<at::Tensor> work;
  work.reserve(count);
  std::vector<int64_t> offsets(count + 1, 0);
  for (size_t i = 0; i < count; ++i) {
    const at::Tensor& g = grads[i];
    work.push_back(g.is_non_overlapping_and_dense() ? g : g.contiguous());
    offsets[i + 1] = offsets[i] + g.numel();
  }
  const int64_t total = offsets[count];

  std::atomic<bool> any_bad{false};
  std::unique_ptr<std::atomic<bool>[]> tensor_bad;
  if (per_tensor.has_value()) {
    tensor_bad.reset(new std::atomic<bool>[count]);
    for (size_t i = 0; i < count; ++i) {
      tensor_bad[i].store(false, std::memory_order_relaxed);
    }
  }

  at::parallel_for(0, total, kGrain, [&](int64_t lo, int64_t hi) {
    // First gradient that holds element `lo` of the concatenation (skipping empty ones).
    size_t t = static_cast<size_t>(std::upper_bound(offsets.begin(), offsets.end(), lo) - offsets.begin()) - 1;
    bool task_bad = false;
    for (int64_t pos = lo; pos < hi; ++t) {
      const int64_t seg_end = std::min(hi, offsets[t + 1]);
      if (seg_end <= pos) {
        continue;
      }
      const at::Tensor& g = work[t];
      const bool bad =
          unscale_segment(g.scalar_type(), g.data_ptr(), pos - offsets[t], seg_end - offsets[t], inv, unscale);
      if (bad) {
        task_bad = true;
        if (tensor_bad) {
          tensor_bad[t].store(true, std::memory_order_relaxed);
        }
      }
      pos = seg_end;
    }
    if (task_bad) {
      any_bad.store(true, std::memory_order_relaxed);
    }
  });

  for (size_t i = 0; i < count; ++i) {
    if (!work[i].is_same(grads[i])) {
      grads[i].copy_(work[i]);
    }
  }
  if (any_bad.load()) {
    *found_inf.mutable_data_ptr<float>() = 1.f;
  }
  if (per_tensor.has_value()) {
    float* flags = per_tensor->mutable_data_ptr<float>();
    for (size_t i = 0; i < count; ++i) {
      if (tensor_bad[i].load(std::memory_order_relaxed)) {
        flags[i] = 1.f;
      }
    }
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(memsave, m) {
  m.def(
      "unscale_and_check_(Tensor(a!)[] grads, Tensor(b!) found_inf, Tensor inv_scale, Tensor(c!)? per_tensor=None) "
      "-> ()");
}

TORCH_LIBRARY_IMPL(memsave, CPU, m) {
  m.impl("unscale_and_check_", &unscale_and_check_cpu);
}

// A sparse gradient in the list sends the call to the Sparse key: the same kernel rejects it with a clear message.
TORCH_LIBRARY_IMPL(memsave, SparseCPU, m) {
  m.impl("unscale_and_check_", &unscale_and_check_cpu);
}

}  // namespace memsave
