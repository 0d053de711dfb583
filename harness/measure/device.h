#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

namespace sb::harness {

// The GPU side of a run. Cases on `device: cuda` need a LibTorch with CUDA (SB_TORCH_CUDA, a
// CUDA build of PyTorch's) and a device; elsewhere the functions below say why not, and every
// scope is a no-op on the CPU.

// Whether cases can run on CUDA in this process; if not, `why` says which of LibTorch's CUDA
// or a device is missing.
bool cudaUsable(std::string* why);
// The CUDA device this process runs its ranks on (the current device; the nccl backend sets it
// to the local rank's). -1 without CUDA.
int currentCudaDevice();
// Makes `index` the current CUDA device of the calling thread (the nccl backend, per process).
void setCudaDevice(int index);
// The number of CUDA devices (0 without CUDA).
int cudaDeviceCount();
// "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB)" for a record's provenance; "" without CUDA.
std::string cudaDeviceDescription(int index);

// What a rank's work runs inside, entered by every World around each rank's part of a run. On
// a case whose tensors are on CUDA (reference::caseDevice()):
// - the rank's own stream is current (one per rank, from LibTorch's pool, kept for the process),
//   so ranks that share a GPU overlap as separate processes would;
// - the rank's own autograd engine runs its backward (reference/autograd_engine.h says why: one
//   shared device thread would deadlock ranks that communicate inside backward), and its device
//   thread counts its allocations against the rank;
// - on exit the host waits for the stream, so what the rank returns is finished.
// On the CPU it does nothing.
class RankDeviceScope {
 public:
  explicit RankDeviceScope(int rank);
  ~RankDeviceScope();
  RankDeviceScope(const RankDeviceScope&) = delete;
  RankDeviceScope& operator=(const RankDeviceScope&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Waits until the current CUDA device has finished everything queued on any stream: between a
// reference built on the default stream and ranks that read it on theirs (LibTorch's pool
// streams do not wait for the default stream). No-op without CUDA.
void synchronizeDevice();

// Makes the work queued so far on `t`'s device, on the calling thread's current stream,
// finished before the host goes on: the threads backend calls it before another rank may read
// `t` and before it lets others reuse what it read. No-op for CPU tensors.
void waitForStream(const at::Tensor& t);

// Times one step of the calling rank: on a CUDA case, CUDA events recorded on the rank's
// current stream around it (the host waits for the second); on the CPU, the steady clock.
class StepTimer {
 public:
  StepTimer();
  ~StepTimer();
  void start();
  double stopSeconds();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The CUDA caching allocator's own statistics for the current device, since resetDevicePeak():
// bytes handed to tensors (rounded to the allocator's blocks) and reserved from the driver.
struct DeviceMemoryStats {
  int64_t allocatedCurrent = 0;
  int64_t allocatedPeak = 0;
  int64_t reservedPeak = 0;
};
void resetDevicePeak();
DeviceMemoryStats deviceMemoryStats();

// Counts every CUDA tensor allocation against the rank of the thread that made it, as the CPU
// tracker does (harness/memory.h), through the caching allocator's trace hook. Installed once,
// after CUDA is initialised; returns false (and `why`) where it cannot be.
bool installCudaMemoryTracking(std::string* why);
// How many CUDA allocations the hook has seen: a step with none while the allocator's own
// statistics moved means the hook is not called, and per-rank peaks are not known.
int64_t cudaAllocationsSeen();

}  // namespace sb::harness
