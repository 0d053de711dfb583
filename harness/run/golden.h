#pragma once

// Golden losses: a file kept beside a suite (its `golden:` key) with the reference's loss and
// gradient norm at every optimizer step of every case that trains, as torchtitan's CI keeps
// per-step losses and compares each run with them. A change that moves the reference (a
// LibTorch upgrade, a workload's initialisation, the optimizer's arithmetic) then shows as a
// case whose losses left the file, where every row would still agree with the moved reference.
//
// Bitwise where the file was written on a host with the same vector units and intra-op thread
// count (LibTorch's kernels round differently with AVX-512 than with AVX2, and split a
// reduction by the threads): then each loss must be the same double.
// Elsewhere within the tolerance that steps compound (10 x steps x the dtype's), and the
// record says which comparison was made.
//
// The file (CSV, '#' lines are comments):
//   # suite: fsdp                    the suite it belongs to (files before it lack the line)
//   # cpu: avx avx2 avx512f ...      the vector features of the host that wrote it
//   # threads: 2                     its intra-op threads
//   case,step,loss,grad_norm         losses in C's hexadecimal floats (%a): exact, and portable
//   fsdp-mlp,1,0x1.2p+3,0x1.8p-1
//   "a,b",1,0x1.2p+3,0x1.8p-1        a name with a comma or a quote, or beginning with '#' or a
//                                    space, quoted as CSV quotes it

#include <map>
#include <string>
#include <vector>

#include "harness/case.h"
#include "reference/workload.h"

namespace sb::harness {

struct GoldenLosses {
  std::string file;
  std::string suite;  // the suite whose losses these are ("" in a file older than the line)
  std::string cpu;    // the writer's vector features
  int threads = 0;  // the writer's intra-op threads (0: not said)
  struct Step {
    double loss = 0, gradNorm = 0;
  };
  std::map<std::string, std::vector<Step>> cases;  // by case name, steps in order
};

// This host's vector features, from /proc/cpuinfo's flags (avx*, fma, f16c, amx*), sorted;
// "unknown" where there is no such file.
std::string hostVectorFeatures();
// This process's intra-op threads (at::get_num_threads()).
int hostThreads();

// Reads a golden file; throws InputError naming the file, line and what was expected.
GoldenLosses readGolden(const std::string& path);

// The file's text, for replaceResultFile.
std::string goldenText(const GoldenLosses& g);

// The case's reference (data.expected "loss" and "grad_norm") against the file, on a host with
// vector features `hostCpu` and `hostThreads` intra-op threads (hostVectorFeatures(),
// hostThreads(): read once per run): an empty `problem` when it holds, and in `how` what was
// compared ("bitwise equal to ..." or "within ...: written with other vector features ...").
struct GoldenVerdict {
  std::string problem, how;
};
GoldenVerdict compareGolden(const GoldenLosses& g, const CaseSpec& c,
                            const reference::WorkloadData& data, const std::string& hostCpu,
                            int hostThreads);

// The case's reference losses, as a golden entry; throws std::runtime_error where one is not
// finite (the reference diverged: its row errors, nothing is written for it).
std::vector<GoldenLosses::Step> goldenSteps(const reference::WorkloadData& data);

// Before --write-golden replaces `path`: throws InputError unless it is absent or a golden
// losses file (its first line the writer's), not a symbolic link (which would write another
// file), and never the suite file `suiteFile` itself.
void checkGoldenTarget(const std::string& path, const std::string& suiteFile);

}  // namespace sb::harness
