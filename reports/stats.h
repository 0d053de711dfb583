#pragma once

#include <vector>

namespace sb::reports {

double median(std::vector<double> v);  // NaN for an empty list
double mean(const std::vector<double>& v);
double stddev(const std::vector<double>& v);  // sample (n - 1); 0 for fewer than 2

// The Mann-Whitney U test of two independent samples: are values of `a` systematically larger
// or smaller than those of `b`? Rank-based, so it needs no normality and shrugs off the odd
// outlier a shared machine produces, which is why Google Benchmark's compare.py uses it too.
struct MannWhitney {
  double u = 0;       // U of `a`: pairs (x in a, y in b) with x > y, ties counting half
  double z = 0;       // normal approximation, tie-corrected, with continuity correction
  double pValue = 1;  // two-sided
};

// The normal approximation is accurate to about 0.01 in p from n = 8 per side; the gate asks
// for at least 9 repetitions on each side before it trusts the test at all.
MannWhitney mannWhitneyU(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace sb::reports
