// What an upgrade of LibTorch changed (report_internal.h, "versions.cpp"): where the results and
// the baseline ran on different LibTorch versions, the rows both have, side by side. A memory
// model that encodes what one ATen allocates, a kernel that sums in another order, a fused
// operator: each shows here as a peak, an error or a verdict that moved between the two, row by
// row, before any gate threshold decides whether it matters.

#include <cmath>
#include <map>

#include "reports/report_internal.h"

namespace sb::reports {
namespace {

std::string bytes(const std::optional<int64_t>& b) { return b ? std::to_string(*b) : "-"; }

std::string ratio(const std::optional<double>& r) { return r ? fmt("%.3g", *r) : "-"; }

// A row's memory model is exact when it predicts the measured peak to the byte.
bool exactMemory(const ResultRow& r) {
  return r.peakMemBytes && r.predictedMemBytes && *r.peakMemBytes == *r.predictedMemBytes;
}

bool samePeak(const ResultRow& a, const ResultRow& b) {
  return a.peakMemBytes.has_value() == b.peakMemBytes.has_value() &&
         (!a.peakMemBytes || *a.peakMemBytes == *b.peakMemBytes);
}

bool sameError(const ResultRow& a, const ResultRow& b) {
  if (a.errRatio.has_value() != b.errRatio.has_value()) return false;
  if (!a.errRatio) return true;
  return *a.errRatio == *b.errRatio || (std::isnan(*a.errRatio) && std::isnan(*b.errRatio));
}

}  // namespace

bool versionsDiffer(const std::vector<ResultRow>& cur, const std::vector<ResultRow>& base) {
  return !base.empty() &&
         distinct(cur, &ResultRow::torchVersion) != distinct(base, &ResultRow::torchVersion);
}

VersionTables versionTables(const Comparison& cmp, size_t limit) {
  struct Counts {
    int both = 0, sameStatus = 0, passBoth = 0, samePeak = 0, sameError = 0;
    int exactBase = 0, exactCur = 0, mispredBase = 0, mispredCur = 0;
    double logTimeRatio = 0;
    int timed = 0;
    double worstErrBase = 0, worstErrCur = 0;
  };
  std::map<std::string, Counts> byFamily;
  std::vector<std::string> order;
  VersionTables out;
  out.changes.id = "versions-changed";
  out.changes.head = {"case", "strategy", "backend", "status", "error / tolerance", "peak bytes",
                      "predicted bytes", "mispredicted"};
  int changed = 0;
  for (const auto& rc : cmp.rows) {
    if (!rc.current || !rc.baseline) continue;
    const ResultRow& c = *rc.current;
    const ResultRow& b = *rc.baseline;
    if (!byFamily.count(c.family)) order.push_back(c.family);
    Counts& n = byFamily[c.family];
    ++n.both;
    n.sameStatus += c.status == b.status;
    n.passBoth += c.status == "pass" && b.status == "pass";
    n.samePeak += samePeak(c, b);
    n.sameError += sameError(c, b);
    n.exactBase += exactMemory(b);
    n.exactCur += exactMemory(c);
    n.mispredBase += !b.mispredicted.empty();
    n.mispredCur += !c.mispredicted.empty();
    if (b.errRatio && !std::isnan(*b.errRatio)) n.worstErrBase = std::max(n.worstErrBase, *b.errRatio);
    if (c.errRatio && !std::isnan(*c.errRatio)) n.worstErrCur = std::max(n.worstErrCur, *c.errRatio);
    if (c.timeMedianUs && b.timeMedianUs && *c.timeMedianUs > 0 && *b.timeMedianUs > 0) {
      n.logTimeRatio += std::log(*c.timeMedianUs / *b.timeMedianUs);
      ++n.timed;
    }
    // A row is listed when what it computes or how its model fares moved: its status, its
    // verdict on predictions, its peak, or whether its model is exact. An error ratio that moved
    // within tolerance is counted above, not listed (every reduction order moves it).
    const bool moved = c.status != b.status || c.mispredicted != b.mispredicted ||
                       !samePeak(c, b) || exactMemory(c) != exactMemory(b);
    if (!moved) continue;
    ++changed;
    if (out.changes.rows.size() >= limit) continue;
    const auto arrow = [](const std::string& from, const std::string& to) {
      return from == to ? to : from + " -> " + to;
    };
    std::string peak = arrow(bytes(b.peakMemBytes), bytes(c.peakMemBytes));
    if (b.peakMemBytes && c.peakMemBytes && *b.peakMemBytes != *c.peakMemBytes) {
      const int64_t d = *c.peakMemBytes - *b.peakMemBytes;
      peak += " (" + std::string(d > 0 ? "+" : "") + std::to_string(d) + ")";
    }
    out.changes.rows.push_back(
        {{c.suite + "/" + c.caseName, ""},
         {c.strategyId, ""},
         {c.backend, ""},
         {arrow(b.status, c.status), c.status == b.status ? "" : c.status},
         {arrow(ratio(b.errRatio), ratio(c.errRatio)), ""},
         {peak, samePeak(c, b) ? "" : "warn"},
         {arrow(bytes(b.predictedMemBytes), bytes(c.predictedMemBytes)), ""},
         {arrow(b.mispredicted.empty() ? "-" : b.mispredicted,
                c.mispredicted.empty() ? "-" : c.mispredicted),
          c.mispredicted.empty() ? "" : "fail"}});
  }
  out.changed = changed;

  out.families.id = "versions";
  out.families.head = {"family", "rows in both", "same status", "pass on both",
                       "same error ratio", "worst error / tolerance", "same peak, to the byte",
                       "peak predicted to the byte", "mispredicted",
                       "median time, new / old (geometric mean)"};
  for (const auto& fam : order) {
    const Counts& n = byFamily[fam];
    out.both += n.both;
    out.samePeak += n.samePeak;
    const auto pair = [](int base, int cur) {
      return std::to_string(base) + " -> " + std::to_string(cur);
    };
    out.families.rows.push_back(
        {{fam, ""},
         {std::to_string(n.both), ""},
         {std::to_string(n.sameStatus), n.sameStatus == n.both ? "" : "warn"},
         {std::to_string(n.passBoth), ""},
         {std::to_string(n.sameError), ""},
         {fmt("%.3g", n.worstErrBase) + " -> " + fmt("%.3g", n.worstErrCur), ""},
         {std::to_string(n.samePeak), n.samePeak == n.both ? "" : "warn"},
         {pair(n.exactBase, n.exactCur), n.exactCur < n.exactBase ? "warn" : ""},
         {pair(n.mispredBase, n.mispredCur), n.mispredCur > 0 ? "fail" : ""},
         {n.timed ? fmt("%.3g", std::exp(n.logTimeRatio / n.timed)) + " (" +
                        std::to_string(n.timed) + " rows)"
                  : "-",
          ""}});
  }
  return out;
}

}  // namespace sb::reports
