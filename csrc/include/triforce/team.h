// A team of threads for one model forward on the CPU (decoder_layers), and the parallel loops of the
// kernels it calls, which run on that team when one is active and on OpenMP otherwise. Torch-free.
//
// Why: under OMP_WAIT_POLICY=PASSIVE (set by `import triforce`) an idle OpenMP worker sleeps, and waking it
// costs ~40-70 us on this project's 2-vCPU VM, so the kernels keep any work under 4 MiB on the calling
// thread (common.h, parallel_min_bytes). A SmolLM2-135M layer's seven linears are 0.4-3.5 MiB each: a
// batch-1 decode step read its 424 MB of layer weights on one core whatever the thread count (2 threads:
// 27 ms of linears, as on one). A forward of all layers in one native call opens one OpenMP region for the
// whole forward instead: its calling thread (the master) runs the forward as before, and the other
// threads wait for work by spinning, so handing them a linear's or an attention's share costs well under a
// microsecond. They wait only while the forward runs; then the region ends and they sleep as before.
//
// Robust to a busy machine (the reason for the passive policy: spinning workers preempted by other
// processes made every region wait for them). Work is split into indices that the master and the workers
// claim one at a time from one atomic counter; the master claims too, so a preempted worker delays a job
// only by the one index it may hold, never by a share assigned to it in advance. Waiting threads pause,
// then yield the CPU. A worker preempted while it holds an index still stalls the master until it runs
// again (a time slice: milliseconds), and a spinning worker takes CPU time from other processes and from the
// master on a busy machine; so when the master has waited for a worker more than kStall (and more than four
// times what its own indices of the job took), the team is "stalled": the rest of the forward runs on the
// master alone (with_team in csrc/cpu/decoder.cpp then leaves the next forwards without a team). Results
// never depend on the team: each kernel gives every output the same arithmetic whichever thread computes it.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "common.h"

namespace triforce {

// A wait loop's step: a pause instruction, and after a while a yield of the CPU to whatever else may run.
struct Backoff {
  int spins = 0;
  void wait() {
    if (++spins < 2048) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
      __builtin_ia32_pause();
#elif defined(__GNUC__) && defined(__aarch64__)
      asm volatile("yield");
#endif
    } else {
      std::this_thread::yield();
    }
  }
  void reset() { spins = 0; }
};

class Team {
 public:
  // Work below this many bytes (streamed, or one per multiply-add when compute-bound, as parallel_min_bytes
  // counts) runs on the calling thread: about 3 us of one core's stream, several times a hand-off.
  static constexpr int64_t kMinBytes = int64_t(64) << 10;
  // A wait for the workers longer than this, and than 4 of the master's own indices, marks the team stalled.
  static constexpr std::chrono::microseconds kStall{1000};

  // The team whose master is the calling thread, or null.
  static Team*& current() {
    static thread_local Team* team = nullptr;
    return team;
  }

  // kAdaptive: stalled after a long wait; kSerial: stalled from the start (every index on the master);
  // kWorkers: the workers run every index once joined() says they are there, and the master waits as long
  // as it takes (never stalled). The last two are test hooks.
  enum class Mode { kAdaptive, kSerial, kWorkers };
  explicit Team(int size, Mode mode = Mode::kAdaptive)
      : size_(size), stalled_(mode == Mode::kSerial), detect_(mode == Mode::kAdaptive), mode_(mode) {}

  // Master, before the first run(): how many workers serve (the region may have fewer threads than asked).
  void joined(int workers) { workers_ = workers; }
  int size() const { return size_; }
  // Indices the workers ran (read by the master after stop() and the region's end).
  int64_t worker_indices() const { return worker_indices_.load(std::memory_order_relaxed); }

  // Master: body(tid, i) for every i in [0, n), over the team (the master is tid 0). Returns once every
  // index has run. Indices are claimed one at a time: whichever thread is free takes the next. An exception
  // thrown by body (on any thread) is rethrown here, on the master, once every index has run or failed.
  template <typename F>
  void run(int64_t n, F& body) {
    if (n <= 0) return;
    if (stalled_ || n > 0xffffffffLL) {  // the master alone, in index order (the state holds 32-bit indices)
      for (int64_t i = 0; i < n; ++i) body(0, i);
      return;
    }
    error_ = nullptr;
    const uint64_t epoch = ++epoch_;
    Job& job = jobs_[epoch & 1];  // a job's slot is rewritten two epochs later, after the next job is out
    job.fn.store(&thunk<F>, std::memory_order_relaxed);
    job.arg.store(&body, std::memory_order_relaxed);
    job.n.store(n, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    state_.store(epoch << 32, std::memory_order_release);  // publish: (epoch, next index 0)
    const auto start = detect_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    const int64_t mine = mode_ == Mode::kWorkers && workers_ > 0 ? 0 : work(0);
    if (done_.load(std::memory_order_acquire) >= n) return rethrow();
    // A stall: a wait longer than kStall and than 4 of the master's own indices (coarse indices, such as
    // one row's whole attention, take milliseconds on whichever thread runs them).
    auto patience = std::chrono::steady_clock::duration(kStall);
    if (detect_ && mine > 0) patience = std::max(patience, 4 * (std::chrono::steady_clock::now() - start) / mine);
    Backoff b;
    std::chrono::steady_clock::time_point since{};
    for (int64_t k = 0; done_.load(std::memory_order_acquire) < n; ++k) {
      b.wait();
      if (k % 64 != 0 || stalled_ || !detect_) continue;  // the clock every 64 waits
      const auto now = std::chrono::steady_clock::now();
      if (k == 0) {
        since = now;
      } else if (now - since > patience) {
        stalled_ = true;
      }
    }
    rethrow();
  }
  // Whether a run() waited more than kStall for a worker (the master's).
  bool stalled() const { return stalled_; }

  // Worker tid >= 1: claim and run indices of each job until stop().
  void serve(int tid) {
    Backoff b;
    while (!stop_.load(std::memory_order_acquire)) {
      if (work(tid) > 0) {
        b.reset();
      } else {
        b.wait();
      }
    }
  }

  // Master: end serve() on every worker (after the last run()).
  void stop() { stop_.store(true, std::memory_order_release); }

 private:
  struct Job {
    std::atomic<void (*)(Team*, void*, int, int64_t)> fn{nullptr};
    std::atomic<void*> arg{nullptr};
    std::atomic<int64_t> n{0};
  };

  template <typename F>
  static void thunk(Team* team, void* arg, int tid, int64_t i) {
    try {
      (*static_cast<F*>(arg))(tid, i);
    } catch (...) {  // kept for the master: an exception must not leave a worker's OpenMP region
      std::lock_guard<std::mutex> lock(team->error_mutex_);
      if (!team->error_) team->error_ = std::current_exception();
    }
  }

  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

  // Claim and run indices of the current job until none is left; how many this thread ran. A claim succeeds
  // only while the state still holds the job's epoch and an index below its n, so the slot read before
  // it is that job's (its slot is rewritten only after all its indices were claimed and run).
  int64_t work(int tid) {
    int64_t ran = 0;
    uint64_t s = state_.load(std::memory_order_acquire);
    for (;;) {
      const Job& job = jobs_[(s >> 32) & 1];
      const int64_t i = static_cast<int64_t>(s & 0xffffffffu);
      const int64_t n = job.n.load(std::memory_order_relaxed);
      auto* fn = job.fn.load(std::memory_order_relaxed);
      void* arg = job.arg.load(std::memory_order_relaxed);
      if ((s >> 32) == 0 || i >= n) return ran;
      if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      fn(this, arg, tid, i);
      if (tid != 0) worker_indices_.fetch_add(1, std::memory_order_relaxed);
      done_.fetch_add(1, std::memory_order_acq_rel);
      ++ran;
      s = state_.load(std::memory_order_acquire);
    }
  }

  const int size_;
  uint64_t epoch_ = 0;    // the master's
  bool stalled_;          // the master's
  const bool detect_;
  const Mode mode_;
  int workers_ = 0;  // the master's
  Job jobs_[2];
  alignas(64) std::atomic<uint64_t> state_{0};  // (epoch << 32) | next unclaimed index
  alignas(64) std::atomic<int64_t> done_{0};    // indices of the current job that have run
  alignas(64) std::atomic<bool> stop_{false};
  alignas(64) std::atomic<int64_t> worker_indices_{0};
  std::mutex error_mutex_;
  std::exception_ptr error_;  // the first exception of the current job
};

// The master's team for the scope of a forward: sets Team::current() on the calling thread.
class TeamScope {
 public:
  explicit TeamScope(Team* team) : prev_(Team::current()) { Team::current() = team; }
  ~TeamScope() { Team::current() = prev_; }
  TeamScope(const TeamScope&) = delete;
  TeamScope& operator=(const TeamScope&) = delete;

 private:
  Team* prev_;
};

// Whether work of `bytes` is worth more than the calling thread: the active team's threshold (a
// hand-off), else parallel_min_bytes (an OpenMP region's wake-up).
inline bool worth_parallel_here(int64_t bytes) {
  const Team* team = Team::current();
  return team != nullptr ? team->size() > 1 && bytes >= Team::kMinBytes : worth_parallel(bytes);
}

// Threads a parallel loop below may use (per-thread scratch is sized by it): the team's, else OpenMP's.
inline int parallel_threads(bool par) {
  if (!par) return 1;
  if (const Team* team = Team::current()) return team->size();
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// body(tid, i) for i in [0, n), dynamically over the threads (tid < parallel_threads(par)): on the active
// team, else in an OpenMP region when par (schedule(dynamic, 1)), else on the calling thread.
template <typename F>
void parallel_items(bool par, int64_t n, F&& body) {
  if (Team* team = Team::current(); team != nullptr && par) {
    team->run(n, body);
    return;
  }
#if defined(_OPENMP)
#pragma omp parallel if (par)
  {
    const int tid = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) body(tid, i);
  }
#else
  for (int64_t i = 0; i < n; ++i) body(0, i);
#endif
}

// body(lo, hi) over contiguous ranges covering [0, n): on the active team in pieces of at least `grain`
// (about 4 per thread, claimed dynamically), else in an OpenMP region when par (one range per thread,
// schedule(static)), else as one range on the calling thread.
template <typename F>
void parallel_ranges(bool par, int64_t n, int64_t grain, F&& body) {
  if (n <= 0) return;
  if (Team* team = Team::current(); team != nullptr && par) {
    const int64_t pieces = std::max<int64_t>(1, std::min<int64_t>(4 * team->size(), n / std::max<int64_t>(grain, 1)));
    auto piece = [&](int, int64_t i) { body(i * n / pieces, (i + 1) * n / pieces); };
    team->run(pieces, piece);
    return;
  }
#if defined(_OPENMP)
#pragma omp parallel if (par)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = t * n / nt, hi = (t + 1) * n / nt;
    if (lo < hi) body(lo, hi);
  }
#else
  body(0, n);
#endif
}

}  // namespace triforce
