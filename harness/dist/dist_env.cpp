#include "harness/dist/dist_env.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/types.h>

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
  // Digits only: stoll takes " 1" and "+1" as 1, where "abc" is refused.
  if (text.find_first_not_of("0123456789") != std::string::npos) {
    throw DistEnvError(std::string(name) + "='" + text +
                       "': expected an integer >= " + std::to_string(minimum) + " (digits only)");
  }
  size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size() || value < minimum) {
    throw DistEnvError(std::string(name) + "='" + text +
                       "': expected an integer >= " + std::to_string(minimum));
  }
  if (value > maximum) {
    throw DistEnvError(std::string(name) + "='" + text + "': expected at most " +
                       std::to_string(maximum) +
                       (maximum == kMaxWorldSize ? " (the most ranks a mesh may have)" : ""));
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

// Set to the empty string: a launcher script's `export MASTER_PORT=$PORT` with PORT unset. Taken
// as unset it would quietly fall back to a default the other ranks may not share.
void refuseEmpty(const Getenv& getenv, const char* name, const char* expected) {
  const char* v = getenv(name);
  if (v && !*v) {
    throw DistEnvError(std::string(name) + " is set but empty: expected " + expected +
                       " (unset it to use the default)");
  }
}

// Reads the rank, world size and local rank/size variables of one launcher.
void readRanks(const Getenv& getenv, DistEnv& e, const char* rank, const char* size,
               const char* localRank, const char* localSize) {
  // A local variable set but empty would fall back to the global rank in silence.
  for (const char* local : {localRank, localSize}) {
    if (local) refuseEmpty(getenv, local, "an integer (unset it to use the global one)");
  }
  e.rank = parseInt(getenv, rank, 0);
  e.worldSize = static_cast<int>(parseInt64(getenv, size, 1, kMaxWorldSize));
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
    throw DistEnvError(ls + "=" + std::to_string(e.localWorldSize) + " is more than " + size + "=" +
                       std::to_string(e.worldSize) +
                       ": a host cannot hold more ranks than the "
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
  const auto unreadable = [&](const std::string& why) {
    return DistEnvError("SLURM node list '" + nodelist + "': cannot read its first host (" + why +
                        ")");
  };
  // "node[03-05,9]-ib" or "rack[1-2]-n[01-04]": in every bracket the first number of its first
  // entry, zero padding kept, the text around the brackets kept. An entry is a number or a
  // range LOW-HIGH that does not run backwards (Slurm's own syntax): "node[5-1]" or "node[a]"
  // is no list Slurm writes.
  std::string host;
  size_t at = 0;
  const auto digitsEnd = [&](size_t from) {
    while (from < first.size() && std::isdigit(static_cast<unsigned char>(first[from]))) ++from;
    return from;
  };
  while (at < first.size()) {
    const size_t open = first.find('[', at);
    if (open == std::string::npos) {
      host += first.substr(at);
      break;
    }
    host += first.substr(at, open - at);
    const size_t lowEnd = digitsEnd(open + 1);
    if (lowEnd == open + 1) throw unreadable("expected a number after '['");
    const std::string low = first.substr(open + 1, lowEnd - open - 1);
    size_t next = lowEnd;
    if (next < first.size() && first[next] == '-') {
      const size_t highEnd = digitsEnd(next + 1);
      if (highEnd == next + 1) throw unreadable("expected a number after '-'");
      const std::string high = first.substr(next + 1, highEnd - next - 1);
      // Compared as numbers of any length: leading zeros dropped, then by length, then digits.
      const auto trimmed = [](const std::string& d) {
        const size_t nz = d.find_first_not_of('0');
        return nz == std::string::npos ? std::string("0") : d.substr(nz);
      };
      const std::string a = trimmed(low), b = trimmed(high);
      if (a.size() > b.size() || (a.size() == b.size() && a > b)) {
        throw unreadable("the range " + low + "-" + high + " runs backwards");
      }
      next = highEnd;
    }
    if (next >= first.size() || (first[next] != ',' && first[next] != ']')) {
      throw unreadable("expected ',' or ']' after " + low);
    }
    const size_t close = first.find(']', next);
    if (close == std::string::npos) throw unreadable("a '[' without its ']'");
    host += low;
    at = close + 1;
  }
  if (host.empty()) throw unreadable("no host");
  return host;
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
    refuseEmpty(getenv, "MASTER_ADDR", "the host of rank 0");
    if (e.worldSize > 1 && !isSet(getenv, "MASTER_ADDR")) {
      throw DistEnvError("RANK/WORLD_SIZE are set (world of " + std::to_string(e.worldSize) +
                         ") but MASTER_ADDR is not: the ranks cannot find each other");
    }
  } else if (isSet(getenv, "SLURM_PROCID") && !isSet(getenv, "SLURM_NTASKS") &&
             !isSet(getenv, "SLURM_STEP_NUM_TASKS")) {
    // A rank of srun's without the world it belongs to: a mistake, never a world of one that
    // silently runs every row alone. (SLURM_NTASKS alone is salloc's shell: a world of one.)
    throw DistEnvError("SLURM_PROCID=" + std::string(getenv("SLURM_PROCID")) +
                       " is set but SLURM_NTASKS is not: srun sets both (unset SLURM_PROCID, or "
                       "start the ranks with srun)");
  } else if (isSet(getenv, "SLURM_PROCID")) {
    // srun sets the step's variables in every task it starts (SLURM_STEP_ID, SLURM_STEP_NUM_TASKS,
    // SLURM_STEP_NODELIST); an sbatch script's own shell has SLURM_PROCID=0 and the allocation's
    // SLURM_NTASKS without them. It is one process: as rank 0 of SLURM_NTASKS it would wait for
    // ranks nobody starts until the store's timeout.
    if (!isSet(getenv, "SLURM_STEP_ID") && !isSet(getenv, "SLURM_STEP_NUM_TASKS")) {
      throw DistEnvError(
          "SLURM_PROCID=" + std::string(getenv("SLURM_PROCID")) +
          " and SLURM_NTASKS=" + getenv("SLURM_NTASKS") +
          " are set but SLURM_STEP_ID and SLURM_STEP_NUM_TASKS are not: this is a batch "
          "script's own shell, not a task srun started, and no other rank would come. Start "
          "the ranks with srun (srun stratbench run ... --backend gloo), or run one process "
          "with --backend threads");
    }
    e.launcher = "srun";
    const char* job = getenv("SLURM_JOB_ID");
    const char* stepId = getenv("SLURM_STEP_ID");
    e.runKey = std::string("slurm/") + (job && *job ? job : "?") + "." +
               (stepId && *stepId ? stepId : "0");
    // The step's counts where srun gave them: under `srun --preserve-env` SLURM_NTASKS and
    // SLURM_NTASKS_PER_NODE stay the allocation's, which a smaller step does not fill.
    const char* world =
        isSet(getenv, "SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
    const char* perNode = isSet(getenv, "SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE"
                                                                     : "SLURM_NTASKS_PER_NODE";
    readRanks(getenv, e, "SLURM_PROCID", world, "SLURM_LOCALID", nullptr);
    // SLURM_NTASKS_PER_NODE is "4" or "4(x2)" or "4(x2),2": the first node's count is the
    // leading number, which must be a count of ranks this world can hold.
    if (const char* per = getenv(perNode); per && *per) {
      const std::string text = per;
      size_t digits = 0;
      while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) {
        ++digits;
      }
      const std::string lead = text.substr(0, std::min<size_t>(digits, 9));
      const int n = lead.empty() ? 0 : std::stoi(lead);
      if (digits == 0 || digits > 9 || n < 1 || n > e.worldSize ||
          (digits < text.size() && text[digits] != '(' && text[digits] != ',')) {
        throw DistEnvError(std::string(perNode) + "='" + text +
                           "': expected a count of ranks from 1 to " + world + "=" +
                           std::to_string(e.worldSize) + " (as '4' or '4(x2)')");
      }
      e.localWorldSize = n;
      if (e.localRank >= e.localWorldSize) {
        throw DistEnvError("SLURM_LOCALID=" + std::to_string(e.localRank) + " is not below " +
                           perNode + "=" + text);
      }
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
  refuseEmpty(getenv, "MASTER_ADDR", "the host of rank 0");
  refuseEmpty(getenv, "MASTER_PORT", "a port number 1-65535");
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
  if (host.front() == '-' || host.front() == '.')
    return "a host name starts with a letter or digit";
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

std::string resolveProblem(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (found) ::freeaddrinfo(found);
  if (rc == 0) return "";
  // A resolver that cannot answer now (EAI_AGAIN) may answer later: c10d retries, so do not
  // refuse what is only a slow name server.
  if (rc == EAI_AGAIN) return "";
  return std::string("does not resolve to an address (") + ::gai_strerror(rc) + ")";
}

std::pair<int64_t, std::string> launchedWorld(const Getenv& getenv) {
  const auto count = [&](const char* name) -> int64_t {
    const char* v = getenv(name);
    if (!v || !*v) return 0;
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    return n > 0 ? n : 0;
  };
  const bool torchrunLike = isSet(getenv, "RANK") || isSet(getenv, "WORLD_SIZE");
  for (const char* name :
       {"WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (std::string(name) == "WORLD_SIZE" && !torchrunLike) continue;
    if (std::string(name) == "SLURM_STEP_NUM_TASKS" && !isSet(getenv, "SLURM_PROCID")) continue;
    if (const int64_t n = count(name); n > 1) return {n, name};
  }
  return {1, ""};
}

std::pair<int64_t, std::string> launchedWorld() {
  return launchedWorld([](const char* name) { return std::getenv(name); });
}

DistEnv detectDistEnv() {
  return detectDistEnv([](const char* name) { return std::getenv(name); });
}

}  // namespace sb::harness
