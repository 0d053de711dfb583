// libFuzzer target: the chain reader of `solve checkpoint` (strategies/checkpointing/chain.h)
// and, for chains it accepts, the solvers on them. Properties beyond "no crash": a schedule a
// solver returns fits its budget, and simulating it gives the peak and time it claims.

#include <cmath>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "strategies/checkpointing/chain.h"
#include "strategies/checkpointing/solvers.h"

namespace ck = sb::strategies::checkpointing;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j =
      nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  ck::Chain chain;
  try {
    chain = ck::Chain::fromJson(j, "fuzz.json");
  } catch (const ck::ChainError&) {
    return 0;
  }
  if (chain.length() > 64) return 0;  // solving is polynomial; keep each input fast
  const auto none = ck::solve("none", chain, {0, 50});
  if (!none) __builtin_trap();  // keeping every tape always exists
  const double budget = none->predictedPeak * 0.7;
  for (const char* solver : {"full", "sqrt", "greedy", "revolve", "rotor"}) {
    ck::SolveOptions o;
    o.budget = budget;
    o.slots = 50;
    o.maxSolverBytes = double(64 << 20);
    std::optional<ck::Schedule> s;
    try {
      s = ck::solve(solver, chain, o);
    } catch (const ck::SolverLimitError&) {
      continue;
    }
    if (!s) continue;
    const bool fixed = std::string(solver) == "full" || std::string(solver) == "sqrt";
    if (!fixed && s->predictedPeak > budget * (1 + 1e-9) + 1e-9) __builtin_trap();
    const auto sim = ck::simulate(chain, s->ops);
    if (std::fabs(sim.peak - s->predictedPeak) > 1e-6 * std::max(1.0, sim.peak)) __builtin_trap();
  }
  return 0;
}
