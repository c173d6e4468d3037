// The per-row loops of the CPU tile kernels of memsave::linear_cross_entropy (linear_cross_entropy.cpp), on the
// math of cross_entropy_math.h.
//
// Deliberately without include guard or includes: linear_cross_entropy.cpp includes this file once per instruction
// set, inside a namespace (isa_default, and on x86-64 with GCC isa_avx2 and isa_avx512 under `#pragma GCC target`),
// and picks one at run time from the CPU, as ATen does for its own kernels. The loops keep kLanes independent
// partial results so that the compiler vectorizes them (one running max or sum would be a serial dependency that it
// may not reorder); softmax_exp is branch-free for the same reason.

constexpr int kLanes = 16;

// Max, sum of exp(z - max) and (when with_sum_z) sum of z over one row of a tile.
template <typename scalar_t, typename acc_t>
void row_lse_partials(const scalar_t* z, int64_t n, bool with_sum_z, acc_t& max_out, acc_t& sum_exp_out,
                      acc_t& sum_z_out) {
  constexpr acc_t kNegInf = -std::numeric_limits<acc_t>::infinity();
  acc_t mx[kLanes];
  for (int l = 0; l < kLanes; ++l) mx[l] = kNegInf;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const acc_t x = static_cast<acc_t>(z[j + l]);
      mx[l] = x > mx[l] ? x : mx[l];
    }
  }
  acc_t m = kNegInf;
  for (; j < n; ++j) {
    const acc_t x = static_cast<acc_t>(z[j]);
    m = x > m ? x : m;
  }
  for (int l = 0; l < kLanes; ++l) m = mx[l] > m ? mx[l] : m;
  // All -inf: every exp below is exp(-inf) = 0 against a reference of 0 (not -inf - -inf = NaN).
  const acc_t ref = m == kNegInf ? acc_t(0) : m;
  acc_t se[kLanes];
  for (int l = 0; l < kLanes; ++l) se[l] = acc_t(0);
  j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) se[l] += softmax_exp(static_cast<acc_t>(z[j + l]) - ref);
  }
  acc_t s = 0;
  for (; j < n; ++j) s += softmax_exp(static_cast<acc_t>(z[j]) - ref);
  for (int l = 0; l < kLanes; ++l) s += se[l];
  acc_t t = 0;
  if (with_sum_z) {
    acc_t sz[kLanes];
    for (int l = 0; l < kLanes; ++l) sz[l] = acc_t(0);
    j = 0;
    for (; j + kLanes <= n; j += kLanes) {
      for (int l = 0; l < kLanes; ++l) sz[l] += static_cast<acc_t>(z[j + l]);
    }
    for (; j < n; ++j) t += static_cast<acc_t>(z[j]);
    for (int l = 0; l < kLanes; ++l) t += sz[l];
  }
  max_out = m;
  sum_exp_out = s;
  sum_z_out = t;
}

// Overwrites one row of logits with d(loss)/d(logit) * scale, every entry taken as a non-target (the caller redoes
// the target's entry with its weight).
template <typename scalar_t, typename acc_t>
void row_grad(scalar_t* z, int64_t n, LseParts<acc_t> lse, acc_t smooth, acc_t scale) {
  for (int64_t j = 0; j < n; ++j) {
    z[j] = static_cast<scalar_t>(cross_entropy_grad(static_cast<acc_t>(z[j]), lse, acc_t(0), smooth, scale));
  }
}
