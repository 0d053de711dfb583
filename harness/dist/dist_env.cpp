#include "harness/dist/dist_env.h"

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <limits>

namespace sb::harness {
namespace {

using Getenv = std::function<const char*(const char*)>;

int64_t parseInt64(const Getenv& getenv, const char* name, int64_t minimum, int64_t maximum) {
  const char* v = getenv(name);
  const std::string text = v ? v : "";
  size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size() || value < minimum || value > maximum) {
    throw DistEnvError(std::string(name) + "='" + text +
                       "': expected an integer >= " + std::to_string(minimum));
  }
  return value;
}

int parseInt(const Getenv& getenv, const char* name, int minimum) {
  return static_cast<int>(parseInt64(getenv, name, minimum, 1 << 24));
}

bool isSet(const Getenv& getenv, const char* name) {
  const char* v = getenv(name);
  return v && *v;
}

// Reads the rank, world size and local rank/size variables of one launcher.
void readRanks(const Getenv& getenv, DistEnv& e, const char* rank, const char* size,
               const char* localRank, const char* localSize) {
  e.rank = parseInt(getenv, rank, 0);
  e.worldSize = parseInt(getenv, size, 1);
  e.localRank = localRank && isSet(getenv, localRank) ? parseInt(getenv, localRank, 0) : e.rank;
  e.localWorldSize =
      localSize && isSet(getenv, localSize) ? parseInt(getenv, localSize, 1) : e.worldSize;
  if (e.rank >= e.worldSize) {
    throw DistEnvError(std::string(rank) + "=" + std::to_string(e.rank) + " is not below " + size +
                       "=" + std::to_string(e.worldSize));
  }
  // The local view must fit the global one: a rank's place on its host below the host's rank
  // count, which is no more than the world's.
  const std::string lr = localRank ? localRank : rank, ls = localSize ? localSize : size;
  if (e.localRank < 0 || e.localRank >= e.localWorldSize) {
    throw DistEnvError(lr + "=" + std::to_string(e.localRank) + " is not below " + ls + "=" +
                       std::to_string(e.localWorldSize));
  }
  if (e.localWorldSize > e.worldSize) {
    throw DistEnvError(ls + "=" + std::to_string(e.localWorldSize) + " is more than " + size +
                       "=" + std::to_string(e.worldSize) + ": a host cannot hold more ranks than the "
                       "world");
  }
}

}  // namespace

std::string firstSlurmHost(const std::string& nodelist) {
  // The first entry ends at a comma outside brackets.
  size_t end = 0;
  int depth = 0;
  for (; end < nodelist.size(); ++end) {
    if (nodelist[end] == '[') ++depth;
    if (nodelist[end] == ']') --depth;
    if (nodelist[end] == ',' && depth == 0) break;
  }
  const std::string first = nodelist.substr(0, end);
  const size_t open = first.find('[');
  if (open == std::string::npos) return first;
  // "node[03-05,9]": the prefix and the first number of the range, zero padding kept.
  const size_t stop = first.find_first_of(",-]", open + 1);
  if (stop == std::string::npos || stop == open + 1) {
    throw DistEnvError("SLURM node list '" + nodelist + "': cannot read its first host");
  }
  return first.substr(0, open) + first.substr(open + 1, stop - open - 1);
}

DistEnv detectDistEnv(const Getenv& getenv) {
  DistEnv e;
  if (isSet(getenv, "RANK") || isSet(getenv, "WORLD_SIZE")) {
    readRanks(getenv, e, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
    if (isSet(getenv, "STRATBENCH_AGENT_STORE")) {
      e.launcher = "stratbench";
      e.agentServesStore = true;
    } else if (isSet(getenv, "TORCHELASTIC_RUN_ID")) {
      e.launcher = "torchrun";
      const char* restart = getenv("TORCHELASTIC_RESTART_COUNT");
      e.runKey = std::string("torchrun/") + getenv("TORCHELASTIC_RUN_ID") + "/" +
                 (restart && *restart ? restart : "0");
      const char* agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
      e.agentServesStore = agent && std::string(agent) == "True";
    } else {
      e.launcher = "env";
    }
    if (e.worldSize > 1 && !isSet(getenv, "MASTER_ADDR")) {
      throw DistEnvError("RANK/WORLD_SIZE are set (world of " + std::to_string(e.worldSize) +
                         ") but MASTER_ADDR is not: the ranks cannot find each other");
    }
  } else if (isSet(getenv, "SLURM_PROCID") && !isSet(getenv, "SLURM_NTASKS")) {
    // A rank of srun's without the world it belongs to: a mistake, never a world of one that
    // silently runs every row alone. (SLURM_NTASKS alone is salloc's shell: a world of one.)
    throw DistEnvError("SLURM_PROCID=" + std::string(getenv("SLURM_PROCID")) +
                       " is set but SLURM_NTASKS is not: srun sets both (unset SLURM_PROCID, or "
                       "start the ranks with srun)");
  } else if (isSet(getenv, "SLURM_PROCID") && isSet(getenv, "SLURM_NTASKS")) {
    e.launcher = "srun";
    const char* job = getenv("SLURM_JOB_ID");
    const char* stepId = getenv("SLURM_STEP_ID");
    e.runKey = std::string("slurm/") + (job && *job ? job : "?") + "." +
               (stepId && *stepId ? stepId : "0");
    readRanks(getenv, e, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr);
    // SLURM_NTASKS_PER_NODE is "4" or "4(x2)"; only its leading number matters here.
    if (const char* per = getenv("SLURM_NTASKS_PER_NODE"); per && *per) {
      e.localWorldSize = std::atoi(per) > 0 ? std::atoi(per) : e.worldSize;
    }
    if (!isSet(getenv, "MASTER_ADDR")) {
      const char* list = isSet(getenv, "SLURM_STEP_NODELIST") ? getenv("SLURM_STEP_NODELIST")
                                                              : getenv("SLURM_JOB_NODELIST");
      if (list && *list) e.masterAddr = firstSlurmHost(list);
    }
    if (!isSet(getenv, "MASTER_PORT") && isSet(getenv, "SLURM_JOB_ID")) {
      e.masterPort = static_cast<int>(
          15000 +
          parseInt64(getenv, "SLURM_JOB_ID", 0, std::numeric_limits<int64_t>::max()) % 20000);
    }
  } else if (isSet(getenv, "OMPI_COMM_WORLD_RANK")) {
    e.launcher = "mpirun";
    readRanks(getenv, e, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
              "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE");
  } else if (isSet(getenv, "PMI_RANK")) {
    e.launcher = "mpirun";
    readRanks(getenv, e, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", nullptr);
  } else {
    return e;  // a world of one
  }
  if (e.launcher == "mpirun" && !isSet(getenv, "MASTER_ADDR") && e.localWorldSize < e.worldSize) {
    throw DistEnvError("mpirun started " + std::to_string(e.worldSize) + " ranks, " +
                       std::to_string(e.localWorldSize) +
                       " per host, but MASTER_ADDR is not set: export it (mpirun -x "
                       "MASTER_ADDR=<host of rank 0>)");
  }
  if (isSet(getenv, "MASTER_ADDR")) {
    e.masterAddr = getenv("MASTER_ADDR");
    if (const std::string why = hostProblem(e.masterAddr); !why.empty()) {
      throw DistEnvError("MASTER_ADDR='" + e.masterAddr + "': " + why);
    }
  } else if (const std::string why = hostProblem(e.masterAddr); !why.empty()) {
    throw DistEnvError("the first host of SLURM_STEP_NODELIST, '" + e.masterAddr + "': " + why);
  }
  if (isSet(getenv, "MASTER_PORT")) {
    e.masterPort = parseInt(getenv, "MASTER_PORT", 1);
    if (e.masterPort > 65535)
      throw DistEnvError("MASTER_PORT=" + std::to_string(e.masterPort) +
                         ": expected a port number below 65536");
  }
  return e;
}

std::string hostProblem(const std::string& host) {
  if (host.empty()) return "no host named";
  if (host.size() > 253) return "longer than the 253 characters of a host name";
  if (host.front() == '-' || host.front() == '.') return "a host name starts with a letter or digit";
  for (unsigned char c : host) {
    if (!(std::isalnum(c) || c == '.' || c == '-' || c == '_' || c == ':' || c == '%')) {
      std::string why(1, '\'');
      why.push_back(static_cast<char>(c));
      why += "' is in no host name or address (letters, digits, '.', '-', '_'; ':' in IPv6)";
      return why;
    }
  }
  return "";
}

DistEnv detectDistEnv() {
  return detectDistEnv([](const char* name) { return std::getenv(name); });
}

}  // namespace sb::harness
