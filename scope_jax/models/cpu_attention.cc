// Attention's forward and backward pass for XLA:CPU as FFI handlers (scope_jax/models/cpu_attention.py),
// with the products through single-threaded MKL GEMMs and exp through MKL's vsExp_64 (set from Python).
//
// Operands are those of attention.py: queries q [rows..., H, Q, d], keys and values [rows..., H, S, d],
// query positions [rows..., Q], key positions [rows..., S] (int32); key s is visible to query t iff
// k_pos[s] <= q_pos[t]. Each (row, head) is one task on XLA's pool. Its queries are taken kTile at a time,
// and of its keys only the kTile-tiles that some query of the tile sees take part (a causal mask leaves
// out the tiles above the diagonal); inside a tile each key is masked as the visibility says.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "xla_cpu.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

static Gemm<float> sgemm = nullptr;
static Gemm<uint16_t> gemm_bf16 = nullptr;
static void (*exp_n)(int64_t, const float*, float*) = nullptr;

extern "C" void set_functions(void* sgemm_fn, void* gemm_bf16_fn, void* exp_fn) {
  sgemm = reinterpret_cast<Gemm<float>>(sgemm_fn);
  gemm_bf16 = reinterpret_cast<Gemm<uint16_t>>(gemm_bf16_fn);
  exp_n = reinterpret_cast<void (*)(int64_t, const float*, float*)>(exp_fn);
}

constexpr int64_t kTile = 64;
constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// The elementwise loops, compiled on x86-64 for AVX-512, AVX2 and the baseline, the best the CPU runs chosen
// at load time; the reductions keep kLanes partial results so that they vectorize without reassociating.
#if defined(__x86_64__)
#define VECTORIZED __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define VECTORIZED
#endif
constexpr int64_t kLanes = 16;

VECTORIZED static float Max(const float* x, int64_t n) {
  float lanes[kLanes];
  std::fill(lanes, lanes + kLanes, kMinusInf);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] = lanes[j] > x[i + j] ? lanes[j] : x[i + j];
  for (; i < n; ++i) lanes[0] = lanes[0] > x[i] ? lanes[0] : x[i];
  return *std::max_element(lanes, lanes + kLanes);
}

VECTORIZED static float Sum(const float* x, int64_t n) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] += x[i + j];
  for (; i < n; ++i) lanes[0] += x[i];
  float total = 0.0f;
  for (int64_t j = 0; j < kLanes; ++j) total += lanes[j];
  return total;
}

// x[s] - shift where key s is visible to a query at `position`, else -inf.
VECTORIZED static void MaskAndShift(float* x, const int32_t* key, int64_t n, int32_t position, float shift) {
  for (int64_t s = 0; s < n; ++s) x[s] = key[s] <= position ? x[s] - shift : kMinusInf;
}

VECTORIZED static void Shift(float* x, int64_t n, float shift) {
  for (int64_t i = 0; i < n; ++i) x[i] -= shift;
}

VECTORIZED static void Scale(float* x, int64_t n, float factor) {
  for (int64_t i = 0; i < n; ++i) x[i] *= factor;
}

// d_probs (in place) -> d_scores = probs * (d_probs - delta) * scale.
VECTORIZED static void ScoreGradient(float* d, const float* probs, int64_t n, float delta, float scale) {
  for (int64_t i = 0; i < n; ++i) d[i] = probs[i] * (d[i] - delta) * scale;
}

// The element types: float32, and bfloat16 as its bits (rounded to nearest even; no NaN reaches it).
static Gemm<float> GemmFor(float*) { return sgemm; }
static Gemm<uint16_t> GemmFor(uint16_t*) { return gemm_bf16; }

VECTORIZED static void ToBfloat16(const float* x, int64_t n, uint16_t* y) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, 4);
    y[i] = uint16_t((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
  }
}

// Float32 matrix [rows, cols] as a T matrix: the same storage when T is float, else `copy`.
template <typename T>
static const T* AsOperand(const float* x, int64_t size, std::vector<T>& copy) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    copy.resize(size);
    ToBfloat16(x, size, copy.data());
    return copy.data();
  }
}

// The key tiles that some query of a query tile sees, merged into runs of consecutive keys, with each
// run's first column in the tile's compacted score matrix (its `width` columns: the runs side by side).
struct Runs {
  std::vector<int64_t> first, length, column;
  int64_t width = 0;
};

static Runs VisibleRuns(const int32_t* k_pos, int64_t keys, int32_t last_query) {
  Runs runs;
  for (int64_t s0 = 0; s0 < keys; s0 += kTile) {
    const int64_t s1 = std::min(keys, s0 + kTile);
    int32_t first_key = std::numeric_limits<int32_t>::max();
    for (int64_t s = s0; s < s1; ++s) first_key = std::min(first_key, k_pos[s]);
    if (first_key > last_query) continue;
    if (!runs.first.empty() && runs.first.back() + runs.length.back() == s0) {
      runs.length.back() += s1 - s0;
    } else {
      runs.first.push_back(s0);
      runs.length.push_back(s1 - s0);
      runs.column.push_back(runs.width);
    }
    runs.width += s1 - s0;
  }
  return runs;
}

// The checked operands of a call: the GEMM for their dtype, the sizes, and where a (row, head) task's lie.
template <typename T>
struct Operands {
  Gemm<T> gemm;
  int64_t rows, heads, queries, keys, dim;
  const T *q, *k, *v;
  const int32_t *q_pos, *k_pos;

  int64_t tasks() const { return rows * heads; }
  const int32_t* query_positions(int64_t task) const { return q_pos + task / heads * queries; }
  const int32_t* key_positions(int64_t task) const { return k_pos + task / heads * keys; }
  int64_t query_offset(int64_t task, int64_t t0) const { return task * queries + t0; }  // of [.., H, Q]
  const T* keys_of(int64_t task) const { return k + task * keys * dim; }
  const T* values_of(int64_t task) const { return v + task * keys * dim; }
};

template <typename T, ffi::DataType dtype>
static ffi::Error Check(ffi::Buffer<dtype> q, ffi::Buffer<dtype> k, ffi::Buffer<dtype> v,
                        ffi::Buffer<ffi::S32> q_pos, ffi::Buffer<ffi::S32> k_pos, Operands<T>* operands) {
  const Gemm<T> gemm = GemmFor(static_cast<T*>(nullptr));
  if (gemm == nullptr || exp_n == nullptr) return ffi::Error::Internal("cpu_attention: MKL was not set");
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  auto qpd = q_pos.dimensions(), kpd = k_pos.dimensions();
  const size_t rank = qd.size();
  if (rank < 3 || kd.size() != rank || vd.size() != rank || qpd.size() != rank - 2 || kpd.size() != rank - 2)
    return ffi::Error::InvalidArgument(
        "cpu_attention: q, k, v [rows..., H, length, d] and positions [rows..., length] expected");
  int64_t rows = 1;
  for (size_t i = 0; i + 3 < rank; ++i) {
    if (qd[i] != kd[i] || qd[i] != vd[i] || qd[i] != qpd[i] || qd[i] != kpd[i])
      return ffi::Error::InvalidArgument("cpu_attention: the row dimensions differ");
    rows *= qd[i];
  }
  for (size_t i = rank - 3; i < rank; ++i)
    if (kd[i] != vd[i]) return ffi::Error::InvalidArgument("cpu_attention: keys and values differ in shape");
  if (qd[rank - 3] != kd[rank - 3] || qd[rank - 1] != kd[rank - 1] || qpd[rank - 3] != qd[rank - 2] ||
      kpd[rank - 3] != kd[rank - 2])
    return ffi::Error::InvalidArgument("cpu_attention: heads, lengths or head dims differ");
  *operands = Operands<T>{gemm, rows, qd[rank - 3], qd[rank - 2], kd[rank - 2], qd[rank - 1],
                          static_cast<const T*>(q.untyped_data()), static_cast<const T*>(k.untyped_data()),
                          static_cast<const T*>(v.untyped_data()), q_pos.typed_data(), k_pos.typed_data()};
  return ffi::Error::Success();
}

// The three products of a query tile with the keys of `runs` (rows of [keys, d] arrays), whose side of
// width `runs.width` lies in a tile's compacted [tile, width] matrix:
// out[:, run columns] = alpha * a [tile, d] @ keys[run]^T, for each run.
template <typename T>
static void ProductWithRunKeys(Gemm<T> gemm, const Runs& runs, float alpha, const T* a, int64_t tile,
                               const T* keys, int64_t d, float* out) {
  for (size_t r = 0; r < runs.first.size(); ++r)
    gemm(kRowMajor, kNoTrans, kTrans, tile, runs.length[r], d, alpha, a, d, keys + runs.first[r] * d, d,
         0.0f, out + runs.column[r], runs.width);
}

// out [tile, d] = sum over runs of p[:, run columns] @ values[run] (0 without runs).
template <typename T>
static void ProductOverRuns(Gemm<T> gemm, const Runs& runs, const T* p, int64_t tile, const T* values,
                            int64_t d, float* out) {
  for (size_t r = 0; r < runs.first.size(); ++r)
    gemm(kRowMajor, kNoTrans, kNoTrans, tile, d, runs.length[r], 1.0f, p + runs.column[r], runs.width,
         values + runs.first[r] * d, d, r == 0 ? 0.0f : 1.0f, out, d);
  if (runs.first.empty()) std::memset(out, 0, sizeof(float) * tile * d);
}

// sums[run] += p[:, run columns]^T @ x [tile, d], for each run.
template <typename T>
static void AddToRunKeys(Gemm<T> gemm, const Runs& runs, const T* p, int64_t tile, const T* x, int64_t d,
                         float* sums) {
  for (size_t r = 0; r < runs.first.size(); ++r)
    gemm(kRowMajor, kTrans, kNoTrans, runs.length[r], d, tile, 1.0f, p + runs.column[r], runs.width, x, d,
         1.0f, sums + runs.first[r] * d, d);
}

// scores[i, run columns] = scale * q_tile[i] . k[run keys] for each run: [tile, runs.width], then each entry
// minus its row's `shift` where key s is visible to query i, -inf where it is not.
template <typename T>
static void ShiftedScores(Gemm<T> gemm, int64_t d, const T* q_tile, const T* k, const int32_t* q_pos,
                          const int32_t* k_pos, int64_t tile, const Runs& runs, const float* shift,
                          float* scores) {
  const float scale = 1.0f / std::sqrt(float(d));
  const int64_t width = runs.width;
  ProductWithRunKeys(gemm, runs, scale, q_tile, tile, k, d, scores);
  for (int64_t i = 0; i < tile; ++i)
    for (size_t r = 0; r < runs.first.size(); ++r)
      MaskAndShift(scores + i * width + runs.column[r], k_pos + runs.first[r], runs.length[r], q_pos[i],
                   shift[i]);
}

// out [rows..., H, Q, d] (float32) and the log-sum-exp of each query's visible scores [rows..., H, Q]
// (+inf for a query that sees nothing, whose output is 0).
template <ffi::DataType dtype, typename T>
static ffi::Error Forward(ffi::ThreadPool pool, ffi::Buffer<dtype> q, ffi::Buffer<dtype> k,
                          ffi::Buffer<dtype> v, ffi::Buffer<ffi::S32> q_pos, ffi::Buffer<ffi::S32> k_pos,
                          ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> lse) {
  Operands<T> in;
  if (auto error = Check(q, k, v, q_pos, k_pos, &in); error.failure()) return error;
  const int64_t d = in.dim;
  ParallelFor(pool, in.tasks(), [&](int64_t task) {
    const int32_t *qp = in.query_positions(task), *kp = in.key_positions(task);
    std::vector<float> scores(kTile * in.keys), row_max(kTile);
    std::vector<T> probs;
    for (int64_t t0 = 0; t0 < in.queries; t0 += kTile) {
      const int64_t tile = std::min(kTile, in.queries - t0), at = in.query_offset(task, t0);
      const T* q_tile = in.q + at * d;
      float* out_tile = out->typed_data() + at * d;
      float* lse_tile = lse->typed_data() + at;
      const Runs runs = VisibleRuns(kp, in.keys, *std::max_element(qp + t0, qp + t0 + tile));
      const int64_t width = runs.width;
      std::fill(row_max.begin(), row_max.end(), 0.0f);
      ShiftedScores(in.gemm, d, q_tile, in.keys_of(task), qp + t0, kp, tile, runs, row_max.data(),
                    scores.data());
      for (int64_t i = 0; i < tile; ++i) {
        float* row = scores.data() + i * width;
        const float top = Max(row, width);
        row_max[i] = top == kMinusInf ? 0.0f : top;  // a query that sees nothing: every entry stays -inf
        Shift(row, width, row_max[i]);
      }
      exp_n(tile * width, scores.data(), scores.data());
      const T* p = AsOperand(scores.data(), tile * width, probs);
      ProductOverRuns(in.gemm, runs, p, tile, in.values_of(task), d, out_tile);
      for (int64_t i = 0; i < tile; ++i) {
        const float total = Sum(scores.data() + i * width, width);
        lse_tile[i] = total > 0.0f ? row_max[i] + std::log(total) : std::numeric_limits<float>::infinity();
        Scale(out_tile + i * d, d, total > 0.0f ? 1.0f / total : 0.0f);
      }
    }
  });
  return ffi::Error::Success();
}

// dq [rows..., H, Q, d], dk and dv [rows..., H, S, d] (float32) from the output gradient `grad` (q's dtype),
// the forward pass's log-sum-exp and delta = sum(grad * out) of each query [rows..., H, Q]. Each tile's
// probabilities are recomputed from the log-sum-exp.
template <ffi::DataType dtype, typename T>
static ffi::Error Backward(ffi::ThreadPool pool, ffi::Buffer<dtype> q, ffi::Buffer<dtype> k,
                           ffi::Buffer<dtype> v, ffi::Buffer<ffi::S32> q_pos, ffi::Buffer<ffi::S32> k_pos,
                           ffi::Buffer<dtype> grad, ffi::Buffer<ffi::F32> lse, ffi::Buffer<ffi::F32> delta,
                           ffi::ResultBuffer<ffi::F32> dq, ffi::ResultBuffer<ffi::F32> dk,
                           ffi::ResultBuffer<ffi::F32> dv) {
  Operands<T> in;
  if (auto error = Check(q, k, v, q_pos, k_pos, &in); error.failure()) return error;
  auto qd = q.dimensions(), gd = grad.dimensions(), ld = lse.dimensions(), dd = delta.dimensions();
  if (!std::equal(qd.begin(), qd.end(), gd.begin(), gd.end()) ||
      !std::equal(qd.begin(), qd.end() - 1, ld.begin(), ld.end()) ||
      !std::equal(qd.begin(), qd.end() - 1, dd.begin(), dd.end()))
    return ffi::Error::InvalidArgument(
        "cpu_attention: grad [..., Q, d] and lse, delta [..., Q] must match q");
  const auto* grad_data = static_cast<const T*>(grad.untyped_data());
  const int64_t d = in.dim;
  const float scale = 1.0f / std::sqrt(float(d));
  ParallelFor(pool, in.tasks(), [&](int64_t task) {
    const int32_t *qp = in.query_positions(task), *kp = in.key_positions(task);
    const T *k_task = in.keys_of(task), *v_task = in.values_of(task);
    float* dk_task = dk->typed_data() + task * in.keys * d;
    float* dv_task = dv->typed_data() + task * in.keys * d;
    std::memset(dk_task, 0, sizeof(float) * in.keys * d);
    std::memset(dv_task, 0, sizeof(float) * in.keys * d);
    std::vector<float> probs(kTile * in.keys), d_scores(kTile * in.keys);
    std::vector<T> probs_copy, d_scores_copy;
    for (int64_t t0 = 0; t0 < in.queries; t0 += kTile) {
      const int64_t tile = std::min(kTile, in.queries - t0), at = in.query_offset(task, t0);
      const T* q_tile = in.q + at * d;
      const T* grad_tile = grad_data + at * d;
      const float* lse_tile = lse.typed_data() + at;
      const float* delta_tile = delta.typed_data() + at;
      const Runs runs = VisibleRuns(kp, in.keys, *std::max_element(qp + t0, qp + t0 + tile));
      const int64_t width = runs.width;
      ShiftedScores(in.gemm, d, q_tile, k_task, qp + t0, kp, tile, runs, lse_tile, probs.data());
      exp_n(tile * width, probs.data(), probs.data());  // exp(-inf) = 0 where invisible or lse = +inf
      ProductWithRunKeys(in.gemm, runs, 1.0f, grad_tile, tile, v_task, d, d_scores.data());  // d_probs
      for (int64_t i = 0; i < tile; ++i)
        ScoreGradient(d_scores.data() + i * width, probs.data() + i * width, width, delta_tile[i], scale);
      const T* p = AsOperand(probs.data(), tile * width, probs_copy);
      const T* ds = AsOperand(d_scores.data(), tile * width, d_scores_copy);
      ProductOverRuns(in.gemm, runs, ds, tile, k_task, d, dq->typed_data() + at * d);
      AddToRunKeys(in.gemm, runs, ds, tile, q_tile, d, dk_task);
      AddToRunKeys(in.gemm, runs, p, tile, grad_tile, d, dv_task);
    }
  });
  return ffi::Error::Success();
}

// Both passes' bindings start with the operands: the pool, q, k, v, q_pos, k_pos.
template <ffi::DataType dtype>
static auto OperandsBinding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .template Arg<ffi::Buffer<dtype>>()
      .template Arg<ffi::Buffer<dtype>>()
      .template Arg<ffi::Buffer<dtype>>()
      .template Arg<ffi::Buffer<ffi::S32>>()
      .template Arg<ffi::Buffer<ffi::S32>>();
}

template <ffi::DataType dtype>
static auto ForwardBinding() {
  return OperandsBinding<dtype>().template Ret<ffi::Buffer<ffi::F32>>().template Ret<ffi::Buffer<ffi::F32>>();
}

template <ffi::DataType dtype>
static auto BackwardBinding() {
  return OperandsBinding<dtype>()
      .template Arg<ffi::Buffer<dtype>>()
      .template Arg<ffi::Buffer<ffi::F32>>()
      .template Arg<ffi::Buffer<ffi::F32>>()
      .template Ret<ffi::Buffer<ffi::F32>>()
      .template Ret<ffi::Buffer<ffi::F32>>()
      .template Ret<ffi::Buffer<ffi::F32>>();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttentionForward, (Forward<ffi::F32, float>), ForwardBinding<ffi::F32>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(AttentionForwardBf16, (Forward<ffi::BF16, uint16_t>),
                              ForwardBinding<ffi::BF16>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(AttentionBackward, (Backward<ffi::F32, float>), BackwardBinding<ffi::F32>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(AttentionBackwardBf16, (Backward<ffi::BF16, uint16_t>),
                              BackwardBinding<ffi::BF16>());
