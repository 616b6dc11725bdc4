// y[n, o] = sum_i x[n, i] * w[o, i] for the rows n of a small block (a verification block of
// tree nodes, one decoding token, a prefill chunk), with w packed in panels [P, I, 32]
// (w[o, i] at [o / 32, i, o % 32]; rows past O are zero), float32 or bfloat16.
//
// Why a kernel of our own: XLA:CPU runs a product of a few rows through a matrix-matrix routine
// that packs the weight on every call, which costs ~2x the one-row product at 2-8 rows, while a
// few-row product should cost about what reading the weight once does. Here each panel is read
// once, in order, for up to kRows rows at a time (the panel stays in L2 for the next group), so
// a block of 8 rows costs ~1.1-1.3x one row. Each output is accumulated in the same order
// whatever the number of rows or threads, so a row's result does not depend on the block it
// came in (plain decoding and verification read identical logits).
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kPanel = 32;  // output lanes per panel (two 16-float vectors)
#ifdef __AVX512F__
constexpr int kRows = 8;  // 16 accumulators in 32 vector registers
#else
constexpr int kRows = 4;  // 16-float vectors are two registers each without AVX-512
#endif
// Panel rows prefetched ahead of the one being read. With several rows a panel row takes
// longer to use than to fetch, and the hardware prefetcher then falls behind: on a 2-core Xeon
// with AVX-512 SmolLM2's forward over 8 nodes took 41.7-42.8 ms without this and 32.4-33.6 ms
// with it (one token: ~29 ms either way; 8 and 32 rows ahead were slower than 16).
constexpr int64_t kAhead = 16;
constexpr int64_t kBlock = 64;  // inputs summed before a partial sum joins the total (accuracy)

typedef float vec __attribute__((vector_size(64)));
typedef float vec_u __attribute__((vector_size(64), aligned(4)));
typedef uint16_t half_vec_u __attribute__((vector_size(32), aligned(2)));
typedef uint32_t wide_vec __attribute__((vector_size(64)));

inline vec load(const float* p) { return *reinterpret_cast<const vec_u*>(p); }

// 16 bfloat16 weights as floats: a bfloat16 is the top half of the float it stands for, so
// the products are those of the float32 weights of the same values, bit for bit, for half the
// bytes read (drafter weights stored in bfloat16: a product of a few rows is bound by them).
inline vec load(const uint16_t* p) {
  const wide_vec wide = __builtin_convertvector(*reinterpret_cast<const half_vec_u*>(p), wide_vec);
  return reinterpret_cast<vec>(wide << 16);
}

// Rows [0, G) of x [G, in] times one panel wp [in, 32] -> y[g * ld_y + j], j < valid.
template <int G, typename W>
inline void panel_rows(const float* __restrict x, const W* __restrict wp, int64_t in,
                       int64_t ld_y, int64_t valid, float* __restrict y) {
  vec lo[G], hi[G];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) lo[g] = hi[g] = (vec){};
  for (int64_t i0 = 0; i0 < in; i0 += kBlock) {
    const int64_t i1 = i0 + kBlock < in ? i0 + kBlock : in;
    vec blo[G], bhi[G];
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) blo[g] = bhi[g] = (vec){};
    for (int64_t i = i0; i < i1; ++i) {
      __builtin_prefetch(wp + (i + kAhead) * kPanel);
      __builtin_prefetch(wp + (i + kAhead) * kPanel + 16);
      const vec a = load(wp + i * kPanel), b = load(wp + i * kPanel + 16);
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        const float s = x[g * in + i];
        blo[g] += a * s;
        bhi[g] += b * s;
      }
    }
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      lo[g] += blo[g];
      hi[g] += bhi[g];
    }
  }
  for (int g = 0; g < G; ++g) {
    float out[kPanel];
    *reinterpret_cast<vec_u*>(out) = lo[g];
    *reinterpret_cast<vec_u*>(out + 16) = hi[g];
    for (int64_t j = 0; j < valid; ++j) y[g * ld_y + j] = out[j];
  }
}

// Panels [p0, p1) for every row of x [n, in] -> y [n, out].
template <typename W>
void panels(const float* x, const W* w, float* y, int64_t n, int64_t in, int64_t out,
            int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; ++p) {
    const W* wp = w + p * in * kPanel;
    const int64_t o = p * kPanel;
    const int64_t valid = out - o < kPanel ? out - o : kPanel;
    int64_t g = 0;
    for (; g + kRows <= n; g += kRows)
      panel_rows<kRows, W>(x + g * in, wp, in, out, valid, y + g * out + o);
    const float* xg = x + g * in;
    float* yg = y + g * out + o;
    switch (n - g) {
#if defined(__AVX512F__)
      case 7: panel_rows<7, W>(xg, wp, in, out, valid, yg); break;
      case 6: panel_rows<6, W>(xg, wp, in, out, valid, yg); break;
      case 5: panel_rows<5, W>(xg, wp, in, out, valid, yg); break;
      case 4: panel_rows<4, W>(xg, wp, in, out, valid, yg); break;
#endif
      case 3: panel_rows<3, W>(xg, wp, in, out, valid, yg); break;
      case 2: panel_rows<2, W>(xg, wp, in, out, valid, yg); break;
      case 1: panel_rows<1, W>(xg, wp, in, out, valid, yg); break;
      default: break;
    }
  }
}

// When a product is split over the thread pool: from kSplitRows rows, or from kSplitWeights
// weights whatever the rows. A product of a few rows is bound by reading the weight, and on a
// 2-core AVX-512 EPYC two threads read SmolLM2's matrices faster than one (plain decoding
// ~17 -> ~13.5 ms a token, a forward over 4 nodes ~19.7 -> ~14.6 ms: NOTES.md, "Fortieth
// session"); a small weight (stories260K's) is read faster than a hand-off to another thread,
// even over 8 rows (a 64 x 172 product of 8 rows took ~10x the time of 4 when split, and a
// forward of stories260K over 8 nodes ~15% longer), so rows alone split only from
// kSplitRowWork multiply-adds (every product of SmolLM2 over 8 rows still splits).
constexpr int64_t kSplitRows = 8;
constexpr int64_t kSplitWeights = int64_t{1} << 17;
constexpr int64_t kSplitRowWork = int64_t{1} << 19;

ffi::Error PanelProductImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                            ffi::Buffer<ffi::DataType::S32> layer, ffi::RemainingArgs weights,
                            ffi::ResultBuffer<ffi::F32> y) {
  const int64_t count = static_cast<int64_t>(weights.size());
  if (count < 1) return ffi::Error::InvalidArgument("panel_product: no weight");
  const int64_t index = layer.typed_data()[0];
  if (index < 0 || index >= count)
    return ffi::Error::InvalidArgument("panel_product: layer index out of range");
  auto w = weights.get<ffi::AnyBuffer>(index);
  if (w.has_error()) return w.error();
  const ffi::DataType type = w->element_type();
  if (type != ffi::DataType::F32 && type != ffi::DataType::BF16)
    return ffi::Error::InvalidArgument("panel_product: weights must be float32 or bfloat16");
  auto wd = w->dimensions();
  if (wd.size() != 3 || wd[2] != kPanel)
    return ffi::Error::InvalidArgument("panel_product: weights must be [P, I, 32]");
  const int64_t np = wd[0], in = wd[1];
  auto xd = x.dimensions();
  auto yd = y->dimensions();
  if (xd.size() < 1 || xd.back() != in || yd.size() != xd.size())
    return ffi::Error::InvalidArgument("panel_product: x must be [..., I], y [..., O]");
  const int64_t out = yd.back();
  if (out > np * kPanel) return ffi::Error::InvalidArgument("panel_product: O exceeds the panels");
  const int64_t n = x.element_count() / in;
  if (n == 0) return ffi::Error::Success();
  const float* xp = x.typed_data();
  const void* wp = w->untyped_data();
  const bool bf16 = type == ffi::DataType::BF16;
  float* yp = y->typed_data();
  auto run_panels = [=](int64_t p0, int64_t p1) {
    if (bf16)
      panels(xp, static_cast<const uint16_t*>(wp), yp, n, in, out, p0, p1);
    else
      panels(xp, static_cast<const float*>(wp), yp, n, in, out, p0, p1);
  };

  int64_t parts = 1;
  const int64_t weights_read = np * in * kPanel;
  if (weights_read >= kSplitWeights || (n >= kSplitRows && n * weights_read >= kSplitRowWork)) {
    const int64_t threads = pool.num_threads() + 1;  // the pool's and this one
    parts = threads < np ? threads : np;
  }
  if (parts <= 1) {
    run_panels(0, np);
    return ffi::Error::Success();
  }
  // The panels are cut into chunks that whichever thread comes first takes: this one and the
  // tasks it schedules. It waits only for chunks a started task is working on, never for a
  // task to start: the pool's threads may all be busy (XLA runs independent products at
  // once, each of which may be here), and waiting for a queued task would then never end.
  struct Work {
    std::atomic<int64_t> next{0}, done{0};
  };
  auto work = std::make_shared<Work>();
  const int64_t chunks = parts * 2;
  const int64_t per = (np + chunks - 1) / chunks;
  auto run = [=]() {
    for (int64_t c; (c = work->next.fetch_add(1)) < chunks;) {
      const int64_t p0 = c * per, p1 = p0 + per < np ? p0 + per : np;
      if (p0 < p1) run_panels(p0, p1);
      work->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t t = 1; t < parts; ++t) pool.Schedule([run] { run(); });
  run();
  while (work->done.load(std::memory_order_acquire) < chunks) std::this_thread::yield();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecjaxPanelProduct, PanelProductImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::DataType::S32>>()
                                  .RemainingArgs()
                                  .Ret<ffi::Buffer<ffi::F32>>());
