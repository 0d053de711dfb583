#pragma once

// Where in a step a collective is issued: the graph node (or module, or operator) an executor
// is running and the phase of the step, so that a row's record can say, per node and phase,
// what was communicated beside what the strategy predicted there (Strategy::predictCommByNode).
// Like DTensor's CommDebugMode, but always on: a scope costs a thread-local string swap.
//
// An executor names its nodes with CommSiteScope while it runs their forward; an autograd
// function that communicates in its backward saves the node it was made in (saveCommNode) and
// reinstates it there (backwardCommSite(ctx)), whichever thread the engine runs it on. A
// backward hook or function that does not is counted at the engine thread's scopes: the rank's
// own on CPU (the engine runs a CPU graph on the calling thread), none on a CUDA device thread. A
// collective's phase is the scope's where one was given; otherwise backward inside the autograd
// engine's graph task, forward inside a named node, and "step" outside both (the loss and norm
// reductions of a training loop say "update").

#include <cstdint>
#include <string>

namespace sb::harness {

enum class StepPhase : uint8_t { kUnset, kForward, kBackward, kUpdate };

// "forward", "backward", "update"; "step" for kUnset.
const char* stepPhaseName(StepPhase p);

// The calling thread's site, as a collective issued now would be counted.
struct CommSite {
  std::string node;  // "" outside every named node
  StepPhase phase = StepPhase::kUnset;
};
CommSite currentCommSite();
// The node the calling thread's scopes name ("" outside them), and its phase resolved as above
// (never kUnset unless outside every node and the engine): what a collective is counted at.
const std::string& currentCommNode();
StepPhase currentCommPhase();

// Sets the calling thread's node (and phase, where given) until the scope ends.
class CommSiteScope {
 public:
  explicit CommSiteScope(std::string node);
  CommSiteScope(std::string node, StepPhase phase);
  // The phase only; the node stays.
  explicit CommSiteScope(StepPhase phase);
  ~CommSiteScope();
  CommSiteScope(const CommSiteScope&) = delete;
  CommSiteScope& operator=(const CommSiteScope&) = delete;

 private:
  std::string savedNode_;
  StepPhase savedPhase_;
};

// For a torch::autograd::Function: its forward saves the node it runs in, its backward reads it
// back (templates, so that this header needs no autograd include).
template <class Ctx>
void saveCommNode(Ctx* ctx) {
  ctx->saved_data["sb_comm_node"] = currentCommNode();
}
template <class Ctx>
std::string savedCommNode(Ctx* ctx) {
  const auto it = ctx->saved_data.find("sb_comm_node");
  return it == ctx->saved_data.end() ? std::string() : it->second.toStringRef();
}
// In a backward: `const auto site = backwardCommSite(ctx);` (the node saved, phase backward).
template <class Ctx>
CommSiteScope backwardCommSite(Ctx* ctx) {
  return CommSiteScope(savedCommNode(ctx), StepPhase::kBackward);
}

}  // namespace sb::harness
