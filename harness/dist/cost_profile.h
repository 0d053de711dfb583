#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/comm/comm.h"

namespace sb::harness {

// Measured costs of one backend on one mesh, written by `stratbench calibrate` and read by the
// runner's cost model (`run --cost-profile FILE`).
//
// For each group of mesh axes ("0", "1", "0,1") and each collective, nccl-tests-style points
// (size in nccl-tests' convention, time, algbw = size / time, busbw = algbw x the collective's
// bus factor) and a least-squares fit time = latency + size / bandwidth, which prices any size.
// For local compute, a fit of a float32 matmul's time against its flops; for local data
// movement, a fit of allocating and copying a tensor against the bytes written; and the fixed
// cost of one SPMD step through the backend's World (waking every rank and taking the slowest
// rank's time), which every measured step pays once.
//
// Local work of a step, priced by the copy fit: `copies` kernels writing `bytes` in all.
struct LocalWork {
  int64_t copies = 0;
  int64_t bytes = 0;
  LocalWork& operator+=(const LocalWork& o) {
    copies += o.copies;
    bytes += o.bytes;
    return *this;
  }
};

struct CostProfile {
  struct Point {
    int64_t bytes = 0;
    double timeUs = 0;
    double algbwGBps = 0;
    double busbwGBps = 0;
  };
  struct Fit {
    double latencyUs = 0;  // intercept, >= 0
    double usPerByte = 0;  // slope, >= 0
    std::vector<Point> points;
    double predictUs(int64_t bytes) const { return latencyUs + usPerByte * bytes; }
  };
  struct Group {
    int size = 0;
    std::map<Collective, Fit> collectives;
  };

  std::string backend;
  std::string mesh;  // "2x2"
  std::string host;
  std::string timestampUtc;
  std::map<std::string, Group> groups;  // by axes key, "0,1"
  Fit gemm;                             // x: flops (2 m n k), not bytes
  std::optional<Fit> copy;              // x: bytes written; absent in older profiles
  std::optional<double> stepUs;         // an empty step; absent in older profiles

  // nccl-tests' bus bandwidth factor of a collective over n ranks.
  static double busFactor(Collective c, int n);
  // Least squares with weights 1/size, clamped to non-negative latency and slope.
  static Fit fit(std::vector<Point> points);
  static std::string axesKey(const std::vector<int>& axes);

  // Microseconds of `stats` issued on the group over `axes`; nullopt when the profile has no
  // fit for a collective that was used.
  std::optional<double> commUs(const std::vector<int>& axes, const CommStats& stats) const;
  // Microseconds of local copies; nullopt when the profile has no copy fit and there is work.
  std::optional<double> localUs(const LocalWork& work) const;

  nlohmann::json toJson() const;
  // Throws InputError naming `file` and the key on malformed input.
  static CostProfile fromJson(const nlohmann::json& j, const std::string& file);
  static CostProfile load(const std::string& path);
};

}  // namespace sb::harness
