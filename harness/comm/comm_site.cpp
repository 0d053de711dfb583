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
    case StepPhase::kUpdate:
      return "update";
    case StepPhase::kUnset:
      break;
  }
  return "step";
}

StepPhase currentCommPhase() {
  if (tlsPhase != StepPhase::kUnset) return tlsPhase;
  // The engine sets its graph task on whichever thread runs a backward node (the caller's on
  // CPU, a device thread on CUDA).
  if (torch::autograd::get_current_graph_task_exec_info() != nullptr) return StepPhase::kBackward;
  return tlsNode.empty() ? StepPhase::kUnset : StepPhase::kForward;
}

CommSite currentCommSite() { return {tlsNode, currentCommPhase()}; }

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
