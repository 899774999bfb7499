// op(a) @ op(b) with a float32 product through a single-threaded 64-bit-integer MKL GEMM (set from Python:
// MKL's float32 GEMM and its bfloat16 one), as XLA FFI handlers for the CPU
// (scope_jax/models/cpu_gemm.py). Operands are [batch..., rows, cols] with equal batch dimensions (the
// leading dimensions a vmap broadcasts); op transposes the last two dimensions when asked.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "xla_cpu.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

static Gemm<float> sgemm = nullptr;
static Gemm<uint16_t> gemm_bf16 = nullptr;

extern "C" void set_functions(void* sgemm_fn, void* gemm_bf16_fn) {
  sgemm = reinterpret_cast<Gemm<float>>(sgemm_fn);
  gemm_bf16 = reinterpret_cast<Gemm<uint16_t>>(gemm_bf16_fn);
}

constexpr int64_t kMinSide = 64, kBlocksPerThread = 2;  // a block's side at least; blocks per pool thread

template <ffi::DataType dtype, typename T>
static ffi::Error Product(Gemm<T> gemm, ffi::ThreadPool pool, ffi::Buffer<dtype> a, ffi::Buffer<dtype> b,
                          ffi::ResultBuffer<ffi::F32> c, bool transpose_a, bool transpose_b) {
  if (gemm == nullptr) return ffi::Error::Internal("cpu_gemm: no GEMM was set for this dtype");
  auto ad = a.dimensions(), bd = b.dimensions(), cd = c->dimensions();
  const size_t rank = ad.size();
  if (rank < 2 || bd.size() != rank || cd.size() != rank)
    return ffi::Error::InvalidArgument("cpu_gemm: operands of equal rank >= 2 expected");
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < rank; ++i) {
    if (ad[i] != bd[i] || ad[i] != cd[i])
      return ffi::Error::InvalidArgument("cpu_gemm: batch dimensions differ");
    batch *= ad[i];
  }
  const int64_t a_rows = ad[rank - 2], a_cols = ad[rank - 1], b_rows = bd[rank - 2], b_cols = bd[rank - 1];
  const int64_t m = transpose_a ? a_cols : a_rows, k = transpose_a ? a_rows : a_cols;
  const int64_t n = transpose_b ? b_rows : b_cols;
  if ((transpose_b ? b_cols : b_rows) != k || cd[rank - 2] != m || cd[rank - 1] != n)
    return ffi::Error::InvalidArgument("cpu_gemm: shapes do not multiply");
  float* out = c->typed_data();
  if (m == 0 || n == 0 || batch == 0) return ffi::Error::Success();
  if (k == 0) {
    std::memset(out, 0, sizeof(float) * batch * m * n);
    return ffi::Error::Success();
  }
  // Blocks of every batch entry's product, split along its longer side (rows or columns), each a
  // single-threaded GEMM, run on XLA's own intra-op threads.
  const bool by_rows = m >= n;
  const int64_t side = by_rows ? m : n;
  const int64_t blocks =
      std::max<int64_t>(1, std::min<int64_t>(side / kMinSide, kBlocksPerThread * pool.num_threads()));
  auto run_block = [=, a = static_cast<const T*>(a.untyped_data()),
                     b = static_cast<const T*>(b.untyped_data())](int64_t index) {
    const int64_t i = index / blocks, block = index % blocks;
    const int64_t first = side * block / blocks, size = side * (block + 1) / blocks - first;
    const T* a_i = a + i * a_rows * a_cols;
    const T* b_i = b + i * b_rows * b_cols;
    float* c_i = out + i * m * n;
    if (by_rows) {  // rows [first, first + size) of op(a)
      a_i += transpose_a ? first : first * a_cols;
      c_i += first * n;
    } else {  // columns [first, first + size) of op(b)
      b_i += transpose_b ? first * b_cols : first;
      c_i += first;
    }
    gemm(kRowMajor, transpose_a ? kTrans : kNoTrans, transpose_b ? kTrans : kNoTrans, by_rows ? size : m,
         by_rows ? n : size, k, 1.0f, a_i, a_cols, b_i, b_cols, 0.0f, c_i, n);
  };
  ParallelFor(pool, batch * blocks, run_block);
  return ffi::Error::Success();
}

static ffi::Error Float32(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b,
                         ffi::ResultBuffer<ffi::F32> c, bool transpose_a, bool transpose_b) {
  return Product(sgemm, pool, a, b, c, transpose_a, transpose_b);
}

static ffi::Error Bfloat16(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16> a, ffi::Buffer<ffi::BF16> b,
                          ffi::ResultBuffer<ffi::F32> c, bool transpose_a, bool transpose_b) {
  return Product(gemm_bf16, pool, a, b, c, transpose_a, transpose_b);
}

template <ffi::DataType dtype>
static auto Binding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .template Arg<ffi::Buffer<dtype>>()
      .template Arg<ffi::Buffer<dtype>>()
      .template Ret<ffi::Buffer<ffi::F32>>()
      .template Attr<bool>("transpose_a")
      .template Attr<bool>("transpose_b");
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(CpuGemm, Float32, Binding<ffi::F32>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(CpuGemmBf16, Bfloat16, Binding<ffi::BF16>());
