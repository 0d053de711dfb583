#include "harness/run/records.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>

#include <c10/util/Exception.h>
#include <torch/version.h>

#include "harness/error.h"
#include "harness/hidden_text.h"
#include "harness/run/run_util.h"

namespace sb::harness {
namespace {

std::string runCommand(const std::string& cmd) {
  std::array<char, 256> buf{};
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  while (fgets(buf.data(), buf.size(), p)) out += buf.data();
  pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

std::string cpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      if (pos != std::string::npos) return line.substr(pos + 2);
    }
  }
  return "unknown";
}

std::string fmtDouble(double v) { return formatDouble(v); }

template <class T>
std::string opt(const std::optional<T>& v) {
  if (!v) return "";
  if constexpr (std::is_floating_point_v<T>) {
    return fmtDouble(*v);
  } else {
    return std::to_string(*v);
  }
}

std::string quote(const std::string& s) { return csvQuote(s); }

// JSON has no NaN or Inf: store them as strings, as Python's json module would read them back
// only with allow_nan; reports parse both.
nlohmann::json jnum(double v) {
  if (std::isfinite(v)) return v;
  return fmtDouble(v);
}

template <class T>
nlohmann::json jopt(const std::optional<T>& v) {
  if (!v) return nullptr;
  if constexpr (std::is_floating_point_v<T>) {
    return jnum(*v);
  } else {
    return *v;
  }
}

}  // namespace

std::string formatDouble(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// A value a spreadsheet would run as a formula gets a leading apostrophe; so does a value that
// starts with an apostrophe itself, so that reading strips exactly the one the writer added
// (a case named `'=1+1` reads back as itself, not as `=1+1`).
std::string csvTextField(const std::string& s) {
  if (!s.empty() && std::string("=+-@\t\r'").find(s[0]) != std::string::npos) return "'" + s;
  return s;
}

std::string csvTextValue(const std::string& field) {
  if (field.size() >= 2 && field[0] == '\'' &&
      std::string("=+-@\t\r'").find(field[1]) != std::string::npos) {
    return field.substr(1);
  }
  return field;
}

std::string csvQuote(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

const char* statusName(Status s) {
  switch (s) {
    case Status::kPass:
      return "pass";
    case Status::kFail:
      return "fail";
    case Status::kError:
      return "error";
    case Status::kUnsupported:
      return "unsupported";
    case Status::kSkipped:
      return "skipped";
  }
  TORCH_INTERNAL_ASSERT(false, "unknown status");
}

Provenance Provenance::collect() {
  Provenance p;
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
  p.timestampUtc = ts;
  char compact[32];
  std::strftime(compact, sizeof compact, "%Y%m%dT%H%M%SZ", &tm);
  std::random_device rd;
  char suffix[8];
  std::snprintf(suffix, sizeof suffix, "%04x", rd() & 0xffff);
  p.runId = std::string(compact) + "-" + suffix;

  if (const char* env = std::getenv("STRATBENCH_GIT_SHA"); env && *env) {
    p.gitSha = env;
    // Written into every row: held to what the results reader takes back (an ESC or a newline
    // in it made `report` refuse the run's own file, blaming the file).
    if (firstInvalidUtf8(p.gitSha) >= 0) {
      throw InputError(
          "STRATBENCH_GIT_SHA is not UTF-8 text: expected a commit name (a hash, a tag, a branch)");
    }
    if (const HiddenCharacter h = hiddenCharacter(p.gitSha, TextKind::kLine);
        h || p.gitSha.size() > 200) {
      throw InputError("STRATBENCH_GIT_SHA holds " +
                       (h ? h.text() : std::to_string(p.gitSha.size()) + " bytes") +
                       ": expected a commit name of at most 200 bytes, one line of text");
    }
    // A spreadsheet takes a cell starting with = + - @ as a formula (=HYPERLINK(...) ran from
    // results.csv); no commit name starts so.
    if (std::string("=+-@").find(p.gitSha.front()) != std::string::npos) {
      throw InputError("STRATBENCH_GIT_SHA '" + shownValue(p.gitSha) + "' starts with '" +
                       p.gitSha.front() +
                       "', which a spreadsheet reads as a formula: expected a commit name (a "
                       "hash, a tag, a branch)");
    }
    // A space or a tab at an end is trimmed by a CSV reader ("\t=1+1" read back as a formula).
    if (std::isspace(static_cast<unsigned char>(p.gitSha.front())) ||
        std::isspace(static_cast<unsigned char>(p.gitSha.back()))) {
      throw InputError("STRATBENCH_GIT_SHA '" + shownValue(p.gitSha) +
                       "' starts or ends with a space or a tab: expected a commit name (a hash, "
                       "a tag, a branch)");
    }
  } else {
    const std::string dir = SB_SOURCE_DIR;
    p.gitSha = runCommand("git -C '" + dir + "' rev-parse --short=12 HEAD 2>/dev/null");
    if (p.gitSha.empty()) {
      p.gitSha = "unknown";
    } else if (!runCommand("git -C '" + dir +
                           "' status --porcelain --untracked-files=no 2>/dev/null")
                    .empty()) {
      p.gitSha += "-dirty";
    }
  }
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  p.host = host;
  p.device = "cpu (" + cpuModel() + ")";
  p.torchVersion = TORCH_VERSION;
  return p;
}

nlohmann::json Record::toJson() const {
  nlohmann::json j;
  j["schema_version"] = kSchemaVersion;
  j["run_id"] = provenance.runId;
  j["git_sha"] = provenance.gitSha;
  j["timestamp_utc"] = provenance.timestampUtc;
  j["host"] = provenance.host;
  j["device"] = provenance.device;
  j["torch_version"] = provenance.torchVersion;
  j["backend"] = backend;
  j["world_size"] = worldSize;
  j["mesh"] = mesh;
  j["suite"] = suite;
  j["case"] = caseName;
  j["workload"] = workload;
  j["shape"] = shape;
  j["dtype"] = dtype;
  j["inputs"] = inputs;
  j["seed"] = seed;
  j["family"] = family;
  j["strategy_id"] = strategyId;
  j["strategy"] = strategy;
  j["status"] = statusName(status);
  j["max_abs_err"] = jopt(maxAbsErr);
  j["max_rel_err"] = jopt(maxRelErr);
  j["mismatches"] = jopt(mismatches);
  j["atol"] = jopt(atol);
  j["rtol"] = jopt(rtol);
  j["err_ratio"] = jopt(errRatio);
  j["worst_tensor"] = worstTensor;
  j["tensor_err_ratio"] = nlohmann::json::object();
  for (const auto& [t, v] : tensorErrRatio) j["tensor_err_ratio"][t] = jnum(v);
  j["tolerance"] = tolerance;
  if (timing) {
    j["time_us_median"] = jnum(timing->medianUs);
    j["time_us_mean"] = jnum(timing->meanUs);
    j["time_us_stddev"] = jnum(timing->stddevUs);
    j["time_us_min"] = jnum(timing->minUs);
    j["time_us_max"] = jnum(timing->maxUs);
    j["time_us_samples"] = timing->samplesUs;
    j["iterations_per_repetition"] = timing->iterations;
  } else {
    for (const char* k :
         {"time_us_median", "time_us_mean", "time_us_stddev", "time_us_min", "time_us_max"}) {
      j[k] = nullptr;
    }
    j["time_us_samples"] = nlohmann::json::array();
  }
  j["repetitions"] = repetitions;
  j["peak_mem_bytes"] = jopt(peakMemBytes);
  j["predicted_mem_bytes"] = jopt(predictedMemBytes);
  j["comm_bytes"] = jopt(commBytes);
  j["predicted_comm_bytes"] = jopt(predictedCommBytes);
  j["comm_calls"] = jopt(commCalls);
  j["predicted_time_us"] = jopt(predictedTimeUs);
  j["mispredicted"] = mispredicted;
  j["params"] = nlohmann::json::object();
  for (const auto& [k, v] : params) j["params"][k] = v;
  j["message"] = message;
  j["details"] = details;
  return j;
}

const std::vector<std::string>& csvColumns() {
  static const std::vector<std::string> cols(kCsvColumns.begin(), kCsvColumns.end());
  return cols;
}

std::string csvRow(const Record& r) {
  const auto t = [&](double TimingStats::*m) -> std::string {
    return r.timing ? fmtDouble((*r.timing).*m) : "";
  };
  std::string tensorRatios, samples;
  for (const auto& [t, v] : r.tensorErrRatio) {
    tensorRatios +=
        (tensorRatios.empty() ? "" : std::string(1, kListSeparator)) + t + "=" + fmtDouble(v);
  }
  if (r.timing) {
    for (double v : r.timing->samplesUs) {
      samples += (samples.empty() ? "" : std::string(1, kListSeparator)) + fmtDouble(v);
    }
  }
  std::string paramsText;
  for (const auto& [k, v] : r.params) {
    paramsText += (paramsText.empty() ? "" : std::string(1, kListSeparator)) + k + "=" + v;
  }
  std::string msg = r.message;
  for (char& c : msg) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  const std::vector<std::string> fields = {std::to_string(kSchemaVersion),
                                           r.provenance.runId,
                                           r.provenance.gitSha,
                                           r.provenance.timestampUtc,
                                           csvTextField(r.provenance.host),
                                           csvTextField(r.provenance.device),
                                           r.provenance.torchVersion,
                                           r.backend,
                                           std::to_string(r.worldSize),
                                           r.mesh,
                                           csvTextField(r.suite),
                                           csvTextField(r.caseName),
                                           csvTextField(r.workload),
                                           csvTextField(r.shape),
                                           r.dtype,
                                           r.inputs,
                                           std::to_string(r.seed),
                                           r.family,
                                           csvTextField(r.strategyId),
                                           csvTextField(r.strategy),
                                           statusName(r.status),
                                           opt(r.maxAbsErr),
                                           opt(r.maxRelErr),
                                           opt(r.mismatches),
                                           opt(r.atol),
                                           opt(r.rtol),
                                           opt(r.errRatio),
                                           csvTextField(r.worstTensor),
                                           csvTextField(tensorRatios),
                                           t(&TimingStats::medianUs),
                                           t(&TimingStats::meanUs),
                                           t(&TimingStats::stddevUs),
                                           t(&TimingStats::minUs),
                                           t(&TimingStats::maxUs),
                                           samples,
                                           std::to_string(r.repetitions),
                                           opt(r.peakMemBytes),
                                           opt(r.predictedMemBytes),
                                           opt(r.commBytes),
                                           opt(r.predictedCommBytes),
                                           opt(r.commCalls),
                                           opt(r.predictedTimeUs),
                                           r.mispredicted,
                                           csvTextField(paramsText),
                                           csvTextField(msg)};
  TORCH_INTERNAL_ASSERT(fields.size() == csvColumns().size());
  std::string line;
  for (size_t i = 0; i < fields.size(); ++i) line += (i ? "," : "") + quote(fields[i]);
  return line;
}

void writeFileAtomic(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  // A new file of ours: whatever an earlier run of this pid left is removed, and a link planted
  // at the name is not followed (O_EXCL: the name must be free when it is created).
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  TORCH_CHECK(fd >= 0, "cannot write ", tmp, ": ", std::strerror(errno));
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      TORCH_CHECK(false, "cannot write ", tmp, ": ", std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced) {
    const int err = errno;
    ::unlink(tmp.c_str());
    TORCH_CHECK(false, "cannot flush ", tmp, " to disk: ", std::strerror(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    TORCH_CHECK(false, "cannot replace ", path, ": ", std::strerror(err));
  }
}

ResultWriter::ResultWriter(std::string dir, nlohmann::json runInfo)
    : dir_(std::move(dir)), runInfo_(std::move(runInfo)) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  TORCH_CHECK(!ec && std::filesystem::is_directory(dir_), "cannot create output directory '", dir_,
              "': ", ec.message());
  TORCH_CHECK(::access(dir_.c_str(), W_OK) == 0, "output directory '", dir_, "' is not writable");
  // The names the results are renamed onto: one that is a folder is refused now, not after the
  // whole suite has run (then only the partial files would hold its rows).
  for (const char* name :
       {"results.csv", "results.json", "results.partial.csv", "results.partial.json"}) {
    struct stat st = {};
    const std::string path = dir_ + "/" + name;
    if (::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      throw OutputBusy(path +
                       " is a folder; the results cannot be written there: remove it or "
                       "give this run another --out");
    }
  }
  const std::string lockPath = dir_ + "/.stratbench.lock";
  // The lock file goes when its holder is done (the destructor unlinks it while still holding
  // it), so a lock taken on a file that was unlinked meanwhile is no lock: taken again on the
  // file the path now names.
  for (int attempt = 0;; ++attempt) {
    // The lock is a file of ours: a symbolic link at its name is not followed (ELOOP), and a
    // file that is not a plain file of one link is not taken, since taking it empties it.
    lockFd_ = ::open(lockPath.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (lockFd_ < 0 && errno == ELOOP) {
      throw OutputBusy(lockPath +
                       " is a symbolic link, not stratbench's lock file: remove it (a "
                       "run empties its lock file, and would empty what the link names)");
    }
    TORCH_CHECK(lockFd_ >= 0, "cannot open ", lockPath, ": ", std::strerror(errno));
    struct stat own = {};
    if (::fstat(lockFd_, &own) != 0 || !S_ISREG(own.st_mode) || own.st_nlink != 1) {
      ::close(lockFd_);
      lockFd_ = -1;
      throw OutputBusy(lockPath + " is not a plain file of stratbench's (" +
                       (S_ISREG(own.st_mode)
                            ? "a file with " + std::to_string(own.st_nlink) + " hard links"
                            : std::string("not a regular file")) +
                       "): remove it");
    }
    if (::flock(lockFd_, LOCK_EX | LOCK_NB) != 0) break;  // held: refused below
    struct stat held = {}, named = {};
    if (::fstat(lockFd_, &held) == 0 && ::stat(lockPath.c_str(), &named) == 0 &&
        held.st_ino == named.st_ino && held.st_dev == named.st_dev) {
      const std::string pid = std::to_string(::getpid()) + "\n";
      (void)!::ftruncate(lockFd_, 0);
      (void)!::pwrite(lockFd_, pid.data(), pid.size(), 0);
      write();
      return;
    }
    ::close(lockFd_);
    lockFd_ = -1;
    TORCH_CHECK(attempt < 100, "cannot lock ", lockPath, ": it is replaced as fast as it is taken");
  }
  {
    char buf[32] = {};
    const ssize_t n = ::pread(lockFd_, buf, sizeof buf - 1, 0);
    ::close(lockFd_);
    lockFd_ = -1;
    std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "unknown";
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    throw OutputBusy("output directory '" + dir_ + "' is in use by another run (pid " + pid +
                     "): wait for it, or give this run another --out");
  }
}

ResultWriter::~ResultWriter() {
  try {
    if (!committed_) flush();
  } catch (const std::exception& e) {
    std::cerr << "stratbench: could not write the last results to " << dir_ << ": " << e.what()
              << "\n";
  }
  if (lockFd_ >= 0) {
    // The folder keeps no lock file: unlinked while held (a run waiting on this file sees it
    // gone and takes the new one), then released.
    (void)!::ftruncate(lockFd_, 0);
    ::unlink((dir_ + "/.stratbench.lock").c_str());
    ::close(lockFd_);
  }
}

void ResultWriter::add(const Record& r) {
  csvLines_.push_back(csvRow(r));
  jsonRecords_.push_back(r.toJson().dump());
  if (written_ == 0 || std::chrono::steady_clock::now() - lastWrite_ >= kFlushInterval) write();
}

void ResultWriter::flush() {
  if (written_ != jsonRecords_.size()) write();
}

std::pair<std::string, std::string> ResultWriter::contents() const {
  std::string csv;
  for (size_t i = 0; i < csvColumns().size(); ++i) csv += (i ? "," : "") + csvColumns()[i];
  csv += "\n";
  for (const auto& l : csvLines_) csv += l + "\n";
  // One record per line; the document's keys in the order nlohmann::json sorts them.
  std::string json = "{\n \"records\": [";
  for (size_t i = 0; i < jsonRecords_.size(); ++i) {
    json += (i ? ",\n  " : "\n  ") + jsonRecords_[i];
  }
  json += jsonRecords_.empty() ? "],\n" : "\n ],\n";
  json += " \"run\": " + runInfo_.dump() + ",\n";
  json += " \"schema_version\": " + std::to_string(kSchemaVersion) + "\n}\n";
  return {csv, json};
}

void ResultWriter::write() {
  const auto [csv, json] = contents();
  writeFileAtomic(dir_ + "/results.partial.csv", csv);
  writeFileAtomic(dir_ + "/results.partial.json", json);
  written_ = jsonRecords_.size();
  lastWrite_ = std::chrono::steady_clock::now();
}

namespace {
constexpr int kHeldSignals[3] = {SIGINT, SIGTERM, SIGHUP};
volatile std::sig_atomic_t gHeldSignal = 0;
extern "C" void noteHeldSignal(int sig) { gHeldSignal = sig; }
}  // namespace

SignalHold::SignalHold() {
  gHeldSignal = 0;
  struct sigaction note = {};
  note.sa_handler = noteHeldSignal;
  sigemptyset(&note.sa_mask);
  for (int i = 0; i < 3; ++i) sigaction(kHeldSignals[i], &note, &previous_[i]);
}

SignalHold::~SignalHold() {
  for (int i = 0; i < 3; ++i) sigaction(kHeldSignals[i], &previous_[i], nullptr);
  if (const int sig = gHeldSignal; sig != 0) {
    gHeldSignal = 0;
    std::raise(sig);  // now, with the previous disposition: the replacement is complete
  }
}

void ResultWriter::commit() {
  const auto [csv, json] = contents();
  // Both complete on disk before either replaces its file.
  const std::string csvTmp = csvPath() + ".new." + std::to_string(::getpid());
  const std::string jsonTmp = jsonPath() + ".new." + std::to_string(::getpid());
  try {
    writeFileAtomic(csvTmp, csv);
    writeFileAtomic(jsonTmp, json);
  } catch (...) {
    ::unlink(csvTmp.c_str());
    ::unlink(jsonTmp.c_str());
    throw;
  }
  bool jsonOk = false, csvOk = false;
  int jsonErr = 0, csvErr = 0;
  {
    const SignalHold hold;
    jsonOk = std::rename(jsonTmp.c_str(), jsonPath().c_str()) == 0;
    jsonErr = errno;
    csvOk = jsonOk && std::rename(csvTmp.c_str(), csvPath().c_str()) == 0;
    csvErr = errno;
  }
  ::unlink(csvTmp.c_str());
  ::unlink(jsonTmp.c_str());
  TORCH_CHECK(jsonOk, "cannot replace ", jsonPath(), ": ", std::strerror(jsonErr));
  TORCH_CHECK(csvOk, "cannot replace ", csvPath(), " (", jsonPath(),
              " already holds the new results): ", std::strerror(csvErr));
  committed_ = true;
  written_ = jsonRecords_.size();
  ::unlink((dir_ + "/results.partial.csv").c_str());
  ::unlink((dir_ + "/results.partial.json").c_str());
}

}  // namespace sb::harness
