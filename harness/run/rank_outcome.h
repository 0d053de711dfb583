#pragma once

// What one rank learnt in one row, and its JSON form: the message a rank of a multi-process run
// sends to rank 0 through the store. Its own file because both sides of that exchange (the row
// on this process's ranks, rank 0 composing the record) use it, and the record's details reuse
// the codec of its parts.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/comm/comm.h"
#include "harness/measure/verify.h"

namespace sb::harness {

// What one rank learnt in one row. On a c10d backend it travels as JSON to rank 0.
struct RankOutcome {
  explicit RankOutcome(int r = 0) : rank(r) {}
  int rank;
  std::string unsupported;  // prepare() said the case cannot run, and why
  std::string error;        // what went wrong on this rank
  int64_t errorAtMs = 0;    // wall clock of the error, to tell the first failure from its echoes
  int64_t peak = 0;
  int64_t startBytes = 0;  // live when the measured step started (its peak's baseline)
  // The runner's leak check (a step that leaves more live behind each time it runs): the live
  // bytes once the measured step returned on every rank (-1: not read: the step ran in another
  // process, or the device's allocation hook saw none of it), to compare with startBytes, what
  // the warm-up step left; and right after the first and the last timed step, with how many
  // steps were timed (0: not read).
  int64_t endBytes = -1;
  int64_t timedSteps = 0, afterFirstTimedBytes = 0, afterLastTimedBytes = 0;
  CommStats counted, wire;
  std::optional<int64_t> predictedPeak;
  std::optional<int64_t> memoryLimit;            // RankExecutor::memoryLimitBytes
  std::vector<TensorCheck> checks, checksAfter;  // after the measured step, after the timed ones
  // Per checked tensor after the measured step: its declared box and a hash of its bytes
  // (resultDigests), for the check that ranks holding the same box hold the same bits.
  std::map<std::string, std::string> digests;
  // Where this rank's step first left the reference (divergence.h); null: not captured.
  nlohmann::json divergence;
};

// A tensor check as JSON; a non-finite number as its text ("inf", "nan"), read back as such.
nlohmann::json checkToJson(const TensorCheck& c);
TensorCheck checkFromJson(const nlohmann::json& j);

// Calls and bytes of each collective that was called.
nlohmann::json commToJson(const CommStats& s);
CommStats commFromJson(const nlohmann::json& j);
// Per node and phase: [{"node", "phase", "comm": commToJson}].
nlohmann::json nodeCommToJson(const std::vector<NodeComm>& nodes);
std::vector<NodeComm> nodeCommFromJson(const nlohmann::json& j);

nlohmann::json outcomeToJson(const RankOutcome& o);
RankOutcome outcomeFromJson(const nlohmann::json& j);

}  // namespace sb::harness
