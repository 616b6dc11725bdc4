// The token a row of logits or probabilities picks: its argmax (greedy decoding and greedy
// verification) or a draw from it (sampling).
//
// Why a kernel of our own: XLA:CPU runs jnp.argmax as a reduction of (value, index) pairs one
// element at a time, ~1.1 ms over the [8, 49152] logits of an 8-node SmolLM2 verification (a
// max and a min over the row take ~0.4 ms), and jax.random.categorical draws a Gumbel variate
// per vocabulary entry, ~1.5 ms a row. Here a row is read once or twice at vector speed.
#include <cmath>
#include <cstdint>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kLanes = 16;  // floats per vector
constexpr int64_t kBlock = 64;  // elements per partial sum of a draw

typedef float vec __attribute__((vector_size(64)));
typedef float vec_u __attribute__((vector_size(64), aligned(4)));
typedef int32_t mask_vec __attribute__((vector_size(64)));

inline vec load(const float* p) { return *reinterpret_cast<const vec_u*>(p); }

// First index of the row's maximum; a NaN counts as larger than any number (jnp.argmax's
// rule), so the first NaN wins where there is one.
int32_t row_argmax(const float* x, int64_t v) {
  int64_t i = 0;
  float best = -INFINITY;
  bool nan = false;
  if (v >= kLanes) {
    vec m = load(x);
    mask_vec unordered = (m != m);
    for (i = kLanes; i + kLanes <= v; i += kLanes) {
      const vec a = load(x + i);
      m = a > m ? a : m;
      unordered |= (a != a);
    }
    for (int64_t l = 0; l < kLanes; ++l) {
      best = m[l] > best ? m[l] : best;
      nan |= unordered[l] != 0;
    }
  }
  for (; i < v; ++i) {
    best = x[i] > best ? x[i] : best;
    nan |= x[i] != x[i];
  }
  int64_t j = 0;
  if (!nan) {  // skip the vectors that do not hold the maximum
    const vec target = best - (vec){};
    for (; j + kLanes <= v; j += kLanes) {
      const mask_vec hit = load(x + j) == target;
      bool any = false;
      for (int64_t l = 0; l < kLanes; ++l) any |= hit[l] != 0;
      if (any) break;
    }
  }
  for (; j < v; ++j) {
    if (nan ? x[j] != x[j] : x[j] == best) return static_cast<int32_t>(j);
  }
  return 0;  // a row of -inf: its first index, as jnp.argmax
}

// A draw from the distribution proportional to p (non-negative, V entries): the first index whose
// running sum exceeds u * total, u uniform in [0, 1) from 53 random bits. Sums are in double
// precision, so an entry's chance differs from p_i / total by ~1e-16 (a float32 Gumbel-max draw
// resolves chances only to ~1e-7). Blocks of kBlock entries are summed vectorised first; the
// running sum then walks the blocks and one block's entries. Entries of p = 0 are never drawn.
int32_t row_draw(const float* p, int64_t v, uint32_t hi, uint32_t lo) {
  const int64_t blocks = (v + kBlock - 1) / kBlock;
  std::vector<double> sums(blocks);
  double total = 0.0;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * kBlock, i1 = i0 + kBlock < v ? i0 + kBlock : v;
    double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = i0;
    for (; i + 8 <= i1; i += 8) {
#pragma GCC unroll 8
      for (int l = 0; l < 8; ++l) lanes[l] += static_cast<double>(p[i + l]);
    }
    double s = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
               ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    for (; i < i1; ++i) s += static_cast<double>(p[i]);
    sums[b] = s;
    total += s;
  }
  const double u = static_cast<double>((static_cast<uint64_t>(hi) << 21) ^ (lo >> 11)) *
                   (1.0 / 9007199254740992.0);  // 2^-53
  const double goal = u * total;
  double before = 0.0;
  int64_t crossing = -1, last_block = -1;
  for (int64_t b = 0; b < blocks; ++b) {
    if (!(sums[b] > 0.0)) continue;  // empty (or NaN) blocks hold nothing to draw
    last_block = b;
    if (before + sums[b] > goal) {
      crossing = b;
      break;
    }
    before += sums[b];
  }
  if (last_block < 0) return 0;  // nothing positive (callers normalise with a fallback)
  // The crossing block's entries, summed in order from `before`. Where rounding of the block
  // sums leaves no crossing (u * total rounded up to total), the block's last positive entry.
  const int64_t b = crossing >= 0 ? crossing : last_block;
  const int64_t i0 = b * kBlock, i1 = i0 + kBlock < v ? i0 + kBlock : v;
  double running = before;
  int64_t last_positive = i0;
  for (int64_t i = i0; i < i1; ++i) {
    if (!(p[i] > 0.0f)) continue;
    last_positive = i;
    running += static_cast<double>(p[i]);
    if (crossing >= 0 && running > goal) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last_positive);
}

ffi::Error RowArgmaxImpl(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::DataType::S32> out) {
  auto d = x.dimensions();
  if (d.size() < 1) return ffi::Error::InvalidArgument("row_argmax: x must be [..., V]");
  const int64_t v = d[d.size() - 1];
  const int64_t rows = v > 0 ? static_cast<int64_t>(x.element_count()) / v : 0;
  if (v < 1 || out->element_count() != static_cast<size_t>(rows))
    return ffi::Error::InvalidArgument("row_argmax: x [..., V] with V >= 1, out [...]");
  const float* xp = x.typed_data();
  int32_t* op = out->typed_data();
  for (int64_t r = 0; r < rows; ++r) op[r] = row_argmax(xp + r * v, v);
  return ffi::Error::Success();
}

ffi::Error RowDrawImpl(ffi::Buffer<ffi::F32> p, ffi::Buffer<ffi::DataType::U32> bits,
                       ffi::ResultBuffer<ffi::DataType::S32> out) {
  auto d = p.dimensions();
  if (d.size() < 1) return ffi::Error::InvalidArgument("row_draw: p must be [..., V]");
  const int64_t v = d[d.size() - 1];
  const int64_t rows = v > 0 ? static_cast<int64_t>(p.element_count()) / v : 0;
  if (v < 1 || out->element_count() != static_cast<size_t>(rows) ||
      bits.element_count() != static_cast<size_t>(2 * rows))
    return ffi::Error::InvalidArgument("row_draw: p [..., V], bits [..., 2], out [...]");
  const float* pp = p.typed_data();
  const uint32_t* bp = bits.typed_data();
  int32_t* op = out->typed_data();
  for (int64_t r = 0; r < rows; ++r) op[r] = row_draw(pp + r * v, v, bp[2 * r], bp[2 * r + 1]);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecjaxRowArgmax, RowArgmaxImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::DataType::S32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecjaxRowDraw, RowDrawImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::DataType::U32>>()
                                  .Ret<ffi::Buffer<ffi::DataType::S32>>());
