#include "harness/measure/memory.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/record_function.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include "harness/parse_number.h"
#include "reference/cpu_allocator.h"

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
  MemoryTracker::instance().freed(a.bucket, a.bytes, ptr);
  gBase->raw_deleter()(ptr);
}

class TrackingCpuAllocator final : public reference::WrappingCpuAllocator {
 public:
  c10::DeleterFnPtr raw_deleter() const override { return &deleteTracked; }

 protected:
  c10::DataPtr allocateBytes(size_t n) const override {
    void* data = gBase->raw_allocate(n);
    const int bucket = MemoryTracker::threadBucket();
    if (data != nullptr) {
      std::lock_guard<std::mutex> lock(gLiveMutex);
      liveAllocations()[data] = {bucket, static_cast<int64_t>(n)};
    }
    MemoryTracker::instance().allocated(bucket, static_cast<int64_t>(n), data);
    return {data, data, &deleteTracked, c10::Device(c10::DeviceType::CPU)};
  }
};

// SB_MEMORY_TRACE=<rank>: every allocation and free of that rank's bucket on stderr, with the
// live bytes after it and the operators that made it; for building and checking memory models
// against what ATen allocates.
int traceBucket() {
  static const int bucket = [] {
    const char* v = std::getenv("SB_MEMORY_TRACE");
    if (v == nullptr || *v == '\0') return -1;
    // A rank number, written as one ("abc", "1e3" and "0x1" traced some rank before, and "-1" or
    // "99999" nothing, without a word).
    uint64_t rank = 0;
    if (!parseWholeNumber(v, 0, 1 << 20, &rank)) {
      std::cerr << "stratbench: SB_MEMORY_TRACE='" << v
                << "' is not a rank number (0, 1, ...): nothing is traced\n";
      return -1;
    }
    // The tracker counts ranks 0..kMaxRanks-1; a higher rank shares the unattributed bucket,
    // whose trace would be every rank's allocations outside a rank scope, not that rank's.
    if (rank >= static_cast<uint64_t>(MemoryTracker::kMaxRanks)) {
      std::cerr << "stratbench: SB_MEMORY_TRACE='" << v << "' is past the "
                << MemoryTracker::kMaxRanks << " ranks the memory tracker counts (0 to "
                << MemoryTracker::kMaxRanks - 1 << "): nothing is traced\n";
      return -1;
    }
    return static_cast<int>(rank);
  }();
  return bucket;
}

// The RecordFunction scopes open on this thread (ATen operators, autograd nodes), outermost
// first. Kept only while tracing: a global callback costs every operator a call.
thread_local std::vector<const char*> tOps;
std::mutex gTraceMutex;
std::atomic<bool> gTracedAny{false};  // whether a trace line was written (tracedAny)
std::mutex gListenMutex;              // MemoryTracker's listeners and their buckets' updates

std::unique_ptr<at::ObserverContext> opStarted(const at::RecordFunction& fn) {
  tOps.push_back(fn.name());
  return nullptr;
}

void opEnded(const at::RecordFunction&, at::ObserverContext*) {
  if (!tOps.empty()) tOps.pop_back();
}

std::string opContext() { return formatOpContext(tOps); }

}  // namespace

std::string formatOpContext(const std::vector<const char*>& open) {
  std::string s;
  int shown = 0;
  for (auto it = open.rbegin(); it != open.rend() && shown < 6; ++it, ++shown) {
    s += shown == 0 ? " in " : " < ";
    s += *it;
  }
  if (static_cast<int>(open.size()) > shown) s += " < ...";
  return s;
}

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
    if (traceBucket() >= 0) {
      at::addGlobalCallback(
          at::RecordFunctionCallback(&opStarted, &opEnded)
              .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
    }
    installed_.store(true);
  });
}

void MemoryTracker::resetPeak(int rank) {
  auto& b = buckets_[index(rank)];
  b.peak.store(b.current.load());
  if (tracing(rank)) {
    std::lock_guard<std::mutex> lock(gTraceMutex);
    std::fprintf(stderr, "mem reset at %lld\n", (long long)b.current.load());
  }
}

int64_t MemoryTracker::heldDuring(int rank, const std::function<void()>& op) {
  auto& b = buckets_[index(rank)];
  const int64_t before = b.current.load();
  const int64_t windowPeak = b.peak.exchange(before);
  op();
  const int64_t held = b.peak.load() - before;
  int64_t seen = b.peak.load();
  while (seen < windowPeak && !b.peak.compare_exchange_weak(seen, windowPeak)) {
  }
  return held;
}

bool MemoryTracker::tracing(int rank) const { return index(rank) == traceBucket(); }

int MemoryTracker::tracedRank() const { return traceBucket(); }

bool MemoryTracker::tracedAny() const { return gTracedAny.load(); }

void MemoryTracker::traceNote(int rank, const char* what) const {
  if (tracing(rank)) {
    std::lock_guard<std::mutex> lock(gTraceMutex);
    gTracedAny.store(true);
    std::fprintf(stderr, "mem %s at %lld, peak %lld\n", what,
                 (long long)buckets_[index(rank)].current.load(),
                 (long long)buckets_[index(rank)].peak.load());
  }
}

std::vector<std::pair<const void*, int64_t>> MemoryTracker::liveBlocks(int rank) const {
  std::vector<std::pair<const void*, int64_t>> out;
  std::lock_guard<std::mutex> lock(gLiveMutex);
  for (const auto& [ptr, a] : liveAllocations()) {
    if (a.bucket == index(rank)) out.emplace_back(ptr, a.bytes);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void MemoryTracker::setListener(int rank, Listener listener) {
  std::lock_guard<std::mutex> lock(gListenMutex);
  const int i = index(rank);
  listened_[i].store(static_cast<bool>(listener));
  listeners_[i] = std::move(listener);
}

void MemoryTracker::allocated(int bucket, int64_t bytes, const void* ptr) {
  auto& b = buckets_[bucket];
  int64_t now = 0;
  if (listened_[bucket].load()) {
    std::lock_guard<std::mutex> lock(gListenMutex);
    now = b.current.fetch_add(bytes) + bytes;
    if (listeners_[bucket]) listeners_[bucket](bytes, now, ptr);
  } else if (bucket == traceBucket()) {
    // The traced bucket's lines are written under the lock of its update, so that their order
    // is the order of the updates (another rank's thread may free this rank's tensors).
    std::lock_guard<std::mutex> lock(gTraceMutex);
    now = b.current.fetch_add(bytes) + bytes;
    gTracedAny.store(true);
    std::fprintf(stderr, "mem +%lld -> %lld @%p%s\n", (long long)bytes, (long long)now, ptr,
                 opContext().c_str());
  } else {
    now = b.current.fetch_add(bytes) + bytes;
  }
  int64_t peak = b.peak.load();
  while (now > peak && !b.peak.compare_exchange_weak(peak, now)) {
  }
}

void MemoryTracker::freed(int bucket, int64_t bytes, const void* ptr) {
  if (listened_[bucket].load()) {
    std::lock_guard<std::mutex> lock(gListenMutex);
    const int64_t now = buckets_[bucket].current.fetch_sub(bytes) - bytes;
    if (listeners_[bucket]) listeners_[bucket](-bytes, now, ptr);
    return;
  }
  if (bucket == traceBucket()) {
    std::lock_guard<std::mutex> lock(gTraceMutex);
    const int64_t now = buckets_[bucket].current.fetch_sub(bytes) - bytes;
    std::fprintf(stderr, "mem -%lld -> %lld @%p\n", (long long)bytes, (long long)now, ptr);
    return;
  }
  buckets_[bucket].current.fetch_sub(bytes);
}

int MemoryTracker::threadBucket() { return tBucket; }

ScopedMemoryRank::ScopedMemoryRank(int rank) : previous_(tBucket) {
  tBucket = MemoryTracker::index(rank);
}

ScopedMemoryRank::~ScopedMemoryRank() { tBucket = previous_; }

}  // namespace sb::harness
