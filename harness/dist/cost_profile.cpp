#include "harness/dist/cost_profile.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "harness/run/suite.h"

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

CostProfile::Fit fitFromJson(const nlohmann::json& j, const std::string& where) {
  CostProfile::Fit f;
  f.latencyUs = need<double>(j, "latency_us", where);
  f.usPerByte = need<double>(j, "us_per_byte", where);
  if (!(f.latencyUs >= 0) || !(f.usPerByte >= 0)) {
    throw InputError(where + ": latency_us and us_per_byte must be non-negative numbers");
  }
  if (j.contains("points")) {
    for (const auto& p : j.at("points")) {
      f.points.push_back({need<int64_t>(p, "bytes", where), need<double>(p, "time_us", where),
                          need<double>(p, "algbw_GBps", where),
                          need<double>(p, "busbw_GBps", where)});
    }
  }
  return f;
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
  if (need<int>(j, "schema_version", file) != 1) {
    throw InputError(file + ": schema_version " + j.at("schema_version").dump() +
                     " is not 1, the one this build reads");
  }
  p.backend = need<std::string>(j, "backend", file);
  p.mesh = need<std::string>(j, "mesh", file);
  p.host = j.value("host", "");
  p.timestampUtc = j.value("timestamp_utc", "");
  const nlohmann::json groupsJson = need<nlohmann::json>(j, "groups", file);
  for (const auto& [key, g] : groupsJson.items()) {
    const std::string where = file + ": groups." + key;
    Group group;
    group.size = need<int>(g, "size", where);
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
  p.gemm = fitFromJson(need<nlohmann::json>(j, "gemm_flops", file), file + ": gemm_flops");
  if (j.contains("copy_bytes")) p.copy = fitFromJson(j.at("copy_bytes"), file + ": copy_bytes");
  if (j.contains("step_overhead_us")) {
    const double us = need<double>(j, "step_overhead_us", file);
    if (!(us >= 0) || us > 1e9) {
      throw InputError(file + ": step_overhead_us must be a non-negative number of microseconds");
    }
    p.stepUs = us;
  }
  return p;
}

CostProfile CostProfile::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot read the cost profile");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(path + ": not JSON: " + e.what());
  }
  return fromJson(j, path);
}

}  // namespace sb::harness
