#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "harness/run/predict.h"
#include "harness/run/records.h"
#include "harness/run/run_util.h"
#include "harness/test/temp_dir.h"

namespace sb::harness {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A small RFC 4180 reader, written here independently of the writer.
std::vector<std::string> parseCsvLine(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char ch = line[i];
    if (quoted) {
      if (ch == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cur += '"';
        ++i;
      } else if (ch == '"') {
        quoted = false;
      } else {
        cur += ch;
      }
    } else if (ch == '"') {
      quoted = true;
    } else if (ch == ',') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  out.push_back(cur);
  return out;
}

// A folder name under the system's temporary folder, removed when the test binary exits.
std::string tempDir(const std::string& name) {
  return sb::test::scratchDir("sb_records", name, /*create=*/false);
}

TEST(Records, TheCsvHeaderHasEveryColumnTheIssueNamesInItsSpelling) {
  // Copied from the walking-skeleton issue's list, not from the writer.
  const std::vector<std::string> required = {"schema_version",
                                             "run_id",
                                             "git_sha",
                                             "timestamp_utc",
                                             "host",
                                             "device",
                                             "torch_version",
                                             "backend",
                                             "world_size",
                                             "mesh",
                                             "suite",
                                             "case",
                                             "workload",
                                             "shape",
                                             "dtype",
                                             "family",
                                             "strategy_id",
                                             "strategy",
                                             "status",
                                             "max_abs_err",
                                             "max_rel_err",
                                             "mismatches",
                                             "atol",
                                             "rtol",
                                             "time_us_median",
                                             "time_us_mean",
                                             "time_us_stddev",
                                             "time_us_min",
                                             "repetitions",
                                             "peak_mem_bytes",
                                             "predicted_mem_bytes",
                                             "comm_bytes",
                                             "predicted_comm_bytes",
                                             "message"};
  const auto& cols = csvColumns();
  for (const auto& r : required) {
    EXPECT_NE(std::find(cols.begin(), cols.end(), r), cols.end()) << "missing column " << r;
  }
}

TEST(Records, FieldsWithCommasQuotesAndNewlinesSurviveARoundTrip) {
  Record r;
  r.caseName = "a,b";
  r.strategyId = "sharding/linear/sharded_tensor/colwise/placements=2,0,3,1";
  r.message = "he said \"no\",\nthen left";
  r.status = Status::kFail;
  r.maxAbsErr = 0.5;
  const auto fields = parseCsvLine(csvRow(r));
  const auto& cols = csvColumns();
  ASSERT_EQ(fields.size(), cols.size());
  auto col = [&](const std::string& name) {
    return fields[std::find(cols.begin(), cols.end(), name) - cols.begin()];
  };
  EXPECT_EQ(col("case"), "a,b");
  EXPECT_EQ(col("strategy_id"), r.strategyId);
  EXPECT_EQ(col("message"), "he said \"no\", then left");
  EXPECT_EQ(col("status"), "fail");
  EXPECT_EQ(col("max_abs_err"), "0.5");
  EXPECT_EQ(col("time_us_median"), "");  // not timed: empty, not zero
}

TEST(Records, TheWriterKeepsBothPartialFilesCompleteAndInStepUntilItCommits) {
  const std::string dir = tempDir("writer");
  ResultWriter w(dir, {{"suite", "t"}});
  const std::string partialCsv = dir + "/results.partial.csv";
  const std::string partialJson = dir + "/results.partial.json";
  EXPECT_EQ(slurp(partialCsv).find('\n'), slurp(partialCsv).size() - 1);  // header only
  const auto countBoth = [&](const std::string& csvPath, const std::string& jsonPath) {
    std::istringstream csv(slurp(csvPath));
    std::string line;
    int lines = 0;
    while (std::getline(csv, line)) ++lines;
    const auto j = nlohmann::json::parse(slurp(jsonPath));
    // Whenever the files are read, they describe the same records.
    EXPECT_EQ(static_cast<size_t>(lines - 1), j["records"].size());
    return j;
  };
  for (int i = 0; i < 3; ++i) {
    Record r;
    r.caseName = "case" + std::to_string(i);
    r.status = Status::kPass;
    w.add(r);
    const auto j = countBoth(partialCsv, partialJson);
    // The first record is written at once; later ones at least once a second or at flush().
    EXPECT_GE(j["records"].size(), 1u);
    EXPECT_LE(j["records"].size(), static_cast<size_t>(i + 1));
  }
  w.flush();
  EXPECT_EQ(countBoth(partialCsv, partialJson)["records"].size(), 3u);
  EXPECT_FALSE(std::filesystem::exists(w.csvPath())) << "replaced before the run was complete";
  w.commit();
  const auto j = countBoth(w.csvPath(), w.jsonPath());
  ASSERT_EQ(j["records"].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(j["records"][i]["case"], "case" + std::to_string(i));
  EXPECT_EQ(j["run"]["suite"], "t");
  EXPECT_FALSE(std::filesystem::exists(partialCsv));
  EXPECT_FALSE(std::filesystem::exists(partialJson));
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos)
        << "left a temporary behind: " << entry.path();
    EXPECT_EQ(entry.path().string().find(".new"), std::string::npos)
        << "left a temporary behind: " << entry.path();
  }
  std::filesystem::remove_all(dir);
}

TEST(Records, AnInterruptedRunKeepsThePreviousSetWholeAndItsOwnRowsInThePartialFiles) {
  const std::string dir = tempDir("writer-dtor");
  {
    ResultWriter first(dir, {{"suite", "old"}});
    Record r;
    r.caseName = "old";
    first.add(r);
    first.commit();
  }
  const std::string oldCsv = slurp(dir + "/results.csv");
  const std::string oldJson = slurp(dir + "/results.json");
  {
    ResultWriter w(dir, {{"suite", "t"}});
    for (int i = 0; i < 5; ++i) {
      Record r;
      r.caseName = "case" + std::to_string(i);
      w.add(r);
    }
  }  // destroyed without commit(): the run did not end
  EXPECT_EQ(slurp(dir + "/results.csv"), oldCsv);
  EXPECT_EQ(slurp(dir + "/results.json"), oldJson);
  EXPECT_EQ(nlohmann::json::parse(slurp(dir + "/results.partial.json"))["records"].size(), 5u);
  std::filesystem::remove_all(dir);
}

TEST(Records, ASecondWriterIntoTheSameDirectoryIsRefusedNamingTheFirstsPid) {
  const std::string dir = tempDir("writer-lock");
  {
    ResultWriter first(dir, {{"suite", "a"}});
    try {
      ResultWriter second(dir, {{"suite", "b"}});
      FAIL() << "two writers held one directory";
    } catch (const OutputBusy& e) {
      EXPECT_NE(std::string(e.what()).find("is in use by another run (pid " +
                                           std::to_string(::getpid()) + ")"),
                std::string::npos)
          << e.what();
    }
  }
  // The lock goes with its holder.
  EXPECT_NO_THROW(ResultWriter(dir, {{"suite", "c"}}));
  std::filesystem::remove_all(dir);
}

TEST(Records, AnUnwritableDirectoryIsAClearError) {
  try {
    ResultWriter w("/proc/stratbench-cannot-write-here", {});
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/stratbench-cannot-write-here"), std::string::npos);
  }
}

TEST(Records, NonFiniteNumbersAreWrittenAsTextInJson) {
  Record r;
  r.maxAbsErr = std::numeric_limits<double>::infinity();
  const auto j = r.toJson();
  EXPECT_EQ(j["max_abs_err"], "inf");
  EXPECT_NO_THROW(nlohmann::json::parse(j.dump()));
}

TEST(TimingStats, SummaryOfKnownSamples) {
  const auto t = TimingStats::fromSamples({4, 1, 3, 2}, 7);
  EXPECT_DOUBLE_EQ(t.medianUs, 2.5);
  EXPECT_DOUBLE_EQ(t.meanUs, 2.5);
  EXPECT_DOUBLE_EQ(t.minUs, 1);
  EXPECT_DOUBLE_EQ(t.maxUs, 4);
  EXPECT_NEAR(t.stddevUs, 1.2909944487, 1e-9);                // sqrt(5/3)
  EXPECT_EQ(t.samplesUs, (std::vector<double>{4, 1, 3, 2}));  // kept in run order
}

}  // namespace
// SignalHold holds a signal sent to the whole process (whichever thread takes it) until the
// files are replaced, then delivers it to the handler that was there before.
volatile std::sig_atomic_t gHup = 0;
extern "C" void onHup(int) { gHup = 1; }

TEST(SignalHold, AProcessWideSignalWaitsForTheEndOfTheHoldAndThenArrives) {
  struct sigaction mine = {}, old = {};
  mine.sa_handler = onHup;
  sigemptyset(&mine.sa_mask);
  ASSERT_EQ(sigaction(SIGHUP, &mine, &old), 0);
  gHup = 0;
  // A thread that exists before the hold, as OpenMP's do during `run`: a mask set by the
  // holding thread would not cover it, and the signal could be taken there.
  std::atomic<bool> go{false};
  std::thread other([&] {
    while (!go) std::this_thread::yield();
    ::kill(::getpid(), SIGHUP);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  });
  {
    const harness::SignalHold hold;
    go = true;
    other.join();
    EXPECT_EQ(gHup, 0) << "delivered inside the hold";
  }
  EXPECT_EQ(gHup, 1) << "not delivered after the hold";
  sigaction(SIGHUP, &old, nullptr);
}

// An executor's own claims are judged under their names, which the mispredicted column carries;
// a name no reader takes back (a yes/no word, upper case, the runner's own memory, a claim
// twice) flags the row as the executor's mistake instead of writing an unreadable column.
TEST(Predictions, AnExecutorsClaimUnderANameTheResultsCannotCarryIsFlaggedNotWritten) {
  const auto judged = [](std::vector<std::string> names) {
    Record rec;
    nlohmann::json claims = nlohmann::json::array();
    for (const auto& n : names) {
      claims.push_back({{"what", n},
                        {"unit", "bytes"},
                        {"measured", 100.0},
                        {"predicted", 100.0},
                        {"tolerance", 0.0}});
    }
    rec.details["executor"]["predictions"] = claims;
    const std::string text = judgePredictions(rec, {std::nullopt, std::nullopt});
    return std::make_pair(rec.mispredicted, text);
  };
  EXPECT_EQ(judged({"bubble", "held_memory"}).first, "");
  for (const char* bad : {"false", "none", "Bubble", "peak-bytes", "memory", "", "9lives"}) {
    const auto [flags, text] = judged({bad});
    EXPECT_EQ(flags, "malformed_prediction") << "'" << bad << "'";
    EXPECT_NE(text.find(std::string("named '") + bad + "'"), std::string::npos) << text;
  }
  EXPECT_EQ(judged({"bubble", "bubble"}).first, "malformed_prediction");
  // The flag's own name is no claim's: flagged once, the column one report reads back.
  EXPECT_EQ(judged({"Bad", "malformed_prediction"}).first, "malformed_prediction");
  for (const char* good : {"bubble", "held_memory", "memory_rows", "objective2"}) {
    EXPECT_TRUE(validPredictionName(good)) << good;
  }
}

// A long message is cut between characters: one of broken UTF-8 is one no JSON writer takes,
// and the row's record would be lost.
TEST(ErrorText, ALongMessageIsCutBetweenCharactersAndStaysJson) {
  for (size_t shift = 0; shift < 3; ++shift) {
    std::string text(shift, 'x');
    for (int i = 0; i < 3000; ++i) text += "\xc3\xa9";  // é, two bytes
    const std::string cut = errorText(std::runtime_error(text));
    EXPECT_LT(cut.size(), 4200u);
    EXPECT_NE(cut.find("bytes left out"), std::string::npos);
    EXPECT_NO_THROW(nlohmann::json(cut).dump()) << "shift " << shift;
    EXPECT_NO_THROW(nlohmann::json(shownValue(text, 3 + shift)).dump()) << "shift " << shift;
  }
}

}  // namespace sb::harness
