#include "harness/dist/cost_profile.h"
#include "harness/in_file.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "harness/comm/mesh.h"
#include "harness/error.h"
#include "harness/run/suite.h"
#include "reference/json_strict.h"

namespace sb::harness {

double CostProfile::busFactor(Collective c, int n) {
  if (n <= 1) return 0;
  switch (c) {
    case Collective::kAllReduce:
      return 2.0 * (n - 1) / n;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAllToAll:
      return static_cast<double>(n - 1) / n;
    case Collective::kBroadcast:
    case Collective::kSendRecv:
      return 1;
    case Collective::kBarrier:
      return 0;
  }
  return 0;
}

CostProfile::Fit CostProfile::fit(std::vector<Point> points) {
  Fit f;
  f.points = std::move(points);
  if (f.points.empty()) return f;
  // Weighted least squares on t = a + b x with weights 1/x: small sizes (latency) and large
  // ones (bandwidth) both count, instead of the largest point dominating.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& p : f.points) {
    const double x = static_cast<double>(std::max<int64_t>(p.bytes, 1));
    const double w = 1.0 / x;
    sw += w;
    sx += w * x;
    sy += w * p.timeUs;
    sxx += w * x * x;
    sxy += w * x * p.timeUs;
  }
  const double det = sw * sxx - sx * sx;
  double a = sy / sw, b = 0;
  if (f.points.size() > 1 && det > 0) {
    b = (sw * sxy - sx * sy) / det;
    a = (sy - b * sx) / sw;
  }
  if (b < 0) {  // time not growing with size: all latency
    b = 0;
    a = sy / sw;
  }
  if (a < 0) {  // refit through the origin
    a = 0;
    b = sxy / sxx;
  }
  f.latencyUs = a;
  f.usPerByte = b;
  return f;
}

std::string CostProfile::axesKey(const std::vector<int>& axes) {
  std::string key;
  for (int a : axes) key += (key.empty() ? "" : ",") + std::to_string(a);
  return key;
}

std::optional<double> CostProfile::commUs(const std::vector<int>& axes,
                                          const CommStats& stats) const {
  double us = 0;
  std::vector<int> sorted = axes;  // the same members, whatever order the group ranks them in
  std::sort(sorted.begin(), sorted.end());
  auto g = groups.find(axesKey(sorted));
  for (int i = 0; i < kNumCollectives; ++i) {
    const auto& e = stats.entries[i];
    if (e.calls == 0) continue;
    if (e.bytes == 0 && static_cast<Collective>(i) != Collective::kBarrier)
      continue;  // group of one
    if (g == groups.end()) return std::nullopt;
    auto f = g->second.collectives.find(static_cast<Collective>(i));
    if (f == g->second.collectives.end()) return std::nullopt;
    // Linear in size, so the total of the calls is calls x latency + bytes x slope.
    us += e.calls * f->second.latencyUs + f->second.usPerByte * e.bytes;
  }
  return us;
}

std::optional<double> CostProfile::localUs(const LocalWork& work) const {
  if (work.copies == 0 && work.bytes == 0) return 0.0;
  if (!copy) return std::nullopt;
  return work.copies * copy->latencyUs + copy->usPerByte * work.bytes;
}

namespace {

nlohmann::json fitToJson(const CostProfile::Fit& f) {
  nlohmann::json pts = nlohmann::json::array();
  for (const auto& p : f.points) {
    pts.push_back({{"bytes", p.bytes},
                   {"time_us", p.timeUs},
                   {"algbw_GBps", p.algbwGBps},
                   {"busbw_GBps", p.busbwGBps}});
  }
  return {{"latency_us", f.latencyUs}, {"us_per_byte", f.usPerByte}, {"points", pts}};
}

template <class T>
T need(const nlohmann::json& j, const std::string& key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) {
    throw InputError(where + ": missing key '" + key + "'");
  }
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw InputError(where + ": key '" + key + "' has the wrong type (" + j.at(key).dump() + ")");
  }
}

// A number at `key` in [0, hi]: a JSON number (not a string, not NaN), within the range, so
// that a prediction made from it stays finite (a latency of 1e308 us summed over a step is
// infinite, and a cost of 1e300 trips the integer program's own assertions).
double ranged(const nlohmann::json& j, const std::string& key, const std::string& where, double hi,
              const std::string& unit) {
  const double v = need<double>(j, key, where);
  if (!j.at(key).is_number() || !(v >= 0) || !(v <= hi)) {
    std::ostringstream range;
    range << hi;
    throw InputError(where + ": key '" + key + "' must be a number of " + unit + " from 0 to " +
                     range.str() + ", got " + j.at(key).dump());
  }
  return v;
}

// The largest latency (1000 s) and cost per byte (1 ms, a kilobyte a second) a profile may
// hold: far beyond any measured machine, and small enough that any step's sum stays finite.
constexpr double kMaxLatencyUs = 1e9;
constexpr double kMaxUsPerByte = 1e3;

CostProfile::Fit fitFromJson(const nlohmann::json& j, const std::string& where) {
  CostProfile::Fit f;
  f.latencyUs = ranged(j, "latency_us", where, kMaxLatencyUs, "microseconds");
  f.usPerByte = ranged(j, "us_per_byte", where, kMaxUsPerByte, "microseconds per unit");
  if (j.contains("points")) {
    if (!j.at("points").is_array()) throw InputError(where + ": key 'points' must be a list");
    for (const auto& p : j.at("points")) {
      CostProfile::Point pt;
      pt.bytes = static_cast<int64_t>(ranged(p, "bytes", where + ".points", 4.6e18, "bytes"));
      pt.timeUs = ranged(p, "time_us", where + ".points", 1e12, "microseconds");
      pt.algbwGBps = ranged(p, "algbw_GBps", where + ".points", 1e12, "GB/s");
      pt.busbwGBps = ranged(p, "busbw_GBps", where + ".points", 1e12, "GB/s");
      f.points.push_back(pt);
    }
  }
  return f;
}

// The groups `calibrate` measures on a mesh (harness/dist/calibrate.cpp): each axis of two or
// more ranks alone, then all axes together where there are several; with their sizes.
std::map<std::string, int> expectedGroups(const std::vector<int64_t>& mesh) {
  std::map<std::string, int> out;
  std::vector<int> all;
  int64_t size = 1;
  for (size_t a = 0; a < mesh.size(); ++a) {
    if (mesh[a] >= 2) out[std::to_string(a)] = static_cast<int>(mesh[a]);
    all.push_back(static_cast<int>(a));
    size *= mesh[a];
  }
  if (mesh.size() > 1 && size >= 2) out[CostProfile::axesKey(all)] = static_cast<int>(size);
  return out;
}

}  // namespace

nlohmann::json CostProfile::toJson() const {
  nlohmann::json j;
  j["schema_version"] = 1;
  j["backend"] = backend;
  j["mesh"] = mesh;
  j["host"] = host;
  j["timestamp_utc"] = timestampUtc;
  nlohmann::json gs = nlohmann::json::object();
  for (const auto& [key, g] : groups) {
    nlohmann::json cs = nlohmann::json::object();
    for (const auto& [c, f] : g.collectives) cs[collectiveName(c)] = fitToJson(f);
    gs[key] = {{"size", g.size}, {"collectives", cs}};
  }
  j["groups"] = gs;
  j["gemm_flops"] = fitToJson(gemm);
  if (copy) j["copy_bytes"] = fitToJson(*copy);
  if (stepUs) j["step_overhead_us"] = *stepUs;
  return j;
}

CostProfile CostProfile::fromJson(const nlohmann::json& j, const std::string& file) {
  CostProfile p;
  if (!j.is_object()) throw InputError(file + ": expected a JSON object (a cost profile)");
  // The integer 1 itself: a conversion to int would read 1.9 and 4294967297 as 1.
  const nlohmann::json version = need<nlohmann::json>(j, "schema_version", file);
  if (!version.is_number_integer() || version.get<int64_t>() != 1) {
    throw InputError(file + ": schema_version " + version.dump() +
                     " is not 1, the one this build reads");
  }
  p.backend = need<std::string>(j, "backend", file);
  p.mesh = need<std::string>(j, "mesh", file);
  std::vector<int64_t> meshShape;
  try {
    meshShape = DeviceMesh::parseShape(p.mesh);
  } catch (const c10::Error& e) {
    throw InputError(file + ": key 'mesh': " + e.what_without_backtrace());
  }
  const std::map<std::string, int> expected = expectedGroups(meshShape);
  const auto expectedList = [&] {
    std::string s;
    for (const auto& [key, size] : expected) {
      s += (s.empty() ? "" : ", ") + std::string("\"") + key + "\" (" + std::to_string(size) +
           " ranks)";
    }
    return s.empty() ? std::string("none") : s;
  };
  p.host = j.value("host", "");
  p.timestampUtc = j.value("timestamp_utc", "");
  const nlohmann::json groupsJson = need<nlohmann::json>(j, "groups", file);
  for (const auto& [key, g] : groupsJson.items()) {
    const std::string where = file + ": groups." + key;
    const auto want = expected.find(key);
    if (want == expected.end()) {
      throw InputError(where + ": not a group of mesh " + p.mesh +
                       " (its groups: " + expectedList() + ")");
    }
    Group group;
    const nlohmann::json sizeJson = need<nlohmann::json>(g, "size", where);
    if (!sizeJson.is_number_integer() || sizeJson.get<int64_t>() != want->second) {
      throw InputError(where + ": size " + sizeJson.dump() + " is not " +
                       std::to_string(want->second) + ", the group's ranks on mesh " + p.mesh);
    }
    group.size = want->second;
    const nlohmann::json collectives = need<nlohmann::json>(g, "collectives", where);
    for (const auto& [name, f] : collectives.items()) {
      bool known = false;
      for (int i = 0; i < kNumCollectives; ++i) {
        if (name == collectiveName(static_cast<Collective>(i))) {
          group.collectives[static_cast<Collective>(i)] = fitFromJson(f, where + "." + name);
          known = true;
        }
      }
      if (!known) throw InputError(where + ": unknown collective '" + name + "'");
    }
    p.groups[key] = group;
  }
  for (const auto& [key, size] : expected) {
    if (!p.groups.count(key)) {
      throw InputError(file + ": groups: group \"" + key + "\" of mesh " + p.mesh +
                       " is missing (expected " + expectedList() + ")");
    }
  }
  p.gemm = fitFromJson(need<nlohmann::json>(j, "gemm_flops", file), file + ": gemm_flops");
  if (j.contains("copy_bytes")) p.copy = fitFromJson(j.at("copy_bytes"), file + ": copy_bytes");
  if (j.contains("step_overhead_us")) {
    p.stepUs = ranged(j, "step_overhead_us", file, kMaxLatencyUs, "microseconds");
  }
  return p;
}

CostProfile CostProfile::load(const std::string& path) {
  if (const auto why = notARegularFile(path); !why.empty()) throw InputError(path + ": " + why);
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot read the cost profile");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = reference::parseJsonNoDuplicates(ss.str());
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(path + ": not JSON: " + e.what());
  } catch (const std::invalid_argument& e) {
    throw InputError(path + ": " + e.what());
  }
  return fromJson(j, path);
}

}  // namespace sb::harness
