// libFuzzer target: the cost-profile reader (harness/cost_profile.h, `--cost-profile`,
// `solve shard --profile`). Any JSON is a profile or an InputError; a profile it accepts prices
// every size to a finite, non-negative time.

#include <cmath>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "harness/dist/cost_profile.h"
#include "harness/run/suite.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j =
      nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    const auto p = sb::harness::CostProfile::fromJson(j, "fuzz.json");
    for (const auto& [key, group] : p.groups) {
      for (const auto& [coll, fit] : group.collectives) {
        for (int64_t bytes : {int64_t{0}, int64_t{1} << 20, int64_t{1} << 40}) {
          const double t = fit.predictUs(bytes);
          if (!std::isfinite(t) || t < 0) __builtin_trap();
        }
      }
    }
  } catch (const sb::harness::InputError&) {
  }
  return 0;
}
