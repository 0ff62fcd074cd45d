// Work spread over threads: ParallelFor and the order that hands uneven work out largest first.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace patchgen::cli {

/// Runs fn(i) for i in [0, n) on up to `jobs` threads.
template <class F>
void ParallelFor(size_t n, unsigned jobs, F fn) {
  unsigned threads = std::max(1u, std::min<unsigned>(jobs, static_cast<unsigned>(n)));
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (size_t i = next++; i < n; i = next++) fn(i);
    });
  }
  for (auto& th : pool) th.join();
}

/// The indices [0, n) by decreasing `size(i)` (ties in index order): the order in which to hand
/// work of uneven sizes to ParallelFor, so that no worker starts a large item last.
template <class Size>
std::vector<size_t> LargestFirst(size_t n, Size size) {
  std::vector<uintmax_t> sizes(n);
  for (size_t i = 0; i < n; ++i) sizes[i] = size(i);
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  return order;
}

}  // namespace patchgen::cli
