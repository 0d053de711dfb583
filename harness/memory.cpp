#include "harness/memory.h"

#include <mutex>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

namespace sb::harness {
namespace {

thread_local int tBucket = MemoryTracker::kUnattributed;

// What the tracking allocator hands out as the DataPtr context: the wrapped allocation and
// the bucket and size to give back on free.
struct TrackedAllocation {
  c10::DataPtr inner;
  int bucket;
  int64_t bytes;
};

void deleteTracked(void* ctx) {
  auto* a = static_cast<TrackedAllocation*>(ctx);
  MemoryTracker::instance().freed(a->bucket, a->bytes);
  delete a;  // frees the wrapped allocation through its own deleter
}

class TrackingCpuAllocator final : public c10::Allocator {
 public:
  explicit TrackingCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) const override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    const int bucket = MemoryTracker::threadBucket();
    auto* ctx = new TrackedAllocation{std::move(inner), bucket, static_cast<int64_t>(n)};
    MemoryTracker::instance().allocated(bucket, static_cast<int64_t>(n));
    return {data, ctx, &deleteTracked, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

 private:
  c10::Allocator* base_;
};

}  // namespace

MemoryTracker& MemoryTracker::instance() {
  static MemoryTracker tracker;
  return tracker;
}

void MemoryTracker::install() {
  static std::once_flag once;
  std::call_once(once, [this] {
    static TrackingCpuAllocator allocator(c10::GetDefaultCPUAllocator());
    // Highest priority, so nothing installed later at a default priority replaces it.
    c10::SetCPUAllocator(&allocator, /*priority=*/255);
    installed_.store(true);
  });
}

void MemoryTracker::resetPeak(int rank) {
  auto& b = buckets_[index(rank)];
  b.peak.store(b.current.load());
}

void MemoryTracker::allocated(int bucket, int64_t bytes) {
  auto& b = buckets_[bucket];
  const int64_t now = b.current.fetch_add(bytes) + bytes;
  int64_t peak = b.peak.load();
  while (now > peak && !b.peak.compare_exchange_weak(peak, now)) {
  }
}

void MemoryTracker::freed(int bucket, int64_t bytes) { buckets_[bucket].current.fetch_sub(bytes); }

int MemoryTracker::threadBucket() { return tBucket; }

ScopedMemoryRank::ScopedMemoryRank(int rank) : previous_(tBucket) {
  tBucket = MemoryTracker::index(rank);
}

ScopedMemoryRank::~ScopedMemoryRank() { tBucket = previous_; }

}  // namespace sb::harness
