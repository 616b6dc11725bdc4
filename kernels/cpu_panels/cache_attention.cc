// Attention of a small query block over one layer of the KV cache, reading only the positions a
// query can see (specjax.attention's contract):
//   out[b, n, h] = sum_j softmax_j(q[b, n, h] . k[layer, b, j, h / G] / sqrt(D)) v[layer, b, j, h / G]
// over j < lengths[b] (committed context) and j = lengths[b] + m with mask[b, n, m] (the block).
//
// Why a kernel of our own: XLA:CPU's attention over a static cache computes every one of its S
// positions and copies the layer's slice out of the [L, B, S, K, D] cache, so a decoding step's
// cost grows with the cache's size rather than with the context (SmolLM2, 8 tree nodes: +12 ms a
// step from S = 132 to S = 640 at the same context). Here the layer's slice is read in place and
// only the visible positions are touched.
//
// Each query's scores, weights and sums are taken over its visible keys in position order with
// the same arithmetic whatever the block, so a token's attention output is bit for bit the same
// whether it comes alone (decoding) or in a verification block whose committed and ancestor keys
// are the same (as panel_product.cc's products are).
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float vec __attribute__((vector_size(64)));
typedef float vec_u __attribute__((vector_size(64), aligned(4)));

inline vec load(const float* p) { return *reinterpret_cast<const vec_u*>(p); }
inline void store(float* p, vec x) { *reinterpret_cast<vec_u*>(p) = x; }

// q . k over d floats, in a fixed order (16-float lanes summed in lane order, then the rest).
inline float dot(const float* __restrict q, const float* __restrict k, int64_t d) {
  int64_t i = 0;
  float total = 0.f;
  if (d >= 16) {
    vec acc = load(q) * load(k);
    for (i = 16; i + 16 <= d; i += 16) acc += load(q + i) * load(k + i);
    float lanes[16];
    store(lanes, acc);
    for (int l = 0; l < 16; ++l) total += lanes[l];
  }
  for (; i < d; ++i) total += q[i] * k[i];
  return total;
}

// acc[0, d) += w * v[0, d)
inline void axpy(float* __restrict acc, float w, const float* __restrict v, int64_t d) {
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) store(acc + i, load(acc + i) + load(v + i) * w);
  for (; i < d; ++i) acc[i] += v[i] * w;
}

struct Shapes {
  int64_t b, n, h, d;  // queries [B, N, H, D]
  int64_t s, kh;       // cache [L, B, S, K, D]
};

// One (row, kv head): the G = H / K query heads sharing that kv head, for every block token.
void attend_group(const Shapes& sh, const float* q, const float* k, const float* v,
                  int64_t length, const bool* mask, int64_t row, int64_t kv, float* out) {
  const int64_t g_count = sh.h / sh.kh, d = sh.d, n = sh.n;
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  const int64_t key_stride = sh.kh * d;  // between consecutive positions of one kv head
  const float* k0 = k + kv * d;
  const float* v0 = v + kv * d;
  // Block slots past the cache's end hold no key (the engine's reserve keeps the block inside).
  const int64_t block = length + n <= sh.s ? n : (sh.s > length ? sh.s - length : 0);
  std::vector<float> scores(length + block);
  std::vector<float> acc(d);
  for (int64_t t = 0; t < n; ++t) {
    const bool* visible = mask + (row * n + t) * n;
    for (int64_t g = 0; g < g_count; ++g) {
      const int64_t head = kv * g_count + g;
      const float* qv = q + ((row * n + t) * sh.h + head) * d;
      float top = -INFINITY;
      for (int64_t j = 0; j < length; ++j) {
        const float s = dot(qv, k0 + j * key_stride, d) * scale;
        scores[j] = s;
        top = s > top ? s : top;
      }
      for (int64_t m = 0; m < block; ++m) {
        if (!visible[m]) continue;
        const float s = dot(qv, k0 + (length + m) * key_stride, d) * scale;
        scores[length + m] = s;
        top = s > top ? s : top;
      }
      float* o = out + ((row * n + t) * sh.h + head) * d;
      if (top == -INFINITY) {  // nothing visible (not reached by the engine): zeros
        for (int64_t i = 0; i < d; ++i) o[i] = 0.f;
        continue;
      }
      for (int64_t i = 0; i < d; ++i) acc[i] = 0.f;
      float total = 0.f;
      for (int64_t j = 0; j < length; ++j) {
        const float w = std::exp(scores[j] - top);
        total += w;
        axpy(acc.data(), w, v0 + j * key_stride, d);
      }
      for (int64_t m = 0; m < block; ++m) {
        if (!visible[m]) continue;
        const float w = std::exp(scores[length + m] - top);
        total += w;
        axpy(acc.data(), w, v0 + (length + m) * key_stride, d);
      }
      const float inv = 1.f / total;
      for (int64_t i = 0; i < d; ++i) o[i] = acc[i] * inv;
    }
  }
}

// Multiply-adds at which the (row, kv head) groups are spread over the thread pool: below it a
// hand-off costs more than the work.
constexpr int64_t kSplitWork = 1 << 18;

ffi::Error CacheAttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q,
                              ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                              ffi::Buffer<ffi::DataType::S32> layer,
                              ffi::Buffer<ffi::DataType::S32> lengths,
                              ffi::Buffer<ffi::DataType::PRED> mask,
                              ffi::ResultBuffer<ffi::F32> out) {
  auto qd = q.dimensions();
  auto kd = k.dimensions();
  auto vd = v.dimensions();
  bool same = vd.size() == kd.size();
  for (size_t i = 0; same && i < kd.size(); ++i) same = vd[i] == kd[i];
  if (qd.size() != 4 || kd.size() != 5 || !same)
    return ffi::Error::InvalidArgument("cache_attention: q [B, N, H, D], k/v [L, B, S, K, D]");
  const Shapes sh{qd[0], qd[1], qd[2], qd[3], kd[2], kd[3]};
  if (kd[1] != sh.b || kd[4] != sh.d || sh.kh < 1 || sh.h % sh.kh != 0)
    return ffi::Error::InvalidArgument("cache_attention: q and the cache disagree");
  auto md = mask.dimensions();
  if (md.size() != 3 || md[0] != sh.b || md[1] != sh.n || md[2] != sh.n ||
      lengths.element_count() != sh.b)
    return ffi::Error::InvalidArgument("cache_attention: mask [B, N, N], lengths [B]");
  const int64_t index = layer.typed_data()[0];
  if (index < 0 || index >= kd[0])
    return ffi::Error::InvalidArgument("cache_attention: layer index out of range");
  const int64_t layer_size = sh.b * sh.s * sh.kh * sh.d, row_size = sh.s * sh.kh * sh.d;
  const float* qp = q.typed_data();
  const float* kp = k.typed_data() + index * layer_size;
  const float* vp = v.typed_data() + index * layer_size;
  const int32_t* lp = lengths.typed_data();
  const bool* mp = mask.typed_data();
  float* op = out->typed_data();
  auto group = [=](int64_t item) {
    const int64_t row = item / sh.kh, kv = item % sh.kh;
    int64_t length = lp[row];
    length = length < 0 ? 0 : (length > sh.s ? sh.s : length);
    attend_group(sh, qp, kp + row * row_size, vp + row * row_size, length, mp, row, kv, op);
  };
  const int64_t items = sh.b * sh.kh;
  int64_t context = 0;
  for (int64_t r = 0; r < sh.b; ++r) context += lp[r] + sh.n;
  const int64_t work = context * sh.n * sh.h * sh.d * 2;
  if (items < 2 || work < kSplitWork || pool.num_threads() < 1) {
    for (int64_t i = 0; i < items; ++i) group(i);
    return ffi::Error::Success();
  }
  // Groups go to whichever thread comes first: this one and the tasks it schedules. It never
  // waits for a task to start (see panel_product.cc: the pool's threads may all be busy).
  struct Work {
    std::atomic<int64_t> next{0}, done{0};
  };
  auto state = std::make_shared<Work>();
  auto run = [=]() {
    for (int64_t i; (i = state->next.fetch_add(1)) < items;) {
      group(i);
      state->done.fetch_add(1, std::memory_order_release);
    }
  };
  const int64_t helpers = pool.num_threads() < items - 1 ? pool.num_threads() : items - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([run] { run(); });
  run();
  while (state->done.load(std::memory_order_acquire) < items) std::this_thread::yield();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecjaxCacheAttention, CacheAttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::DataType::S32>>()
                                  .Arg<ffi::Buffer<ffi::DataType::S32>>()
                                  .Arg<ffi::Buffer<ffi::DataType::PRED>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
