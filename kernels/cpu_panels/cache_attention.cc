// Attention of a small query block over one layer of the KV cache, reading only the positions a
// query can see (specjax.attention's contract):
//   out[b, n, h] = sum_j softmax_j(q[b, n, h] . k[layer, b, j, h / G] / sqrt(D)) v[layer, b, j, h / G]
// over j < lengths[b] (committed context) and j = lengths[b] + m with mask[b, n, m] (the block:
// mask [B, N, M], M block keys; M = N when the queries are the block's own tokens, M > N when
// they see more keys written after the context, as a feature drafter's tree levels do).
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
typedef float half_vec __attribute__((vector_size(32)));  // 8 floats: heads of 8

inline vec load(const float* p) { return *reinterpret_cast<const vec_u*>(p); }
inline void store(float* p, vec x) { *reinterpret_cast<vec_u*>(p) = x; }

struct Shapes {
  int64_t b, n, h, d;  // queries [B, N, H, D]
  int64_t s, kh;       // cache [L, B, S, K, D]
  int64_t m;           // block keys (mask [B, N, M])
};

// exp of 16 floats lane by lane (Cephes' single-precision expf, ~1 ulp); lanes below -87.3
// (weights under float's normal range, and -inf) give 0.
inline vec exp16(vec x) {
  typedef int32_t ivec __attribute__((vector_size(64)));
  const ivec tiny = x < -87.3f;
  x = tiny ? (vec){} - 87.3f : x;
  const vec fx = x * 1.44269504088896341f + 0.5f;
  vec t = __builtin_convertvector(__builtin_convertvector(fx, ivec), vec);
  t = t > fx ? t - 1.f : t;  // floor
  x = x - t * 0.693359375f;
  x = x - t * -2.12194440e-4f;
  const vec z = x * x;
  vec y = (vec){} + 1.9875691500e-4f;
  y = y * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * z + x + 1.f;
  const ivec bits = (__builtin_convertvector(t, ivec) + 127) << 23;
  y = y * reinterpret_cast<const vec&>(bits);
  return tiny ? (vec){} : y;
}

constexpr int64_t kLanes = 16;   // keys scored at once (one vector)
constexpr int64_t kQueries = 4;  // queries scored, and summed, at once

// out[r] = sum_j w[r, j] v_j / total[r] for every query r (d = C * lanes of V: 16-float
// vectors, or 8-float ones for a head of 8: the scalar loop below cost a 260K-parameter model
// ~30 us a node), Q queries per pass over the values with their sums held in registers; each
// sum runs over the keys in order.
template <typename V, int C>
void weighted_values(const float* w, int64_t width, int64_t keys, const float* v0,
                     int64_t key_stride, const float* totals, const Shapes& sh, int64_t row,
                     int64_t kv, float* out) {
  constexpr int64_t lanes = sizeof(V) / sizeof(float);
  const auto load = [](const float* p) {  // unaligned
    V x;
    __builtin_memcpy(&x, p, sizeof(V));
    return x;
  };
  const auto store = [](float* p, V x) { __builtin_memcpy(p, &x, sizeof(V)); };
  constexpr int Q = C <= 4 ? 4 : 2;
  const int64_t g_count = sh.h / sh.kh, n = sh.n, queries = n * g_count, d = C * lanes;
  // A pass of fewer than Q queries runs the same code over rows of zero weights: one code path
  // for every query keeps its sums the same whatever the block (the compiler may contract the
  // products of two loops differently).
  const std::vector<float> zeros(width, 0.f);
  for (int64_t r0 = 0; r0 < queries; r0 += Q) {
    const int64_t count = queries - r0 < Q ? queries - r0 : Q;
    const float* wr[Q];
    for (int a = 0; a < Q; ++a) wr[a] = a < count ? w + (r0 + a) * width : zeros.data();
    V acc[Q][C] = {};
    for (int64_t j = 0; j < keys; ++j) {
      const float* vj = v0 + j * key_stride;
      V vv[C];
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) vv[c] = load(vj + c * lanes);
#pragma GCC unroll 4
      for (int a = 0; a < Q; ++a) {
        const float wj = wr[a][j];
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) acc[a][c] += vv[c] * wj;
      }
    }
    for (int64_t a = 0; a < count; ++a) {
      const int64_t r = r0 + a;
      float* o = out + ((row * n + r / g_count) * sh.h + kv * g_count + r % g_count) * d;
      const float inv = totals[r] > 0.f ? 1.f / totals[r] : 0.f;
      for (int c = 0; c < C; ++c) store(o + c * lanes, acc[a][c] * inv);
    }
  }
}

// One (row, kv head): the G = H / K query heads sharing that kv head, for every block token
// (queries r = t * G + g). Keys are the committed positions [0, length) then the block's
// [length, length + block); scores are taken 16 keys at a time from a transposed tile of
// keys, one lane per key (so a score does not depend on the tile it falls in), and every
// weighted sum runs over the keys in position order, masked keys adding exact zeros.
void attend_group(const Shapes& sh, const float* q, const float* k, const float* v,
                  int64_t length, const bool* mask, int64_t row, int64_t kv, float* out) {
  const int64_t g_count = sh.h / sh.kh, d = sh.d, n = sh.n, queries = n * g_count;
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  const int64_t key_stride = sh.kh * d;  // between consecutive positions of one kv head
  const float* k0 = k + kv * d;
  const float* v0 = v + kv * d;
  // Block slots past the cache's end hold no key (the engine's reserve keeps the block inside).
  const int64_t block = length + sh.m <= sh.s ? sh.m : (sh.s > length ? sh.s - length : 0);
  const int64_t keys = length + block, width = (keys + kLanes - 1) / kLanes * kLanes;
  std::vector<float> scores(queries * width), tile(d * kLanes);
  std::vector<const float*> qs(queries);
  for (int64_t r = 0; r < queries; ++r)
    qs[r] = q + ((row * n + r / g_count) * sh.h + kv * g_count + r % g_count) * d;
  for (int64_t j0 = 0; j0 < keys; j0 += kLanes) {
    const int64_t count = keys - j0 < kLanes ? keys - j0 : kLanes;
    for (int64_t l = 0; l < kLanes; ++l)
      for (int64_t i = 0; i < d; ++i)
        tile[i * kLanes + l] = l < count ? k0[(j0 + l) * key_stride + i] : 0.f;
    int64_t r = 0;
    for (; r + kQueries <= queries; r += kQueries) {
      vec acc[kQueries] = {};
      for (int64_t i = 0; i < d; ++i) {
        const vec key = load(tile.data() + i * kLanes);
#pragma GCC unroll 4
        for (int64_t a = 0; a < kQueries; ++a) acc[a] += key * qs[r + a][i];
      }
      for (int64_t a = 0; a < kQueries; ++a) store(&scores[(r + a) * width + j0], acc[a] * scale);
    }
    for (; r < queries; ++r) {
      vec acc = {};
      for (int64_t i = 0; i < d; ++i) acc += load(tile.data() + i * kLanes) * qs[r][i];
      store(&scores[r * width + j0], acc * scale);
    }
  }
  std::vector<float> totals(queries);
  for (int64_t r = 0; r < queries; ++r) {
    float* s = &scores[r * width];
    const bool* visible = mask + (row * n + r / g_count) * sh.m;
    for (int64_t m = 0; m < block; ++m)
      if (!visible[m]) s[length + m] = -INFINITY;
    for (int64_t j = keys; j < width; ++j) s[j] = -INFINITY;
    // The maximum 16 keys at a time (exact in any order), and the total as 16 lane sums (lane l
    // sums keys j = l mod 16 in position order) added lane by lane at the end: a fixed order
    // whatever the block, since keys past the visible ones add exact zeros. A sum of one key
    // after another cost ~4 cycles a key and query (half of a small model's attention).
    vec top16 = (vec){} - INFINITY;
    for (int64_t j = 0; j < width; j += kLanes) {
      const vec x = load(s + j);
      top16 = x > top16 ? x : top16;
    }
    float top = -INFINITY;
    for (int64_t l = 0; l < kLanes; ++l) top = top16[l] > top ? top16[l] : top;
    if (top == -INFINITY) top = 0.f;  // nothing visible (not reached by the engine): zeros
    vec lane_totals = {};
    for (int64_t j = 0; j < width; j += kLanes) {
      const vec e = exp16(load(s + j) - top);
      store(s + j, e);
      lane_totals += e;
    }
    float total = 0.f;
    for (int64_t l = 0; l < kLanes; ++l) total += lane_totals[l];
    totals[r] = total;
  }
  // out = sum_j w_j v_j / total, the keys in order.
  if (d % kLanes == 0 && d <= 8 * kLanes) {
    switch (d / kLanes) {
      case 1: weighted_values<vec, 1>(scores.data(), width, keys, v0, key_stride, totals.data(), sh, row, kv, out); break;
      case 2: weighted_values<vec, 2>(scores.data(), width, keys, v0, key_stride, totals.data(), sh, row, kv, out); break;
      case 3: weighted_values<vec, 3>(scores.data(), width, keys, v0, key_stride, totals.data(), sh, row, kv, out); break;
      case 4: weighted_values<vec, 4>(scores.data(), width, keys, v0, key_stride, totals.data(), sh, row, kv, out); break;
      case 5: weighted_values<vec, 5>(scores.data(), width, keys, v0, key_stride, totals.data(), sh, row, kv, out); break;
      case 6: weighted_values<vec, 6>(scores.data(), width, keys, v0, key_stride, totals.data(), sh, row, kv, out); break;
      case 7: weighted_values<vec, 7>(scores.data(), width, keys, v0, key_stride, totals.data(), sh, row, kv, out); break;
      default: weighted_values<vec, 8>(scores.data(), width, keys, v0, key_stride, totals.data(), sh, row, kv, out); break;
    }
    return;
  }
  if (d == 8) {
    weighted_values<half_vec, 1>(scores.data(), width, keys, v0, key_stride, totals.data(), sh, row, kv, out);
    return;
  }
  std::vector<float> acc(d);
  for (int64_t r = 0; r < queries; ++r) {
    for (int64_t i = 0; i < d; ++i) acc[i] = 0.f;
    for (int64_t j = 0; j < keys; ++j) {
      const float w = scores[r * width + j];
      const float* vj = v0 + j * key_stride;
      for (int64_t i = 0; i < d; ++i) acc[i] += vj[i] * w;
    }
    float* o = out + ((row * n + r / g_count) * sh.h + kv * g_count + r % g_count) * d;
    const float inv = totals[r] > 0.f ? 1.f / totals[r] : 0.f;
    for (int64_t i = 0; i < d; ++i) o[i] = acc[i] * inv;
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
  auto md = mask.dimensions();
  if (md.size() != 3)
    return ffi::Error::InvalidArgument("cache_attention: mask [B, N, M], lengths [B]");
  const Shapes sh{qd[0], qd[1], qd[2], qd[3], kd[2], kd[3], md[2]};
  if (kd[1] != sh.b || kd[4] != sh.d || sh.kh < 1 || sh.h % sh.kh != 0)
    return ffi::Error::InvalidArgument("cache_attention: q and the cache disagree");
  if (md[0] != sh.b || md[1] != sh.n || lengths.element_count() != sh.b)
    return ffi::Error::InvalidArgument("cache_attention: mask [B, N, M], lengths [B]");
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
  for (int64_t r = 0; r < sh.b; ++r) context += lp[r] + sh.m;
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
