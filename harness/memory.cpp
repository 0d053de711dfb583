#include "harness/memory.h"

#include <cstdio>
#include <cstdlib>

#include <mutex>
#include <unordered_map>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

namespace sb::harness {
namespace {

thread_local int tBucket = MemoryTracker::kUnattributed;

// Which bucket and how many bytes each live allocation was counted as. ATen frees some buffers
// through the allocator's raw deleter with nothing but the pointer (and asserts that a DataPtr's
// context is its data), so the bookkeeping is keyed by the pointer rather than carried in a
// context object.
struct LiveAllocation {
  int bucket;
  int64_t bytes;
};
std::mutex gLiveMutex;
std::unordered_map<void*, LiveAllocation>& liveAllocations() {
  static auto* live = new std::unordered_map<void*, LiveAllocation>();  // outlives static dtors
  return *live;
}
c10::Allocator* gBase = nullptr;

void deleteTracked(void* ptr) {
  if (ptr == nullptr) return;
  LiveAllocation a{MemoryTracker::kUnattributed, 0};
  {
    std::lock_guard<std::mutex> lock(gLiveMutex);
    auto it = liveAllocations().find(ptr);
    if (it != liveAllocations().end()) {
      a = it->second;
      liveAllocations().erase(it);
    }
  }
  MemoryTracker::instance().freed(a.bucket, a.bytes);
  gBase->raw_deleter()(ptr);
}

class TrackingCpuAllocator final : public c10::Allocator {
 public:
  // LibTorch 2.3 made allocate() non-const and added copy_data().
#if SB_TORCH_VERSION_NUM >= 203
  c10::DataPtr allocate(size_t n) override {
#else
  c10::DataPtr allocate(size_t n) const override {
#endif
    void* data = gBase->raw_allocate(n);
    const int bucket = MemoryTracker::threadBucket();
    if (data != nullptr) {
      std::lock_guard<std::mutex> lock(gLiveMutex);
      liveAllocations()[data] = {bucket, static_cast<int64_t>(n)};
    }
    MemoryTracker::instance().allocated(bucket, static_cast<int64_t>(n));
    return {data, data, &deleteTracked, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &deleteTracked; }
#if SB_TORCH_VERSION_NUM >= 203
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif
};

}  // namespace

MemoryTracker& MemoryTracker::instance() {
  static MemoryTracker tracker;
  return tracker;
}

void MemoryTracker::install() {
  static std::once_flag once;
  std::call_once(once, [this] {
    gBase = c10::GetDefaultCPUAllocator();
    TORCH_INTERNAL_ASSERT(gBase->raw_deleter() != nullptr,
                          "the default CPU allocator has no raw deleter to wrap");
    static TrackingCpuAllocator allocator;
    // Highest priority, so nothing installed later at a default priority replaces it.
    c10::SetCPUAllocator(&allocator, /*priority=*/255);
    installed_.store(true);
  });
}

namespace {
// SB_MEMORY_TRACE=<rank>: every allocation and free of that rank's bucket on stderr, with the
// live bytes after it; for building and checking memory models against what ATen allocates.
int traceBucket() {
  static const int bucket = [] {
    const char* v = std::getenv("SB_MEMORY_TRACE");
    return v == nullptr || *v == '\0' ? -1 : std::atoi(v);
  }();
  return bucket;
}
}  // namespace

void MemoryTracker::resetPeak(int rank) {
  auto& b = buckets_[index(rank)];
  b.peak.store(b.current.load());
  if (tracing(rank)) std::fprintf(stderr, "mem reset at %lld\n", (long long)b.current.load());
}

bool MemoryTracker::tracing(int rank) const { return index(rank) == traceBucket(); }

void MemoryTracker::traceNote(int rank, const char* what) const {
  if (tracing(rank)) {
    std::fprintf(stderr, "mem %s at %lld, peak %lld\n", what,
                 (long long)buckets_[index(rank)].current.load(),
                 (long long)buckets_[index(rank)].peak.load());
  }
}

void MemoryTracker::allocated(int bucket, int64_t bytes) {
  auto& b = buckets_[bucket];
  const int64_t now = b.current.fetch_add(bytes) + bytes;
  if (bucket == traceBucket())
    std::fprintf(stderr, "mem +%lld -> %lld\n", (long long)bytes, (long long)now);
  int64_t peak = b.peak.load();
  while (now > peak && !b.peak.compare_exchange_weak(peak, now)) {
  }
}

void MemoryTracker::freed(int bucket, int64_t bytes) {
  const int64_t now = buckets_[bucket].current.fetch_sub(bytes) - bytes;
  if (bucket == traceBucket())
    std::fprintf(stderr, "mem -%lld -> %lld\n", (long long)bytes, (long long)now);
}

int MemoryTracker::threadBucket() { return tBucket; }

ScopedMemoryRank::ScopedMemoryRank(int rank) : previous_(tBucket) {
  tBucket = MemoryTracker::index(rank);
}

ScopedMemoryRank::~ScopedMemoryRank() { tBucket = previous_; }

}  // namespace sb::harness
