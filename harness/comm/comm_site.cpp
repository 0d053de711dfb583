#include "harness/comm/comm_site.h"

#include <utility>

#include <torch/csrc/autograd/graph_task.h>

namespace sb::harness {
namespace {

thread_local std::string tlsNode;
thread_local StepPhase tlsPhase = StepPhase::kUnset;

}  // namespace

const char* stepPhaseName(StepPhase p) {
  switch (p) {
    case StepPhase::kForward:
      return "forward";
    case StepPhase::kBackward:
      return "backward";
    case StepPhase::kRecompute:
      return "recompute";
    case StepPhase::kUpdate:
      return "update";
    case StepPhase::kUnset:
      break;
  }
  return "step";
}

CommSite currentCommSite() {
  CommSite s{tlsNode, tlsPhase};
  if (s.phase != StepPhase::kUnset) return s;
  // The engine sets its graph task on whichever thread runs a backward node (the caller's on
  // CPU, a device thread on CUDA).
  if (torch::autograd::get_current_graph_task_exec_info() != nullptr) {
    s.phase = StepPhase::kBackward;
  } else if (!s.node.empty()) {
    s.phase = StepPhase::kForward;
  }
  return s;
}

const std::string& currentCommNode() { return tlsNode; }

CommSiteScope::CommSiteScope(std::string node) : CommSiteScope(std::move(node), tlsPhase) {}

CommSiteScope::CommSiteScope(std::string node, StepPhase phase)
    : savedNode_(std::exchange(tlsNode, std::move(node))),
      savedPhase_(std::exchange(tlsPhase, phase)) {}

CommSiteScope::CommSiteScope(StepPhase phase) : CommSiteScope(tlsNode, phase) {}

CommSiteScope::~CommSiteScope() {
  tlsNode = std::move(savedNode_);
  tlsPhase = savedPhase_;
}

}  // namespace sb::harness
