// What the update between two training steps holds (update_profile.h).

#include "harness/measure/update_profile.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "harness/comm/comm.h"
#include "harness/comm/comm_site.h"
#include "harness/measure/memory.h"

namespace sb::harness {

UpdateProfile profileUpdate(int rank, const reference::TrainingSpec& spec,
                            const std::vector<std::pair<std::string, at::Tensor>>& params,
                            const std::vector<bool>& counted) {
  auto& mem = MemoryTracker::instance();
  const ScopedMemoryRank scope(rank);
  std::vector<std::pair<std::string, at::Tensor>> copies;
  for (const auto& [name, p] : params) {
    at::Tensor c = p.detach().clone().requires_grad_(true);
    c.mutable_grad() = p.detach().clone();
    copies.emplace_back(name, c);
  }
  reference::TrainingLoop loop(spec, copies);
  if (!counted.empty()) {
    loop.shareNorm(counted, [](double sq) {
      return at::tensor({sq}, at::TensorOptions().dtype(at::kDouble)).item<double>();
    });
  }
  UpdateProfile out;
  out.peak = mem.heldDuring(rank, [&] { loop.update(0); });
  out.stateBytes = loop.stateBytes();
  if (spec.steps > 1) {
    const int64_t later = mem.heldDuring(rank, [&] { loop.update(0); });
    out.peak = std::max(out.peak, out.stateBytes + later);
  }
  return out;
}

void shareNormOver(reference::TrainingLoop& loop, std::vector<bool> counted, Communicator& comm) {
  loop.shareNorm(std::move(counted), [&comm](double sq) {
    const CommSiteScope site("", StepPhase::kUpdate);
    at::Tensor t = at::tensor({sq}, at::TensorOptions().dtype(at::kDouble));
    comm.allReduce(t);
    return t.item<double>();
  });
}

bool isWholeTrainingResult(const std::string& tensor) {
  return tensor == "loss" || tensor == "grad_norm" || tensor == "state/step";
}

}  // namespace sb::harness
