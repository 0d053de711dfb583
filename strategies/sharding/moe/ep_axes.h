#pragma once

// params.axes of expert parallelism (sharding/moe/ep, torch/ep): the name of each mesh axis,
// outermost first, from dp (replicas), dp_shard (FSDP over the replicas), ep (the experts) and
// tp (each expert's hidden units). Its form is the same for both: one distinct name a mesh
// axis, ep among them, at most one of dp and dp_shard, in that order (data outside experts
// outside tensor). Which layouts a strategy runs is its own: another is an `unsupported` row.

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/case.h"
#include "harness/error.h"

namespace sb::strategies::moe {

// Throws InputError naming params.axes, `who` and the layouts `who` runs, where the form is
// wrong; nothing where the case has no params.axes.
inline void checkExpertAxes(const harness::CaseSpec& c, const std::string& who,
                            const std::string& runs) {
  if (!c.params.contains("axes")) return;
  const auto& a = c.params.at("axes");
  const auto rank = [](const std::string& n) {
    return n == "dp" || n == "dp_shard" ? 0 : n == "ep" ? 1 : n == "tp" ? 2 : -1;
  };
  bool ok = a.is_array() && a.size() == c.mesh.size();
  int last = -1, eps = 0;
  for (size_t i = 0; ok && i < a.size(); ++i) {
    ok = a[i].is_string() && rank(a[i].get<std::string>()) > last;
    if (ok) {
      last = rank(a[i].get<std::string>());
      eps += a[i] == "ep";
    }
  }
  if (!ok || eps != 1) {
    throw harness::InputError(c.where() + ": " + who + " params.axes " + a.dump() + ": expected " +
                              std::to_string(c.mesh.size()) +
                              " axis names, one a mesh axis, outermost first: at most one of dp "
                              "and dp_shard, then ep, then at most tp (" + runs + " run here)");
  }
}

}  // namespace sb::strategies::moe
