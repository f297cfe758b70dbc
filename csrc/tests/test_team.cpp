// Torch-free unit test of the forward's thread team (triforce/team.h; ctest, and a ThreadSanitizer build):
// workers on std::threads serving a master that runs jobs of every size, as decoder_layers' OpenMP region
// does. Every index of every job runs exactly once and before run() returns; the workers take part; an
// exception in a body is rethrown on the master after the job; a worker that holds an index for longer than
// Team::kStall stalls the team, whose later jobs run on the master alone; the serial and workers modes; the
// kernels' loops (parallel_items, parallel_ranges) on an active team cover their range exactly once.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "triforce/team.h"

using triforce::Team;
using Clock = std::chrono::steady_clock;

namespace {

// A team of `size` threads: the workers serve on std::threads until the scope ends.
struct Crew {
  Team team;
  std::vector<std::thread> workers;
  Crew(int size, Team::Mode mode = Team::Mode::kAdaptive) : team(size, mode) {
    for (int t = 1; t < size; ++t) workers.emplace_back([this, t] { team.serve(t); });
    team.joined(size - 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // let them start spinning
  }
  ~Crew() {
    team.stop();
    for (auto& w : workers) w.join();
  }
};

void busy_for(std::chrono::microseconds d) {
  const auto end = Clock::now() + d;
  while (Clock::now() < end) {
  }
}

// Jobs of sizes 0..n: every index once, all done when run() returns; in the workers mode the workers ran
// them all (with more than one thread), in the default mode whoever was free.
void every_index_once(int size, Team::Mode mode) {
  Crew crew(size, mode);
  int64_t indices = 0;
  std::vector<std::atomic<int>> hits(4096);
  for (int round = 0; round < 3; ++round) {
    for (int64_t n = 0; n <= 600; n += (n < 70 ? 1 : 37)) {
      for (int64_t i = 0; i < n; ++i) hits[i].store(0, std::memory_order_relaxed);
      auto body = [&](int tid, int64_t i) {
        EXPECT(tid >= 0 && tid < size);
        EXPECT(tid != 0 || size == 1 || mode != Team::Mode::kWorkers);
        hits[i].fetch_add(1, std::memory_order_relaxed);
      };
      crew.team.run(n, body);
      indices += n;
      int bad = 0;
      for (int64_t i = 0; i < n; ++i) bad += hits[i].load(std::memory_order_relaxed) != 1;
      EXPECT(bad == 0);
    }
  }
  // indices slow enough that a spinning worker takes some
  std::atomic<int64_t> total{0};
  auto slow = [&](int, int64_t) {
    busy_for(std::chrono::microseconds(20));
    total.fetch_add(1);
  };
  for (int j = 0; j < 20; ++j) crew.team.run(64, slow);
  EXPECT(total.load() == 20 * 64);
  if (mode == Team::Mode::kWorkers) {
    EXPECT(crew.team.worker_indices() == (size > 1 ? indices + 20 * 64 : 0));
    EXPECT(!crew.team.stalled());
  }
}

// An exception in a body, on whichever thread: every other index still runs, run() rethrows it.
void exception_reaches_the_master() {
  Crew crew(3, Team::Mode::kWorkers);
  for (int rep = 0; rep < 50; ++rep) {
    std::vector<std::atomic<int>> hits(100);
    auto body = [&](int, int64_t i) {
      hits[i].fetch_add(1);
      if (i == 37) throw std::runtime_error("index 37");
    };
    bool caught = false;
    try {
      crew.team.run(100, body);
    } catch (const std::runtime_error& e) {
      caught = std::string(e.what()) == "index 37";
    }
    EXPECT(caught);
    int bad = 0;
    for (auto& h : hits) bad += h.load() != 1;
    EXPECT(bad == 0);
    // the team goes on: the next job runs whole
    std::atomic<int> n{0};
    auto count = [&](int, int64_t) { n.fetch_add(1); };
    crew.team.run(10, count);
    EXPECT(n.load() == 10);
  }
}

// A worker that holds an index for 200 ms stalls an adaptive team; its later jobs run on the master alone,
// in order. The master's first index waits (up to 2 s) until the worker holds one, so that the worker does.
void stall_adaptive() {
  Crew crew(2, Team::Mode::kAdaptive);
  std::atomic<bool> worker_held{false};
  auto body = [&](int tid, int64_t) {
    if (tid != 0) {
      if (!worker_held.exchange(true)) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      return;
    }
    const auto give_up = Clock::now() + std::chrono::seconds(2);
    while (!worker_held.load() && Clock::now() < give_up) std::this_thread::yield();
    busy_for(std::chrono::microseconds(50));
  };
  crew.team.run(16, body);
  EXPECT(worker_held.load());
  EXPECT(crew.team.stalled());
  if (!crew.team.stalled()) return;
  std::vector<int64_t> order;
  std::vector<int> tids;
  auto record = [&](int tid, int64_t i) {
    busy_for(std::chrono::microseconds(20));
    order.push_back(i);  // unsynchronised on purpose: a stalled team runs on the master alone
    tids.push_back(tid);
  };
  crew.team.run(32, record);
  EXPECT(order.size() == 32);
  for (size_t i = 0; i < order.size(); ++i) EXPECT(order[i] == static_cast<int64_t>(i) && tids[i] == 0);
}

// In the workers mode the master waits as long as it takes: a worker holding indices for 5 ms each never
// stalls the team.
void no_stall_in_the_workers_mode() {
  Crew crew(2, Team::Mode::kWorkers);
  std::atomic<int> n{0};
  auto body = [&](int tid, int64_t) {
    EXPECT(tid == 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    n.fetch_add(1);
  };
  crew.team.run(4, body);
  EXPECT(n.load() == 4);
  EXPECT(!crew.team.stalled());
}

// kSerial: every index on the master, none taken by the workers.
void serial_mode() {
  Crew crew(3, Team::Mode::kSerial);
  std::vector<int> tids;
  auto body = [&](int tid, int64_t) {
    busy_for(std::chrono::microseconds(10));
    tids.push_back(tid);
  };
  for (int j = 0; j < 10; ++j) crew.team.run(40, body);
  EXPECT(tids.size() == 400);
  for (int t : tids) EXPECT(t == 0);
  EXPECT(crew.team.worker_indices() == 0);
}

// The kernels' loops on an active team (TeamScope) and, without one, on OpenMP or the calling thread.
void kernel_loops() {
  for (int with_team = 0; with_team < 2; ++with_team) {
    Crew crew(2, Team::Mode::kWorkers);
    triforce::TeamScope scope(with_team ? &crew.team : nullptr);
    for (bool par : {false, true}) {
      EXPECT(triforce::parallel_threads(par) >= 1);
      for (int64_t n : {0, 1, 5, 64, 1000, 12345}) {
        std::vector<std::atomic<int>> hits(n);
        const int threads = triforce::parallel_threads(par);  // on the master: Team::current() is its own
        triforce::parallel_items(par, n, [&](int tid, int64_t i) {
          EXPECT(tid >= 0 && tid < threads);
          hits[i].fetch_add(1);
        });
        int bad = 0;
        for (auto& h : hits) bad += h.load() != 1;
        EXPECT(bad == 0);
        for (int64_t grain : {1, 8, 100}) {
          std::vector<std::atomic<int>> cover(n);
          triforce::parallel_ranges(par, n, grain, [&](int64_t lo, int64_t hi) {
            EXPECT(0 <= lo && lo < hi && hi <= n);
            for (int64_t i = lo; i < hi; ++i) cover[i].fetch_add(1);
          });
          bad = 0;
          for (auto& c : cover) bad += c.load() != 1;
          EXPECT(bad == 0);
        }
      }
    }
    const bool expected = with_team ? true : triforce::worth_parallel(Team::kMinBytes);
    EXPECT(triforce::worth_parallel_here(Team::kMinBytes) == expected);
    if (with_team) EXPECT(!triforce::worth_parallel_here(Team::kMinBytes - 1));
  }
  EXPECT(Team::current() == nullptr);  // TeamScope restored it
}

}  // namespace

int main() {
  for (int size : {1, 2, 3, 4}) {
    every_index_once(size, Team::Mode::kWorkers);
    every_index_once(size, Team::Mode::kAdaptive);
  }
  exception_reaches_the_master();
  stall_adaptive();
  no_stall_in_the_workers_mode();
  serial_mode();
  kernel_loops();
  if (failures) {
    std::printf("%d failure(s)\n", failures);
    return 1;
  }
  std::printf("test_team: all passed\n");
  return 0;
}
