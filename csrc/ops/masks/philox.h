// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), host and device.
// The counter-based generator behind memsave::dropout: the mask bit of element i depends only on (key, counter, i),
// so CPU threads and CUDA threads draw it in any order and the result never depends on the thread count.
//
// Counter layout (the one curand's Philox uses, so offsets from PyTorch's CUDA generator keep their meaning):
//   key = the 64-bit seed; counter = (lo(offset / 4), hi(offset / 4), lo(group), hi(group)), where
//   group = i / 4 (one Philox call gives the 4 random words of elements 4*group .. 4*group+3).
#pragma once

#include <cstdint>

#include <c10/macros/Macros.h>

// `#pragma unroll` for nvcc; host compilers unroll these fixed-count loops on their own (and GCC warns on the pragma).
#if defined(__CUDACC__)
#define MEMSAVE_UNROLL _Pragma("unroll")
#else
#define MEMSAVE_UNROLL
#endif

namespace memsave {
namespace philox {

constexpr uint32_t kM0 = 0xD2511F53u;
constexpr uint32_t kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u;
constexpr uint32_t kW1 = 0xBB67AE85u;
constexpr int kRounds = 10;

struct Words {
  uint32_t v[4];
};

C10_HOST_DEVICE inline uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
#if defined(__CUDA_ARCH__)
  *hi = __umulhi(a, b);
  return a * b;
#else
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
#endif
}

// The 4 random words of counter (c0, c1, c2, c3) under key (k0, k1).
C10_HOST_DEVICE inline Words philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  MEMSAVE_UNROLL
  for (int r = 0; r < kRounds; ++r) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = mulhilo(kM0, c0, &hi0);
    const uint32_t lo1 = mulhilo(kM1, c2, &hi1);
    const uint32_t n0 = hi1 ^ c1 ^ k0;
    const uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return Words{{c0, c1, c2, c3}};
}

// Keep threshold for keep probability q = 1 - p: an element is kept iff its 32-bit word is < threshold.
// Returned as 64 bits so that q = 1 (threshold 2^32) keeps everything; the keep rate is threshold / 2^32, within
// 2^-32 of q.
inline uint64_t keep_threshold(double p) {
  const double q = 1.0 - p;
  if (q >= 1.0) {
    return uint64_t{1} << 32;
  }
  if (q <= 0.0) {
    return 0;
  }
  return static_cast<uint64_t>(q * 4294967296.0);
}

// Whether an element whose random word is `word` is kept, for a threshold from keep_threshold (2^32 keeps all,
// 0 keeps none). The CPU (keep_byte) and CUDA (dropout.cu) kernels both decide through it.
C10_HOST_DEVICE inline bool keeps(uint32_t word, uint64_t threshold) {
  return static_cast<uint64_t>(word) < threshold;
}

// The byte of the keep mask covering elements 8*b .. 8*b+7 (groups 2b and 2b+1), for a threshold < 2^32.
C10_HOST_DEVICE inline uint8_t keep_byte(int64_t b, uint32_t threshold, uint32_t k0, uint32_t k1, uint32_t c0,
                                         uint32_t c1) {
  uint8_t bits = 0;
  MEMSAVE_UNROLL
  for (int half = 0; half < 2; ++half) {
    const uint64_t group = static_cast<uint64_t>(b) * 2 + half;
    const Words w = philox4x32(c0, c1, static_cast<uint32_t>(group), static_cast<uint32_t>(group >> 32), k0, k1);
    MEMSAVE_UNROLL
    for (int j = 0; j < 4; ++j) {
      bits |= static_cast<uint8_t>(keeps(w.v[j], threshold)) << (half * 4 + j);
    }
  }
  return bits;
}

}  // namespace philox
}  // namespace memsave
