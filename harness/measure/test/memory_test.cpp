#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <thread>

#include "harness/measure/memory.h"

namespace sb::harness {
namespace {

TEST(MemoryTracker, CountsTensorBytesAgainstTheAllocatingRank) {
  auto& m = MemoryTracker::instance();
  m.install();
  ASSERT_TRUE(m.installed());
  const int rank = 5;
  const int64_t before = m.current(rank);
  at::Tensor t;
  {
    ScopedMemoryRank scope(rank);
    m.resetPeak(rank);
    t = at::empty({1000, 250}, at::kFloat);          // exactly 1,000,000 bytes
    at::Tensor tmp = at::empty({500}, at::kDouble);  // 4,000 bytes, freed at scope end
  }
  EXPECT_EQ(m.current(rank) - before, 1000000);
  EXPECT_EQ(m.peak(rank) - before, 1004000);
  // Freed on another thread: still given back to rank 5.
  std::thread([&] { t = at::Tensor(); }).join();
  EXPECT_EQ(m.current(rank), before);
}

TEST(MemoryTracker, UnattributedAllocationsDoNotCountAgainstRanks) {
  auto& m = MemoryTracker::instance();
  m.install();
  const int64_t before = m.current(0);
  at::Tensor t = at::empty({4096}, at::kFloat);
  EXPECT_EQ(m.current(0), before);
}

}  // namespace
}  // namespace sb::harness
