#pragma once

// A row's numerical verdict: each rank's results against the reference, whether the ranks'
// declared layouts cover every element, and the checks gathered and summarised for the record.
// Its own file because the row on this process's ranks and the record's composition both use
// it, and none of it depends on how the row ran.

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "harness/case.h"
#include "harness/measure/verify.h"
#include "harness/run/rank_outcome.h"
#include "harness/strategy.h"
#include "reference/workload.h"

namespace sb::harness {

// Fills data.rounding from `shadow`, the same reference built in float64 from the same values
// (reference::ValuesRoundedAs): per floating checked tensor, max |expected - shadow|. Measures
// nothing, and says why in data.roundingNote, where the shadow is not the same computation: an
// input value differs (the shadow did not start where the case did), or an output or the
// gradient norm differs by more than a quarter of its largest value. (Rounding alone moves an
// ill-conditioned model by percents: batch norm over a few values, a ReLU's sign flipped; the
// tolerance then honestly follows it.)
void measureReferenceRounding(reference::WorkloadData& data,
                              const reference::WorkloadData& shadow);

// The reference's own rounding for case `c` (docs/results.md), what tolerances are raised to
// where the result's magnitude understates the rounding of the terms that made it: `build` (the
// case's reference in a dtype) run in float64 from the case's values (reference::ValuesRoundedAs)
// and measured against `data` (measureReferenceRounding); and for each of `strategies` that
// computes in a lower dtype (arithmeticDtype), the reference built in that one against the same
// shadow, in data.roundingIn (empty where it could not be built or is another computation: those
// strategies' own tolerance). Only for a floating case below float64, and not where the
// environment has SB_REFERENCE_ROUNDING=off (the tolerances as strategies state them: an A/B of
// the floor). A shadow that fails to build leaves data.roundingNote saying why. The global
// generators (the CPU's, and the case device's where `onDevice`) are left as `data`'s build left
// them.
void measureCaseRounding(reference::WorkloadData& data, const CaseSpec& c,
                         const std::vector<const Strategy*>& strategies,
                         const std::function<reference::WorkloadData(at::ScalarType)>& build,
                         bool onDevice);

// Per floating checked tensor of `computed` (a reference built in some dtype from the case's
// values), max |computed - shadow|; empty, with `note` saying why, where an output or the gradient
// norm is more than a quarter off (another computation).
std::map<std::string, double> roundingAgainst(const reference::WorkloadData& computed,
                                              const reference::WorkloadData& shadow,
                                              std::string* note);

// The tolerance `strategy` states for `name`, raised to the reference's own rounding where it
// was measured (withReferenceRounding): in the case's dtype, and in the strategy's
// arithmeticDtype() where it computes in a lower one.
Tolerance rowTolerance(const CaseSpec& c, const reference::WorkloadData& data,
                       const Strategy& strategy, const std::string& name);

// Compares one rank's local tensors with the matching slices of the reference.
std::vector<TensorCheck> verifyRank(const CaseSpec& c, const reference::WorkloadData& data,
                                    const Strategy& strategy, int rank,
                                    const std::map<std::string, at::Tensor>& results);

// Per checked tensor this rank returned: "<declared box> <hash of its bytes>" (FNV-1a over the
// contiguous CPU copy, with its dtype): what replicaCheck compares across ranks.
std::map<std::string, std::string> resultDigests(const CaseSpec& c,
                                                 const reference::WorkloadData& data,
                                                 const Strategy& strategy, int rank,
                                                 const std::map<std::string, at::Tensor>& results);

// Replicas must agree bit for bit: ranks that declare the same box of a tensor hold copies of
// one value (a replicated parameter, its gradient, an all-reduced sum), and a copy computed
// differently (a gradient not summed on one mesh axis, a reduction in each rank's own order)
// drifts apart over steps even when every copy is within tolerance of the reference
// (torchtitan#1373: "check the gradients on GPU0 are bit-identical to GPU1").
struct ReplicaCheck {
  int64_t checked = 0;                // (tensor, box) groups of two or more ranks compared
  std::vector<std::string> problems;  // one per tensor whose copies differ
  nlohmann::json toJson() const { return {{"checked", checked}, {"problems", problems}}; }
  // One line for the row's message: how many tensors differ, and the first in full.
  std::string summary() const;
};
ReplicaCheck replicaCheck(const reference::WorkloadData& data,
                          const std::vector<RankOutcome>& ranks);

// Elements of each checked tensor that no rank's declared layout holds.
std::vector<std::string> coverageProblems(const CaseSpec& c, const reference::WorkloadData& data,
                                          const Strategy& strategy, int n);

// The declared layout against the one the strategy's specification gives: for every checked
// tensor and rank where Strategy::specifiedBox states a box, resultBoxOf must declare that box.
// The tensor checks compare each rank with the slice its strategy declares, so a layout that is
// wrong and computed consistently passes them all; this check does not.
struct SpecCheck {
  // One per tensor whose declared box differs from the specified one on some rank ("layout:
  // grad_weight on rank 1 is declared ... but the strategy's specification ... puts ...
  // there"), or whose specification could not be read.
  std::vector<std::string> problems;
  int64_t checked = 0;             // tensor x rank pairs compared
  std::vector<std::string> specs;  // the distinct specification texts, in order of first use
  // {"checked": N, "specs": [...], "problems": [...]}, for the record's details.
  nlohmann::json toJson() const;
};
SpecCheck specCheck(const CaseSpec& c, const reference::WorkloadData& data,
                    const Strategy& strategy, int n);

// Every rank's checks, tensor by tensor in the workload's order, then by rank.
std::vector<TensorCheck> allChecks(const reference::WorkloadData& data,
                                   const std::vector<RankOutcome>& ranks, bool after);

// No coverage problem and every check passed.
bool allPassed(const std::vector<TensorCheck>& checks, const std::vector<std::string>& problems);

// The problems and the first failed checks, at most three in all, "; "-separated.
std::string summarize(const std::vector<TensorCheck>& checks,
                      const std::vector<std::string>& problems);

}  // namespace sb::harness
