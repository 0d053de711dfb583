#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

namespace sb::harness {

// Where this process sits in a multi-process run, read from the environment its launcher set.
//
// Launchers and the variables read, first match wins:
//   - `stratbench launch` and torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//     MASTER_ADDR, MASTER_PORT (torchrun also sets TORCHELASTIC_RUN_ID; with
//     TORCHELASTIC_USE_AGENT_STORE=True its agent serves the store, as `launch` does with
//     STRATBENCH_AGENT_STORE=1).
//   - Slurm's srun: SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), SLURM_LOCALID,
//     SLURM_STEP_TASKS_PER_NODE (else SLURM_NTASKS_PER_NODE), in a task srun started (one with
//     SLURM_STEP_ID or SLURM_STEP_NUM_TASKS: an sbatch script's own shell, SLURM_PROCID=0
//     without them, is refused rather than waiting as rank 0 for ranks nobody starts); the
//     master is the first host of SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST) unless
//     MASTER_ADDR is set; the port, unless MASTER_PORT is set, is 15000 + SLURM_JOB_ID % 20000
//     so that jobs sharing a node do not collide.
//   - Open MPI's mpirun: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//     OMPI_COMM_WORLD_LOCAL_SIZE.
//   - MPICH / Intel MPI (Hydra): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID.
// Under mpirun, MASTER_ADDR must be exported (`mpirun -x MASTER_ADDR=host`) when the ranks
// span hosts; on one host it defaults to 127.0.0.1. Nothing set: a world of one.
struct DistEnv {
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  int localWorldSize = 1;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
  std::string launcher = "none";  // "stratbench", "torchrun", "srun", "mpirun", "env"
  bool agentServesStore = false;  // the launcher hosts the store; rank 0 connects as a client
  // Namespace of this run's keys in a store that may outlive it or be shared: torchrun's agent
  // store survives restarts ("torchrun/RUN_ID/RESTART_COUNT"), Slurm steps of one job may
  // meet on one port ("slurm/JOB.STEP"). Empty where the store is the run's own.
  std::string runKey;
};

// The most ranks a world may have: DeviceMesh::kMaxRanks, the largest mesh a case can name (a
// larger WORLD_SIZE would wait out the whole timeout for ranks no case could use).
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 16;

// A malformed or inconsistent variable; the message names it and its value.
class DistEnvError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Reads the variables above through `getenv` (returns nullptr for unset). Throws DistEnvError.
DistEnv detectDistEnv(const std::function<const char*(const char*)>& getenv);
// The process environment.
DistEnv detectDistEnv();

// How many processes the launcher variables say were started together, and the variable that
// says so ({1, ""} where none does), read without judging anything else: for a run that is one
// process by design (`--backend threads`), which must not run once per launched process. srun's
// count is SLURM_STEP_NUM_TASKS, which srun sets and an sbatch script's own shell has not.
std::pair<int64_t, std::string> launchedWorld(
    const std::function<const char*(const char*)>& getenv);
std::pair<int64_t, std::string> launchedWorld();

// The first host of a Slurm host list: "node[03-05,9],gpu1" -> "node03". Throws DistEnvError
// on a list Slurm does not write ("node[]", "node[5-1]", "node[a]").
std::string firstSlurmHost(const std::string& nodelist);

// "" where `host` can name a host (a name of letters, digits, '.', '-' and '_', or an IPv4 or
// IPv6 address), else what is wrong with it: an address the store would wait on for the whole
// timeout ("bad host!", "") is bad input said up front.
std::string hostProblem(const std::string& host);

// "" where `host` resolves to an address (getaddrinfo), else the resolver's reason: a name no
// resolver knows ("nonexistent.invalid") would otherwise be retried for the whole timeout.
std::string resolveProblem(const std::string& host);

}  // namespace sb::harness
