// The launcher environments a multi-process run reads: stratbench launch, torchrun, srun,
// mpirun (Open MPI and Hydra), and the errors for malformed or inconsistent variables.

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "harness/dist/dist_env.h"

namespace sb::harness {
namespace {

DistEnv detect(const std::map<std::string, std::string>& env) {
  return detectDistEnv([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

std::string errorOf(const std::map<std::string, std::string>& env) {
  try {
    detect(env);
  } catch (const DistEnvError& e) {
    return e.what();
  }
  return "";
}

TEST(DistEnv, NothingSetIsAWorldOfOne) {
  const DistEnv e = detect({{"HOME", "/root"}});
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.worldSize, 1);
  EXPECT_EQ(e.launcher, "none");
  EXPECT_FALSE(e.agentServesStore);
}

TEST(DistEnv, StratbenchLaunch) {
  const DistEnv e = detect({{"RANK", "5"},
                            {"WORLD_SIZE", "8"},
                            {"LOCAL_RANK", "1"},
                            {"LOCAL_WORLD_SIZE", "4"},
                            {"MASTER_ADDR", "10.0.0.1"},
                            {"MASTER_PORT", "29400"},
                            {"STRATBENCH_AGENT_STORE", "1"}});
  EXPECT_EQ(e.launcher, "stratbench");
  EXPECT_TRUE(e.agentServesStore);
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.worldSize, 8);
  EXPECT_EQ(e.localRank, 1);
  EXPECT_EQ(e.localWorldSize, 4);
  EXPECT_EQ(e.masterAddr, "10.0.0.1");
  EXPECT_EQ(e.masterPort, 29400);
}

TEST(DistEnv, TorchrunWithAndWithoutItsAgentStore) {
  std::map<std::string, std::string> env{{"RANK", "0"},           {"WORLD_SIZE", "2"},
                                         {"LOCAL_RANK", "0"},     {"MASTER_ADDR", "node7"},
                                         {"MASTER_PORT", "1234"}, {"TORCHELASTIC_RUN_ID", "abc"}};
  DistEnv e = detect(env);
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_FALSE(e.agentServesStore);  // rank 0 serves it
  EXPECT_EQ(e.masterAddr, "node7");
  EXPECT_EQ(e.runKey, "torchrun/abc/0");
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  env["TORCHELASTIC_RESTART_COUNT"] = "2";
  e = detect(env);
  EXPECT_TRUE(e.agentServesStore);        // the agent serves it on MASTER_PORT: rank 0 connects
  EXPECT_EQ(e.runKey, "torchrun/abc/2");  // a restarted attempt never reads the last one's keys
}

TEST(DistEnv, Srun) {
  const DistEnv e = detect({{"SLURM_PROCID", "6"},
                            {"SLURM_NTASKS", "8"},
                            {"SLURM_STEP_ID", "0"},
                            {"SLURM_LOCALID", "2"},
                            {"SLURM_NTASKS_PER_NODE", "4(x2)"},
                            {"SLURM_JOB_ID", "123456789"},
                            {"SLURM_JOB_NODELIST", "gpu[07-08]"}});
  EXPECT_EQ(e.launcher, "srun");
  EXPECT_EQ(e.rank, 6);
  EXPECT_EQ(e.worldSize, 8);
  EXPECT_EQ(e.localRank, 2);
  EXPECT_EQ(e.localWorldSize, 4);
  EXPECT_EQ(e.masterAddr, "gpu07");
  EXPECT_EQ(e.masterPort, 15000 + 123456789 % 20000);  // job ids pass 2^24 on big clusters
  EXPECT_EQ(e.runKey, "slurm/123456789.0");
  // The step's node list wins over the job's, MASTER_ADDR/PORT over both.
  EXPECT_EQ(detect({{"SLURM_PROCID", "0"},
                    {"SLURM_NTASKS", "2"},
                    {"SLURM_STEP_ID", "3"},
                    {"SLURM_STEP_NODELIST", "a1,b2"},
                    {"SLURM_JOB_NODELIST", "z[1-9]"}})
                .masterAddr,
            "a1");
  const DistEnv m = detect({{"SLURM_PROCID", "0"},
                            {"SLURM_NTASKS", "2"},
                            {"SLURM_STEP_ID", "3"},
                            {"SLURM_JOB_NODELIST", "z[1-9]"},
                            {"MASTER_ADDR", "head"},
                            {"MASTER_PORT", "4000"}});
  EXPECT_EQ(m.masterAddr, "head");
  EXPECT_EQ(m.masterPort, 4000);
}

// The variables of a task srun starts (SLURM_STEP_* among them) against an sbatch script's own
// shell, which has SLURM_PROCID=0 and the allocation's SLURM_NTASKS but no step: as rank 0 of 4
// it waited for ranks nobody starts, until the store's timeout.
TEST(DistEnv, AnSbatchScriptsOwnShellIsNotRankZeroOfASrunStep) {
  const std::string why = errorOf({{"SLURM_PROCID", "0"},
                                   {"SLURM_NTASKS", "4"},
                                   {"SLURM_JOB_ID", "77"},
                                   {"SLURM_JOB_NODELIST", "n[1-2]"},
                                   {"SLURM_NTASKS_PER_NODE", "2(x2)"}});
  EXPECT_NE(why.find("SLURM_PROCID=0 and SLURM_NTASKS=4 are set but SLURM_STEP_ID and "
                     "SLURM_STEP_NUM_TASKS are not"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("srun"), std::string::npos) << why;
  // Either step variable marks a task of srun's.
  EXPECT_EQ(detect({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_NUM_TASKS", "4"}})
                .worldSize,
            4);
  EXPECT_EQ(detect({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_ID", "2"}}).runKey,
            "slurm/?.2");
  // srun --preserve-env -n 2 in an allocation of 8 tasks, 4 a node: SLURM_NTASKS and
  // SLURM_NTASKS_PER_NODE stay the allocation's; the step is 2 ranks on one node.
  const DistEnv step = detect({{"SLURM_PROCID", "1"},
                               {"SLURM_NTASKS", "8"},
                               {"SLURM_NTASKS_PER_NODE", "4(x2)"},
                               {"SLURM_STEP_ID", "0"},
                               {"SLURM_STEP_NUM_TASKS", "2"},
                               {"SLURM_STEP_TASKS_PER_NODE", "2"},
                               {"SLURM_LOCALID", "1"}});
  EXPECT_EQ(step.worldSize, 2);
  EXPECT_EQ(step.localWorldSize, 2);
  EXPECT_EQ(step.rank, 1);
  // And what is wrong with the step's counts names the step's variable.
  EXPECT_NE(errorOf({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "8"}, {"SLURM_STEP_NUM_TASKS", "2"}})
                .find("SLURM_PROCID=2 is not below SLURM_STEP_NUM_TASKS=2"),
            std::string::npos);
  EXPECT_NE(errorOf({{"SLURM_PROCID", "0"},
                     {"SLURM_NTASKS", "8"},
                     {"SLURM_STEP_NUM_TASKS", "2"},
                     {"SLURM_STEP_TASKS_PER_NODE", "4"}})
                .find("SLURM_STEP_TASKS_PER_NODE='4': expected a count of ranks from 1 to "
                      "SLURM_STEP_NUM_TASKS=2"),
            std::string::npos);
}

TEST(DistEnv, OpenMpiAndHydra) {
  DistEnv e = detect({{"OMPI_COMM_WORLD_RANK", "3"},
                      {"OMPI_COMM_WORLD_SIZE", "4"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  EXPECT_EQ(e.launcher, "mpirun");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.worldSize, 4);
  EXPECT_EQ(e.masterAddr, "127.0.0.1");  // one host: no MASTER_ADDR needed
  e = detect({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "1"}});
  EXPECT_EQ(e.launcher, "mpirun");
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.localRank, 1);
  // Across hosts, the master must be named.
  EXPECT_NE(errorOf({{"OMPI_COMM_WORLD_RANK", "0"},
                     {"OMPI_COMM_WORLD_SIZE", "8"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}})
                .find("MASTER_ADDR is not set"),
            std::string::npos);
}

TEST(DistEnv, ExplicitRankWinsOverSchedulers) {
  const DistEnv e = detect({{"RANK", "1"},
                            {"WORLD_SIZE", "2"},
                            {"MASTER_ADDR", "h"},
                            {"SLURM_PROCID", "7"},
                            {"SLURM_NTASKS", "8"}});
  EXPECT_EQ(e.launcher, "env");
  EXPECT_EQ(e.rank, 1);
}

TEST(DistEnv, MalformedVariablesAreNamed) {
  EXPECT_NE(
      errorOf({{"RANK", "two"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}}).find("RANK='two'"),
      std::string::npos);
  // Digits only: stoll read " 1" and "+1" as 1 where "two" is refused.
  for (const char* odd : {" 1", "+1", "1 ", "0x1"}) {
    EXPECT_NE(errorOf({{"RANK", odd}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}})
                  .find(std::string("RANK='") + odd + "': expected an integer >= 0 (digits only)"),
              std::string::npos)
        << odd;
  }
  EXPECT_NE(errorOf({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}})
                .find("RANK=4 is not below WORLD_SIZE=4"),
            std::string::npos);
  EXPECT_NE(errorOf({{"RANK", "0"}, {"WORLD_SIZE", "2"}}).find("MASTER_ADDR is not"),
            std::string::npos);
  EXPECT_NE(errorOf({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}})
                .find("MASTER_PORT=70000"),
            std::string::npos);
  EXPECT_NE(errorOf({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "-1"}, {"SLURM_STEP_ID", "0"}})
                .find("SLURM_NTASKS='-1'"),
            std::string::npos);
}

TEST(DistEnv, FirstSlurmHost) {
  EXPECT_EQ(firstSlurmHost("node01"), "node01");
  EXPECT_EQ(firstSlurmHost("node[03-05,9],gpu1"), "node03");
  EXPECT_EQ(firstSlurmHost("a,b"), "a");
  EXPECT_EQ(firstSlurmHost("rack1-n[10,12]"), "rack1-n10");
  EXPECT_THROW(firstSlurmHost("node[]"), DistEnvError);
  // Ranges compare as numbers, zero padding kept in the name.
  EXPECT_EQ(firstSlurmHost("n[9-10]"), "n9");
  EXPECT_EQ(firstSlurmHost("n[007-7]"), "n007");
  // Text after the brackets, and several bracket groups, as Slurm writes them.
  EXPECT_EQ(firstSlurmHost("node[1-2]-ib"), "node1-ib");
  EXPECT_EQ(firstSlurmHost("rack[1-2]-n[01-04],x"), "rack1-n01");
  // Lists Slurm never writes: refused, not read as their first number.
  for (const char* bad : {"node[5-1]", "node[10-9]", "node[a]", "node[5-]", "node[5x]", "node[5"}) {
    try {
      firstSlurmHost(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const DistEnvError& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
  EXPECT_NE(errorOf({{"SLURM_PROCID", "0"},
                     {"SLURM_NTASKS", "2"},
                     {"SLURM_STEP_ID", "0"},
                     {"SLURM_STEP_NODELIST", "node[5-1]"}})
                .find("runs backwards"),
            std::string::npos);
}

TEST(DistEnv, EmptyAndUnboundedVariablesAreRefused) {
  // `export MASTER_PORT=$PORT` with PORT unset: not the default port in silence.
  EXPECT_NE(errorOf({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", ""}})
                .find("MASTER_PORT is set but empty"),
            std::string::npos);
  EXPECT_NE(errorOf({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", ""}})
                .find("MASTER_ADDR is set but empty"),
            std::string::npos);
  EXPECT_NE(errorOf({{"SLURM_PROCID", "0"},
                     {"SLURM_NTASKS", "2"},
                     {"SLURM_STEP_ID", "0"},
                     {"SLURM_JOB_ID", "7"},
                     {"SLURM_JOB_NODELIST", "h"},
                     {"MASTER_PORT", ""}})
                .find("MASTER_PORT is set but empty"),
            std::string::npos);
  // A world no mesh can use would wait out the timeout for its ranks.
  EXPECT_NE(errorOf({{"RANK", "0"}, {"WORLD_SIZE", "1000000"}, {"MASTER_ADDR", "h"}})
                .find("WORLD_SIZE='1000000'"),
            std::string::npos);
  EXPECT_EQ(detect({{"RANK", "0"}, {"WORLD_SIZE", "65536"}, {"MASTER_ADDR", "h"}}).worldSize,
            65536);
  EXPECT_NE(errorOf({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"LOCAL_RANK", ""}})
                .find("LOCAL_RANK is set but empty"),
            std::string::npos);
  // srun's per-node count: a count of ranks this world holds, the local id below it.
  const std::map<std::string, std::string> srun = {{"SLURM_PROCID", "1"},
                                                   {"SLURM_NTASKS", "4"},
                                                   {"SLURM_STEP_ID", "0"},
                                                   {"SLURM_LOCALID", "1"},
                                                   {"SLURM_JOB_NODELIST", "h"}};
  for (const char* bad : {"abc", "0", "9", "2x", "99999999999"}) {
    auto env = srun;
    env["SLURM_NTASKS_PER_NODE"] = bad;
    EXPECT_NE(errorOf(env).find("SLURM_NTASKS_PER_NODE='" + std::string(bad) + "'"),
              std::string::npos)
        << bad << ": " << errorOf(env);
  }
  auto one = srun;
  one["SLURM_NTASKS_PER_NODE"] = "1(x4)";
  EXPECT_NE(errorOf(one).find("SLURM_LOCALID=1 is not below SLURM_NTASKS_PER_NODE=1(x4)"),
            std::string::npos);
  auto two = srun;
  two["SLURM_NTASKS_PER_NODE"] = "2(x2)";
  EXPECT_EQ(detect(two).localWorldSize, 2);
  // Nothing launched: an empty variable of a launcher's is not read.
  EXPECT_EQ(detect({{"MASTER_PORT", ""}}).worldSize, 1);
}

TEST(DistEnv, LaunchedWorld) {
  const auto world = [](const std::map<std::string, std::string>& env) {
    return launchedWorld([&](const char* name) -> const char* {
      auto it = env.find(name);
      return it == env.end() ? nullptr : it->second.c_str();
    });
  };
  EXPECT_EQ(world({}).first, 1);
  EXPECT_EQ(world({{"RANK", "1"}, {"WORLD_SIZE", "2"}}),
            std::make_pair(int64_t{2}, std::string("WORLD_SIZE")));
  // Read without judging the rest (no MASTER_ADDR, a malformed rank).
  EXPECT_EQ(world({{"RANK", "x"}, {"WORLD_SIZE", "4"}}).first, 4);
  EXPECT_EQ(
      world({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_STEP_NUM_TASKS", "8"}}).second,
      "SLURM_STEP_NUM_TASKS");
  // An sbatch script's own shell: SLURM_PROCID=0 and SLURM_NTASKS, no step of srun's.
  EXPECT_EQ(world({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}}).first, 1);
  EXPECT_EQ(world({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "3"}}).first, 3);
  EXPECT_EQ(world({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).first, 1);
}

TEST(DistEnv, ResolveProblem) {
  EXPECT_EQ(resolveProblem("127.0.0.1"), "");
  EXPECT_EQ(resolveProblem("localhost"), "");
  // RFC 6761: no name under .invalid resolves. A resolver that does not answer at all
  // (EAI_AGAIN) is not refused, so there is nothing to check on such a host.
  const std::string why = resolveProblem("nonexistent.invalid");
  if (why.empty()) GTEST_SKIP() << "this host's resolver gave no answer for nonexistent.invalid";
  EXPECT_NE(why.find("does not resolve"), std::string::npos) << why;
}

}  // namespace
TEST(DistEnv, InconsistentLauncherVariablesAreRefusedNamingThem) {
  try {
    detect({{"RANK", "1"},
            {"WORLD_SIZE", "4"},
            {"LOCAL_RANK", "2"},
            {"LOCAL_WORLD_SIZE", "2"},
            {"MASTER_ADDR", "h"}});
    ADD_FAILURE() << "LOCAL_RANK >= LOCAL_WORLD_SIZE accepted";
  } catch (const DistEnvError& e) {
    EXPECT_NE(std::string(e.what()).find("LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"),
              std::string::npos)
        << e.what();
  }
  try {
    detect({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}});
    ADD_FAILURE() << "LOCAL_WORLD_SIZE > WORLD_SIZE accepted";
  } catch (const DistEnvError& e) {
    EXPECT_NE(std::string(e.what()).find("LOCAL_WORLD_SIZE=4 is more than WORLD_SIZE=2"),
              std::string::npos)
        << e.what();
  }
  try {
    detect({{"SLURM_PROCID", "3"}});
    ADD_FAILURE() << "SLURM_PROCID without SLURM_NTASKS accepted";
  } catch (const DistEnvError& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_PROCID=3 is set but SLURM_NTASKS is not"),
              std::string::npos)
        << e.what();
  }
  // salloc's shell sets SLURM_NTASKS only: a plain run there is a world of one.
  EXPECT_EQ(detect({{"SLURM_NTASKS", "4"}}).worldSize, 1);
}

}  // namespace sb::harness
