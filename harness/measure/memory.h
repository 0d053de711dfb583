#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace sb::harness {

// Peak CPU memory per rank, through c10's CPU allocator hook.
//
// install() wraps LibTorch's default CPU allocator with one that counts the bytes of every
// tensor allocation against the rank of the thread that made it (ScopedMemoryRank), and
// subtracts them when the storage is freed, whichever thread frees it. Allocations made
// outside any rank scope count against an "unattributed" bucket. The counts are exact byte
// counts of tensor storages: allocator headers, page rounding and non-tensor heap memory are
// not included.
class MemoryTracker {
 public:
  static constexpr int kMaxRanks = 64;
  static constexpr int kUnattributed = kMaxRanks;

  static MemoryTracker& instance();

  // Installs the tracking allocator once per process; later calls do nothing.
  void install();
  bool installed() const { return installed_.load(); }

  int64_t current(int rank) const { return buckets_[index(rank)].current.load(); }
  int64_t peak(int rank) const { return buckets_[index(rank)].peak.load(); }
  // Starts a new peak window for `rank` at its current live bytes.
  void resetPeak(int rank);
  // The most bytes above its current live bytes that `rank` holds while `op` runs (a model
  // measuring a kernel's scratch in prepare): its peak window and its trace are left as they
  // were (no reset line; the window's peak stays at least what it was).
  int64_t heldDuring(int rank, const std::function<void()>& op);
  // With SB_MEMORY_TRACE=<rank> set, every allocation and free of that rank goes to stderr,
  // one line each: "mem +BYTES -> LIVE @PTR in OP < CALLER < ..." (the ATen operators and
  // autograd nodes running on the allocating thread, innermost first, from LibTorch's
  // RecordFunction) and "mem -BYTES -> LIVE @PTR". reports/memory_trace.py reads it back and
  // says what is live at the measured step's peak. traceNote writes `what` into that trace.
  void traceNote(int rank, const char* what) const;
  // Whether `rank` is traced: callers that build a note's text check this first, so that an
  // untraced step (a timed one) does not pay for it.
  bool tracing(int rank) const;
  // The rank SB_MEMORY_TRACE names (-1: none, or not a rank the tracker counts), and whether
  // any line of its trace was written: a run whose rows never had that rank says so at its end
  // rather than leaving an empty trace without a word.
  int tracedRank() const;
  bool tracedAny() const;

  // While set, every allocation (delta > 0) and free (delta < 0) of `rank`'s bucket is also
  // told to `listener`, with the live bytes after it, in the order of the updates (under a
  // lock): a traced step's memory timeline (step_trace.h). nullptr removes it.
  using Listener = std::function<void(int64_t delta, int64_t live, const void* ptr)>;
  void setListener(int rank, Listener listener);
  // The blocks `rank` holds now (CPU allocations), by address, with their bytes: what a traced
  // step starts with.
  std::vector<std::pair<const void*, int64_t>> liveBlocks(int rank) const;

  // Used by the allocators (CPU and CUDA); `ptr` only names the block in the trace.
  void allocated(int bucket, int64_t bytes, const void* ptr = nullptr);
  void freed(int bucket, int64_t bytes, const void* ptr = nullptr);
  static int threadBucket();

 private:
  friend class ScopedMemoryRank;
  static int index(int rank) { return rank < 0 || rank >= kMaxRanks ? kUnattributed : rank; }
  struct Bucket {
    std::atomic<int64_t> current{0};
    std::atomic<int64_t> peak{0};
  };
  std::array<Bucket, kMaxRanks + 1> buckets_;
  std::array<std::atomic<bool>, kMaxRanks + 1> listened_{};
  std::array<Listener, kMaxRanks + 1> listeners_;
  std::atomic<bool> installed_{false};
};

// " in OP < CALLER < ...": the scopes open on a thread (outermost first), innermost first and at
// most six, as SB_MEMORY_TRACE's lines name an allocation's operators (memory_trace.py reads it).
std::string formatOpContext(const std::vector<const char*>& open);

// Attributes the calling thread's allocations to `rank` for the scope's lifetime.
class ScopedMemoryRank {
 public:
  explicit ScopedMemoryRank(int rank);
  ~ScopedMemoryRank();
  ScopedMemoryRank(const ScopedMemoryRank&) = delete;
  ScopedMemoryRank& operator=(const ScopedMemoryRank&) = delete;

 private:
  int previous_;
};

}  // namespace sb::harness
