// The registry of operator rules (op_rule.h) and the operators' order: apart from the generic
// strategy (op_sharding.cpp) so that a family file needs only op_rule.h.

#include "strategies/sharding/ops/op_rule.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <map>

namespace sb::strategies {
namespace {

// The operators in the order `stratbench list` shows their canonical strategies. A new
// operator's name goes where it should be listed.
constexpr const char* kOpOrder[] = {
    "addmm",      "bmm",        "matmul",  "embedding", "layer_norm", "batch_norm", "conv2d",
    "max_pool2d", "avg_pool2d", "add",     "mul",       "gelu",       "relu",       "dropout",
    "softmax",    "view",       "reshape", "permute",   "transpose",  "contiguous", "split",
    "getitem",    "sum",        "silu",    "aten",      "mm",         "rms_norm",   "rope",
};

std::map<std::string, OpRule>& rules() {
  static std::map<std::string, OpRule> r;
  return r;
}

std::vector<std::function<void()>>& pending() {
  static std::vector<std::function<void()>> p;
  return p;
}

bool complete() {
  for (const char* op : kOpOrder) {
    if (rules().count(op) == 0) return false;
  }
  return true;
}

}  // namespace

const std::vector<std::string>& opOrder() {
  static const std::vector<std::string> order(std::begin(kOpOrder), std::end(kOpOrder));
  return order;
}

const OpRule& opRule(const std::string& op) {
  const auto it = rules().find(op);
  if (it == rules().end()) {
    std::string known;
    for (const auto& [name, rule] : rules()) known += (known.empty() ? "" : ", ") + name;
    TORCH_CHECK(false, "op: no sharding rule for operator '", op, "' (rules: ", known, ")");
  }
  return it->second;
}

void registerOpRule(const std::string& op, OpRule rule) {
  const std::pair<const char*, bool> parts[] = {
      {"canonicalShapes", static_cast<bool>(rule.canonicalShapes)},
      {"specs", static_cast<bool>(rule.specs)},
      {"layouts", static_cast<bool>(rule.layouts)},
      {"faults", static_cast<bool>(rule.faults)},
      {"forward", static_cast<bool>(rule.forward)},
      {"memory", static_cast<bool>(rule.memory)},
      {"flops", static_cast<bool>(rule.flops)},
      {"statistics", static_cast<bool>(rule.statistics)},
      {"reductionLength", static_cast<bool>(rule.reductionLength)},
  };
  for (const auto& [part, set] : parts) {
    TORCH_CHECK(set, "op rule '", op, "': the part '", part,
                "' is empty (every part of an OpRule is required, op_rule.h)");
  }
  TORCH_CHECK(std::find(std::begin(kOpOrder), std::end(kOpOrder), op) != std::end(kOpOrder),
              "op rule '", op,
              "': not in kOpOrder (strategies/sharding/ops/op_rule.cpp), the order `stratbench "
              "list` shows operators in: add it there");
  TORCH_CHECK(rules().count(op) == 0, "op rule '", op, "' is registered twice");
  rules().emplace(op, std::move(rule));
  if (complete()) {
    auto run = std::move(pending());
    pending().clear();
    for (auto& f : run) f();
  }
}

void whenOpRulesComplete(std::function<void()> f) {
  if (complete()) {
    f();
  } else {
    pending().push_back(std::move(f));
  }
}

}  // namespace sb::strategies
