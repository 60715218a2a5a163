// launcher.cpp: runs a kernel compiled against metal_shim.hpp over its grid on the CPU.
//
// The harness gives each kernel a thunk `void thunk(void* const* args, unsigned group, unsigned
// lane)` that calls the kernel as thread `lane` of threadgroup `group`. A *cooperative* kernel
// (one using threadgroup memory and barriers) gets one OS thread per thread of its threadgroup,
// all sharing a std::barrier, so `threadgroup_barrier` really waits for the whole group; the
// threads step through the threadgroups together, one group at a time (the kernel's threadgroup
// arrays are function statics, shared by the group that runs), and meet at the barrier again
// between groups. Any other kernel has independent threads: they run one after the other, split
// over a few OS threads when the grid is large.
//
// Compiled once per toolchain and flags (it is the only part that needs <thread> and <barrier>),
// then linked into every routine's shared object or sanitizer executable.
#include <algorithm>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

thread_local std::barrier<>* group_barrier = nullptr;

using Thunk = void (*)(void* const* args, unsigned group, unsigned lane);

constexpr unsigned long kSplitWork = 1ul << 16;  // independent threads worth several OS threads

}  // namespace

extern "C" void ocannl_shim_threadgroup_barrier(void) {
  if (group_barrier == nullptr) {
    std::fprintf(stderr, "metal shim: threadgroup_barrier in a kernel launched without threadgroup threads\n");
    std::abort();
  }
  group_barrier->arrive_and_wait();
}

extern "C" void ocannl_shim_dispatch(Thunk thunk, void* const* args, unsigned groups, unsigned threads,
                                     int cooperative) {
  if (groups == 0 || threads == 0) return;
  if (cooperative) {
    std::barrier<> sync(threads);
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (unsigned lane = 0; lane < threads; ++lane) {
      pool.emplace_back([&, lane] {
        group_barrier = &sync;
        for (unsigned group = 0; group < groups; ++group) {
          thunk(args, group, lane);
          sync.arrive_and_wait();  // the next group reuses the threadgroup memory
        }
        group_barrier = nullptr;
      });
    }
    for (auto& t : pool) t.join();
    return;
  }
  const unsigned long work = (unsigned long)groups * threads;
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  const unsigned workers = work >= kSplitWork ? std::min(hardware, groups) : 1u;
  auto run = [&](unsigned first) {
    for (unsigned group = first; group < groups; group += workers)
      for (unsigned lane = 0; lane < threads; ++lane) thunk(args, group, lane);
  };
  if (workers == 1) {
    run(0);
    return;
  }
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < workers; ++w) pool.emplace_back(run, w);
  for (auto& t : pool) t.join();
}
