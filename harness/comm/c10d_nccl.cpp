// The nccl backend's part of a Session: one GPU per rank, and NCCL's process groups on it. The
// process groups need ProcessGroupNCCL (SB_HAVE_NCCL, a CUDA LibTorch); choosing the GPU does not.

#include "harness/comm/c10d_internal.h"

#include <string>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#if SB_HAVE_NCCL
#define USE_C10D_NCCL 1
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "harness/measure/device.h"

namespace sb::harness {

void selectNcclDevice(SessionState& s, const DistEnv& env) {
  // One GPU per rank: the local rank's, as torchrun's LOCAL_RANK and the launcher assign.
  std::string why;
  if (!cudaUsable(&why)) throw std::runtime_error("backend 'nccl' needs a CUDA device: " + why);
  const int count = cudaDeviceCount();
  if (env.localWorldSize > count) {
    throw std::runtime_error(
        "backend 'nccl' runs one rank per GPU, but " + std::to_string(env.localWorldSize) +
        " ranks share this host's " + std::to_string(count) +
        " GPU(s) (NCCL refuses two ranks of one communicator on one GPU); use the threads "
        "backend for several ranks on one GPU");
  }
  s.cudaDevice = env.localRank % count;
  setCudaDevice(s.cudaDevice);
}

#if SB_HAVE_NCCL
GroupFactory ncclGroupFactory(SessionState& s) {
  return [&s](const std::string& name, int groupRank, int size) {
    auto opts = ::c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = s.timeout;
    auto store =
        c10::make_intrusive<::c10d::PrefixStore>(s.store->prefix() + name, s.store->impl().store);
    return std::make_shared<GroupOf<::c10d::ProcessGroupNCCL>>(
        c10::make_intrusive<::c10d::ProcessGroupNCCL>(store, groupRank, size, opts),
        /*reducesBf16=*/true, /*keepsWork=*/false, s.cudaDevice);
  };
}
#endif

}  // namespace sb::harness
