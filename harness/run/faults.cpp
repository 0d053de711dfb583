// Test-only fault injection (see faults.h) and the parser of its flag.

#include "harness/run/faults.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <iostream>
#include <stdexcept>
#include <thread>

#include <signal.h>
#include <unistd.h>

#include "harness/error.h"
#include "harness/run/runner.h"

namespace sb::harness {
namespace {

std::atomic<int> measuredSteps{0};

}  // namespace

void maybeFireRankFault(const RunOptions& options, int rank) {
  if (!options.rankFault || options.rankFault->rank != rank) return;
  if (++measuredSteps != options.rankFault->row) return;
  switch (options.rankFault->kind) {
    case RunOptions::RankFault::Kind::kThrow:
      throw std::runtime_error("planted fault: rank " + std::to_string(rank) +
                               " threw in its measured step");
    case RunOptions::RankFault::Kind::kCrash:
      std::cerr << "[rank " << rank << "] planted fault: killing myself with SIGKILL" << std::endl;
      ::kill(::getpid(), SIGKILL);
      break;
    case RunOptions::RankFault::Kind::kHang:
      std::cerr << "[rank " << rank << "] planted fault: hanging" << std::endl;
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
}

RunOptions::RankFault parseRankFault(const std::string& text) {
  RunOptions::RankFault f;
  const auto at = text.find('@');
  const auto at2 = at == std::string::npos ? at : text.find('@', at + 1);
  const std::string kind = text.substr(0, at);
  bool ok = at != std::string::npos;
  if (kind == "throw") {
    f.kind = RunOptions::RankFault::Kind::kThrow;
  } else if (kind == "crash") {
    f.kind = RunOptions::RankFault::Kind::kCrash;
  } else if (kind == "hang") {
    f.kind = RunOptions::RankFault::Kind::kHang;
  } else {
    ok = false;
  }
  if (ok) {
    try {
      const std::string rankText =
          text.substr(at + 1, at2 == std::string::npos ? at2 : at2 - at - 1);
      size_t used = 0;
      f.rank = std::stoi(rankText, &used);
      ok = used == rankText.size() && f.rank >= 0;
      if (ok && at2 != std::string::npos) {
        const std::string rowText = text.substr(at2 + 1);
        f.row = std::stoi(rowText, &used);
        ok = used == rowText.size() && f.row >= 1;
      }
    } catch (const std::exception&) {
      ok = false;
    }
  }
  if (!ok) {
    throw InputError("--plant-rank-fault '" + text +
                     "': expected KIND@RANK[@ROW] with KIND throw, crash or hang, e.g. crash@2 or "
                     "hang@1@5 (the rank's fifth row)");
  }
  return f;
}

}  // namespace sb::harness
