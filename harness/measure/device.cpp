#include "harness/measure/device.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <ATen/Context.h>

#include "harness/measure/memory.h"
#include "reference/autograd_engine.h"
#include "reference/workload.h"

#if SB_TORCH_CUDA
#include <cuda_runtime_api.h>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/engine.h>
#endif

namespace sb::harness {
namespace {

#if SB_TORCH_CUDA
bool onCuda() { return reference::caseDevice().is_cuda(); }

c10::cuda::CUDAStream rankStream(int rank, int device);

// cuBLAS keeps a workspace per (handle, stream), and a handle per thread, made on a thread's
// first product on a stream and kept by the caching allocator for the process: 32 MiB each on
// Hopper, plus cuBLASLt's. No strategy's model counts them, nor should a rank carry them from
// row to row: each (thread, stream) makes them here once, outside any rank's account.
void warmLibraries() {
  thread_local std::vector<cudaStream_t> warmed;
  const cudaStream_t s = c10::cuda::getCurrentCUDAStream().stream();
  if (std::find(warmed.begin(), warmed.end(), s) != warmed.end()) return;
  warmed.push_back(s);
  ScopedMemoryRank none(MemoryTracker::kUnattributed);
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const auto o = at::TensorOptions().dtype(dtype).device(at::kCUDA, currentCudaDevice());
    const at::Tensor a = at::ones({64, 64}, o), bias = at::ones({64}, o);
    (void)at::mm(a, a);
    (void)at::addmm(bias, a, a);  // cuBLASLt's path, with its own workspace
  }
}

// An autograd engine of one rank: LibTorch's engine with its own device threads, which count
// what they allocate against the rank (the backward of CUDA ops runs there, not on the rank's
// thread). Never destroyed: the engine's device threads outlive it otherwise.
class RankEngine final : public torch::autograd::Engine {
 public:
  RankEngine(int rank, int device) : rank_(rank), device_(device) {
    // Recent LibTorch starts an engine's device threads under one process-wide flag, so that
    // only the first engine to run a backward would ever get them; older versions (1.13) keep
    // a flag per engine. The default engine takes the flag first, this engine tries its own,
    // and where that started nothing it starts its threads itself.
    Engine::get_default_engine().initialize_device_threads_pool();
    initialize_device_threads_pool();
    if (device_ready_queues_.empty()) start_device_threads();
  }
  void thread_init(int device, const std::shared_ptr<torch::autograd::ReadyQueue>& ready_queue,
                   bool should_increment) override {
    // A backward run from inside a backward (a chunk's or a checkpointed stage's recomputation)
    // must stay on this engine: LibTorch's reentrant path waits on the calling engine's queue,
    // and on another engine's it would wait forever.
    reference::ScopedAutogradEngine self(this);
    if (device == device_) {  // only the rank's GPU: the others' threads stay idle
      c10::cuda::CUDAGuard onDevice(static_cast<c10::DeviceIndex>(device));
      c10::cuda::CUDAStreamGuard onStream(rankStream(rank_, device));
      warmLibraries();
    }
    ScopedMemoryRank attribution(rank_);
    Engine::thread_init(device, ready_queue, should_increment);
  }

 private:
  int rank_;
  int device_;
};

// Per (rank, device): the rank's stream and engine, made on first use and kept.
struct RankResources {
  std::vector<std::unique_ptr<c10::cuda::CUDAStream>> streams;
  RankEngine* engine = nullptr;
};
std::mutex gRankMutex;
std::unordered_map<int, RankResources>& rankResources() {
  static auto* r = new std::unordered_map<int, RankResources>();
  return *r;
}

c10::cuda::CUDAStream rankStream(int rank, int device) {
  std::lock_guard<std::mutex> lock(gRankMutex);
  auto& res = rankResources()[rank];
  if (static_cast<int>(res.streams.size()) <= device) res.streams.resize(device + 1);
  if (!res.streams[device]) {
    res.streams[device] = std::make_unique<c10::cuda::CUDAStream>(c10::cuda::getStreamFromPool(
        /*isHighPriority=*/false, static_cast<c10::DeviceIndex>(device)));
  }
  return *res.streams[device];
}

torch::autograd::Engine* rankEngine(int rank, int device) {
  {
    std::lock_guard<std::mutex> lock(gRankMutex);
    if (auto* e = rankResources()[rank].engine) return e;
  }
  // Made outside the lock: its device threads take the rank's stream as they start, and the
  // constructor waits for them.
  auto* made = new RankEngine(rank, device);
  std::lock_guard<std::mutex> lock(gRankMutex);
  auto& res = rankResources()[rank];
  if (!res.engine) res.engine = made;  // else another thread made it first: this one is leaked
  return res.engine;
}

// The allocation hook's bookkeeping: the bucket and bytes of every live CUDA allocation.
struct LiveCuda {
  int bucket;
  int64_t bytes;
};
std::mutex gCudaLiveMutex;
std::unordered_map<size_t, LiveCuda>& cudaLive() {
  static auto* live = new std::unordered_map<size_t, LiveCuda>();
  return *live;
}
std::atomic<int64_t> gCudaAllocations{0};
#endif

}  // namespace

bool cudaUsable(std::string* why) {
#if SB_TORCH_CUDA
  if (!at::globalContext().hasCUDA() || c10::cuda::device_count() == 0) {
    if (why) *why = "LibTorch has CUDA but finds no CUDA device";
    return false;
  }
  return true;
#else
  if (why) *why = "this build's LibTorch has no CUDA (build against a CUDA LibTorch: docs/gpu.md)";
  return false;
#endif
}

int currentCudaDevice() {
#if SB_TORCH_CUDA
  if (cudaDeviceCount() == 0) return -1;
  return c10::cuda::current_device();
#else
  return -1;
#endif
}

void setCudaDevice(int index) {
#if SB_TORCH_CUDA
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
#else
  TORCH_CHECK(false, "no CUDA in this build");
#endif
}

int cudaDeviceCount() {
#if SB_TORCH_CUDA
  return at::globalContext().hasCUDA() ? c10::cuda::device_count() : 0;
#else
  return 0;
#endif
}

std::string cudaDeviceDescription(int index) {
#if SB_TORCH_CUDA
  if (index < 0 || index >= cudaDeviceCount()) return "";
  const cudaDeviceProp* p = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index));
  char buf[400];  // the name (up to 255 bytes) and the rest
  std::snprintf(buf, sizeof(buf), "%s (sm_%d%d, %d SMs, %.1f GiB)", p->name, p->major, p->minor,
                p->multiProcessorCount, static_cast<double>(p->totalGlobalMem) / (1 << 30));
  return buf;
#else
  return "";
#endif
}

struct RankDeviceScope::State {
#if SB_TORCH_CUDA
  explicit State(c10::cuda::CUDAStream s) : stream(s), guard(s) {}
  c10::cuda::CUDAStream stream;
  c10::cuda::CUDAStreamGuard guard;
  std::unique_ptr<reference::ScopedAutogradEngine> engine;
#endif
};

RankDeviceScope::RankDeviceScope(int rank) {
#if SB_TORCH_CUDA
  if (!onCuda()) return;
  const int device =
      reference::caseDevice().index() < 0 ? currentCudaDevice() : reference::caseDevice().index();
  state_ = std::make_unique<State>(rankStream(rank, device));
  warmLibraries();
  state_->engine = std::make_unique<reference::ScopedAutogradEngine>(rankEngine(rank, device));
#else
  (void)rank;
#endif
}

RankDeviceScope::~RankDeviceScope() {
#if SB_TORCH_CUDA
  if (!state_) return;
  // Synchronising can fail (an earlier kernel's error surfaces here); a destructor must not
  // throw, and the next CUDA call reports the same error.
  cudaStreamSynchronize(state_->stream.stream());
#endif
}

void synchronizeDevice() {
#if SB_TORCH_CUDA
  if (cudaDeviceCount() > 0) C10_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

void waitForStream(const at::Tensor& t) {
#if SB_TORCH_CUDA
  if (!t.defined() || !t.is_cuda()) return;
  C10_CUDA_CHECK(
      cudaStreamSynchronize(c10::cuda::getCurrentCUDAStream(t.device().index()).stream()));
#else
  (void)t;
#endif
}

struct StepTimer::State {
  std::chrono::steady_clock::time_point t0;
#if SB_TORCH_CUDA
  bool cuda = false;
  cudaEvent_t begin = nullptr, end = nullptr;
#endif
};

StepTimer::StepTimer() : state_(std::make_unique<State>()) {
#if SB_TORCH_CUDA
  if (onCuda()) {
    state_->cuda = true;
    C10_CUDA_CHECK(cudaEventCreate(&state_->begin));
    C10_CUDA_CHECK(cudaEventCreate(&state_->end));
  }
#endif
}

StepTimer::~StepTimer() {
#if SB_TORCH_CUDA
  if (state_->begin) cudaEventDestroy(state_->begin);
  if (state_->end) cudaEventDestroy(state_->end);
#endif
}

void StepTimer::start() {
#if SB_TORCH_CUDA
  if (state_->cuda) {
    C10_CUDA_CHECK(cudaEventRecord(state_->begin, c10::cuda::getCurrentCUDAStream().stream()));
    return;
  }
#endif
  state_->t0 = std::chrono::steady_clock::now();
}

double StepTimer::stopSeconds() {
#if SB_TORCH_CUDA
  if (state_->cuda) {
    // The step's last work may be on the rank's stream or, waited for by it, on a collective's.
    C10_CUDA_CHECK(cudaEventRecord(state_->end, c10::cuda::getCurrentCUDAStream().stream()));
    C10_CUDA_CHECK(cudaEventSynchronize(state_->end));
    float ms = 0;
    C10_CUDA_CHECK(cudaEventElapsedTime(&ms, state_->begin, state_->end));
    return ms / 1e3;
  }
#endif
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - state_->t0).count();
}

void resetDevicePeak() {
#if SB_TORCH_CUDA
  if (onCuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(
        static_cast<c10::DeviceIndex>(currentCudaDevice()));
  }
#endif
}

DeviceMemoryStats deviceMemoryStats() {
  DeviceMemoryStats out;
#if SB_TORCH_CUDA
  if (onCuda()) {
    const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(
        static_cast<c10::DeviceIndex>(currentCudaDevice()));
    constexpr auto kAll = static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE);
    out.allocatedCurrent = s.allocated_bytes[kAll].current;
    out.allocatedPeak = s.allocated_bytes[kAll].peak;
    out.reservedPeak = s.reserved_bytes[kAll].peak;
  }
#endif
  return out;
}

bool installCudaMemoryTracking(std::string* why) {
#if SB_TORCH_CUDA
  static std::once_flag once;
  static bool ok = false;
  static std::string reason;
  std::call_once(once, [] {
    if (!cudaUsable(&reason)) return;
    // The allocator attaches hooks to the devices it has set up: set them up first.
    for (int d = 0; d < cudaDeviceCount(); ++d) {
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(d));
      (void)at::empty({1}, at::TensorOptions().device(at::kCUDA, d));
    }
    using c10::cuda::CUDACachingAllocator::TraceEntry;
    c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker([](const TraceEntry& e) {
      if (e.action_ == TraceEntry::ALLOC) {
        const int bucket = MemoryTracker::threadBucket();
        const auto bytes = static_cast<int64_t>(e.size_);
        {
          std::lock_guard<std::mutex> lock(gCudaLiveMutex);
          cudaLive()[e.addr_] = {bucket, bytes};
        }
        gCudaAllocations.fetch_add(1);
        MemoryTracker::instance().allocated(bucket, bytes, reinterpret_cast<const void*>(e.addr_));
      } else if (e.action_ == TraceEntry::FREE_REQUESTED) {
        LiveCuda a{MemoryTracker::kUnattributed, 0};
        {
          std::lock_guard<std::mutex> lock(gCudaLiveMutex);
          auto it = cudaLive().find(e.addr_);
          if (it == cudaLive().end()) return;  // allocated before the hook
          a = it->second;
          cudaLive().erase(it);
        }
        MemoryTracker::instance().freed(a.bucket, a.bytes, reinterpret_cast<const void*>(e.addr_));
      }
    });
    ok = true;
  });
  if (!ok && why) *why = reason;
  return ok;
#else
  if (why) *why = "this build's LibTorch has no CUDA";
  return false;
#endif
}

int64_t cudaAllocationsSeen() {
#if SB_TORCH_CUDA
  return gCudaAllocations.load();
#else
  return 0;
#endif
}

}  // namespace sb::harness
