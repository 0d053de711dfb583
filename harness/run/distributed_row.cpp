// The multi-process row and the store protocol between the ranks (see distributed_row.h).
// Besides the observer's output, a rank writes to stderr itself: its own failure in a row, a
// lost store, and a missing verdict. Every rank writes these, not only rank 0 (whose observer
// alone is told anything), so they stay here.

#include "harness/run/distributed_row.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <thread>

#include <signal.h>

#include "harness/comm/c10d_backend.h"
#include "harness/dist/dist_env.h"
#include "harness/measure/memory.h"
#include "harness/run/compose.h"
#include "harness/run/local_run.h"
#include "harness/run/predict.h"
#include "harness/run/rank_outcome.h"
#include "harness/run/run_util.h"
#include "harness/run/runner.h"
#include "harness/run/suite_run.h"

namespace sb::harness {
namespace {

// Set when this rank stopped because rank 0 is gone or silent: it exits 1, so that a launcher
// sees a failure.
bool lostRank0 = false;

// A row of a multi-process run; see runPlanned in runner.h.
RowResult distributedRow(Session& session, int64_t seq, const CaseSpec& c,
                         const reference::WorkloadData* data, const std::string& buildError,
                         const Strategy& strategy, const Provenance& prov,
                         const RunOptions& options) {
  const bool writer = session.rank() == 0;
  Record rec = baseRecord(c, strategy, prov, options.backend);
  const DeviceMesh mesh(c.mesh);
  // Decided alike on every rank: no exchange needed.
  if (mesh.size() > session.worldSize()) {
    rec.status = Status::kSkipped;
    rec.message = "mesh " + mesh.toString() + " needs " + std::to_string(mesh.size()) +
                  " ranks but this run has " + std::to_string(session.worldSize()) +
                  " (start it with `stratbench launch -n " + std::to_string(mesh.size()) + "`)";
    return {writer ? std::optional<Record>(rec) : std::nullopt, false};
  }
  if (std::string why = deviceMissing(c); !why.empty()) {
    rec.status = Status::kSkipped;
    rec.message = why;
    return {writer ? std::optional<Record>(rec) : std::nullopt, false};
  }
  if (const Applicability a = applicabilityOf(strategy, c);
      a.kind != Applicability::Kind::kApplies) {
    rec.status = Status::kUnsupported;
    rec.message = a.reason;
    return {writer ? std::optional<Record>(rec) : std::nullopt, false};
  }

  const std::string key = "sb/row/" + std::to_string(seq);
  const int rank = session.rank();
  const bool inMesh = rank < mesh.size();
  LocalRun local;
  if (inMesh) {
    World* world = nullptr;
    std::string failure = buildError;
    if (failure.empty()) {
      try {
        world = session.world(mesh);
      } catch (const std::exception& e) {
        failure = "building the " + options.backend + " process groups failed: " + errorText(e);
        session.dropGroups();
      }
    }
    if (world) {
      local = runLocal(*world, c, *data, strategy, options, [&] { session.dropGroups(); });
    } else {
      local.ranks = {RankOutcome(rank)};
      local.ranks[0].error = failure;
      local.ranks[0].errorAtMs = nowMs();
    }
    if (!local.ranks[0].error.empty()) {
      // One write, so that the ranks' lines do not interleave.
      std::cerr << ("[rank " + std::to_string(rank) + "] " + c.name + " " + strategy.id() + ": " +
                    local.ranks[0].error + "\n");
    }
    if (!writer) {
      try {
        session.store().set(key + "/rank" + std::to_string(rank),
                            outcomeToJson(local.ranks[0]).dump());
      } catch (const std::exception& e) {
        // The store went with rank 0 (srun, mpirun: rank 0 serves it).
        std::cerr << ("[rank " + std::to_string(rank) + "] lost the store: " + errorText(e) + "\n");
        lostRank0 = true;
        return {std::nullopt, true};
      }
    }
  }

  std::string action = "continue";
  const auto timeout = session.timeout();
  if (writer) {
    // Every rank of the mesh reports; one that died or hangs never does.
    std::vector<RankOutcome> ranks{local.ranks[0]};
    std::vector<std::string> missing;
    // A live rank blocked on a hung one fails at its own collective's timeout, within this.
    const auto deadline = ControlStore::Clock::now() + timeout;
    for (int r = 1; r < mesh.size(); ++r) {
      std::optional<std::string> dead;
      auto v = session.store().waitFor(key + "/rank" + std::to_string(r), deadline, [&] {
        dead = session.store().get(deadRankKey(r));
        return dead.has_value();
      });
      if (v) {
        ranks.push_back(outcomeFromJson(nlohmann::json::parse(*v)));
      } else if (dead) {
        missing.push_back("rank " + std::to_string(r) + " " + *dead);
      } else {
        missing.push_back("rank " + std::to_string(r) + " did not finish within the " +
                          seconds(timeout) + " timeout (hung or unreachable)");
      }
    }
    if (!missing.empty()) {
      rec.status = Status::kError;
      std::string msg;
      for (const auto& m : missing) msg += (msg.empty() ? "" : "; ") + m;
      rec.message = msg + " in case " + c.name + ", strategy " + strategy.id() +
                    ": the process groups cannot be rebuilt without it, so the run stops";
      if (const std::string others = errorMessage(ranks, true); !others.empty()) {
        rec.message += " (" + others + ")";
      }
      action = "stop";
    } else if (data) {
      try {
        rec = compose(rec, c, *data, strategy, ranks, local, /*perRankErrors=*/true,
                      profileFor(options, c));
      } catch (const std::exception& e) {
        rec.status = Status::kError;
        rec.message = "composing the record failed: " + errorText(e);
      }
    } else {
      rec.status = Status::kError;
      rec.message = buildError;
    }
    // Any rank that failed has dropped its groups: every rank starts the next row afresh.
    if (action != "stop" &&
        (rec.status == Status::kError ||
         std::any_of(ranks.begin(), ranks.end(), [](const auto& o) { return !o.error.empty(); }))) {
      action = "rebuild";
    }
    session.store().set(key + "/verdict", action);
  } else {
    // A rank of the mesh hears within two timeouts; one outside it waits as long as rank 0
    // lives (the launcher marks a dead rank 0).
    const auto deadline = inMesh
                              ? ControlStore::Clock::now() + 2 * timeout + std::chrono::seconds(5)
                              : ControlStore::Clock::time_point::max();
    std::optional<std::string> v;
    try {
      v = session.store().waitFor(key + "/verdict", deadline, [&] {
        return session.store().get(deadRankKey(0)) || session.store().get("sb/abandoned");
      });
    } catch (const std::exception& e) {
      // The store went with rank 0 (srun, mpirun: rank 0 serves it).
      std::cerr << ("[rank " + std::to_string(rank) + "] lost the store: " + errorText(e) + "\n");
    }
    if (v) {
      action = *v;
    } else {
      std::cerr << ("[rank " + std::to_string(rank) + "] rank 0 gave no verdict on case " + c.name +
                    " " + strategy.id() + "; stopping\n");
      action = "stop";
      lostRank0 = true;
      // Ranks outside the mesh wait on rank 0 without a deadline: tell them.
      try {
        session.store().set("sb/abandoned", std::to_string(rank));
      } catch (const std::exception&) {
      }
    }
  }
  if (action == "rebuild") session.rebuild();
  return {writer ? std::optional<Record>(rec) : std::nullopt, action == "stop"};
}

}  // namespace

int runDistributed(const Suite& suite, const std::vector<PlannedCase>& plan,
                   const RunOptions& options, RunObserver& observer) {
  DistEnv env;
  try {
    env = detectDistEnv();
  } catch (const DistEnvError& e) {
    throw InputError(e.what());
  }
  // A master no resolver knows would be retried until the store's timeout: said up front (a
  // world of one serves its store there too).
  {
    if (const std::string why = resolveProblem(env.masterAddr); !why.empty()) {
      const char* given = std::getenv("MASTER_ADDR");
      throw InputError("the master host '" + env.masterAddr + "' (" +
                       (given && *given ? "MASTER_ADDR" : "the first host of the Slurm node list") +
                       ") " + why);
    }
  }
  // A peer that vanishes mid-send must be an error on this rank, not a SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  Session session(env, options.backend, options.collectiveTimeout);
  // Ranks other than 0 show nothing: a plain RunObserver does nothing.
  RunObserver silent;
  if (session.rank() == 0) {
    observer.sessionStarted(env, options.backend, session.localAddress(),
                            options.collectiveTimeout);
  }
  // SB_MEMORY_TRACE names a global rank; one past the world traces nothing in any process.
  if (const int traced = MemoryTracker::instance().tracedRank();
      session.rank() == 0 && traced >= env.worldSize) {
    observer.note("SB_MEMORY_TRACE=" + std::to_string(traced) +
                  " names no rank of this world (0 to " + std::to_string(env.worldSize - 1) +
                  "): nothing is traced");
  }
  const Provenance prov = Provenance::collect();
  int64_t seq = 0;
  const int rc = runLoop(
      suite, plan, options, prov, session.rank() == 0 ? observer : silent, session.rank() == 0,
      [&](const CaseSpec& c, const reference::WorkloadData* data, const std::string& buildError,
          const Strategy& s) {
        return distributedRow(session, seq++, c, data, buildError, s, prov, options);
      });
  // Where rank 0 serves the store (srun, mpirun, torchrun without its agent store), it stays
  // until every rank has read the last verdict; a lost rank never does, hence the bound.
  try {
    session.store().add("sb/finished", 1);
    if (session.rank() == 0 && !env.agentServesStore) {
      const auto deadline = ControlStore::Clock::now() + std::chrono::seconds(rc == 0 ? 30 : 5);
      while (session.store().add("sb/finished", 0) < env.worldSize &&
             ControlStore::Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  } catch (const std::exception&) {
    // The store is gone: nothing left to wait for.
  }
  return lostRank0 ? 1 : rc;
}

}  // namespace sb::harness
