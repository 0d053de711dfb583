#include "reports/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

namespace sb::reports {

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double mean(const std::vector<double>& v) {
  if (v.empty()) return std::nan("");
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

double stddev(const std::vector<double>& v) {
  if (v.size() < 2) return 0.0;
  const double m = mean(v);
  double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  return std::sqrt(ss / static_cast<double>(v.size() - 1));
}

MannWhitney mannWhitneyU(const std::vector<double>& a, const std::vector<double>& b) {
  MannWhitney r;
  const double n1 = static_cast<double>(a.size());
  const double n2 = static_cast<double>(b.size());
  if (a.empty() || b.empty()) return r;

  // Rank the pooled sample, ties sharing the mean of the ranks they span; U of `a` is then
  // its rank sum less the smallest rank sum it could have had, n1 (n1 + 1) / 2.
  std::vector<std::pair<double, int>> pooled;
  for (double x : a) pooled.emplace_back(x, 0);
  for (double y : b) pooled.emplace_back(y, 1);
  std::sort(pooled.begin(), pooled.end(),
            [](const auto& p, const auto& q) { return p.first < q.first; });
  const double n = n1 + n2;
  double rankSumA = 0, tieTerm = 0;
  for (size_t i = 0; i < pooled.size();) {
    size_t j = i;
    while (j < pooled.size() && pooled[j].first == pooled[i].first) ++j;
    const double t = static_cast<double>(j - i);
    const double rank = (static_cast<double>(i) + 1 + static_cast<double>(j)) / 2.0;
    for (size_t k = i; k < j; ++k) {
      if (pooled[k].second == 0) rankSumA += rank;
    }
    tieTerm += t * t * t - t;
    i = j;
  }
  r.u = rankSumA - n1 * (n1 + 1) / 2.0;

  // Under the null hypothesis U has mean n1 n2 / 2 and, with ties, variance
  // n1 n2 / 12 * ((n + 1) - sum(t^3 - t) / (n (n - 1))).
  const double mu = n1 * n2 / 2.0;
  const double var = n1 * n2 / 12.0 * ((n + 1) - tieTerm / (n * (n - 1)));
  if (var <= 0) return r;  // every value equal: no evidence of a shift
  const double diff = std::abs(r.u - mu);
  r.z = std::max(0.0, diff - 0.5) / std::sqrt(var) * (r.u >= mu ? 1 : -1);
  r.pValue = std::min(1.0, std::erfc(std::abs(r.z) / std::sqrt(2.0)));
  return r;
}

}  // namespace sb::reports
