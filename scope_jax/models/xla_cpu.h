// What the XLA:CPU handlers (cpu_gemm.cc, cpu_attention.cc) share: MKL's GEMM signatures and ParallelFor.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "xla/ffi/api/ffi.h"

// (layout, transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) of cblas_sgemm_64 and
// cblas_gemm_bf16bf16f32_64, whose operands are float32 and bfloat16 (uint16_t) respectively.
template <typename T>
using Gemm = void (*)(int, int, int, int64_t, int64_t, int64_t, float, const T*, int64_t, const T*, int64_t,
                      float, float*, int64_t);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

// Tasks [0, total) run by the calling thread and by helpers on XLA's own intra-op pool. Whoever is free
// takes the next task, so a helper that starts late finds none left and nothing waits on a busy pool.
template <typename Run>
void ParallelFor(xla::ffi::ThreadPool pool, int64_t total, Run run) {
  struct Work {
    std::atomic<int64_t> next{0}, done{0};
    std::mutex mutex;
    std::condition_variable finished;
  };
  auto work = std::make_shared<Work>();
  auto take_tasks = [work, run, total] {
    for (int64_t index; (index = work->next.fetch_add(1)) < total;) {
      run(index);
      if (work->done.fetch_add(1) + 1 == total) {
        std::lock_guard<std::mutex> lock(work->mutex);
        work->finished.notify_all();
      }
    }
  };
  for (int64_t helper = 1; helper < std::min<int64_t>(pool.num_threads(), total); ++helper)
    pool.Schedule([take_tasks] { take_tasks(); });
  take_tasks();
  std::unique_lock<std::mutex> lock(work->mutex);
  work->finished.wait(lock, [&] { return work->done.load() == total; });
}
