// libFuzzer target: the cost-profile reader (harness/cost_profile.h, `--cost-profile`,
// `solve shard --profile`). Any JSON is a profile or an InputError; a profile it accepts prices
// every size to a finite, non-negative time, and holds every group its mesh has.

#include <cmath>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/comm/mesh.h"
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
        // Up to 2^62 bytes, the most any option or plan names: still a finite time.
        for (int64_t bytes : {int64_t{0}, int64_t{1} << 20, int64_t{1} << 40, int64_t{1} << 62}) {
          const double t = fit.predictUs(bytes);
          if (!std::isfinite(t) || t < 0) __builtin_trap();
        }
      }
    }
    // Every group `calibrate` measures on the profile's mesh is there (each axis of 2 or more
    // ranks): one missing would leave its collectives unpriced.
    const auto mesh = sb::harness::DeviceMesh::parseShape(p.mesh);
    for (size_t a = 0; a < mesh.size(); ++a) {
      if (mesh[a] >= 2 && !p.groups.count(std::to_string(a))) __builtin_trap();
    }
  } catch (const sb::harness::InputError&) {
  }
  return 0;
}
