#include "reports/report.h"

#include <ftw.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "harness/records.h"
#include "reports/stats.h"

extern char** environ;

namespace sb::reports {
namespace fs = std::filesystem;
namespace {

// ---- formatting ----------------------------------------------------------------------------

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string optInt(const std::optional<int64_t>& v) { return v ? std::to_string(*v) : ""; }

std::string bytes(const std::optional<int64_t>& v) {
  if (!v) return "-";
  const double b = static_cast<double>(*v);
  if (b < 1024) return std::to_string(*v) + " B";
  if (b < 1024.0 * 1024) return fmt("%.1f KiB", b / 1024);
  if (b < 1024.0 * 1024 * 1024) return fmt("%.1f MiB", b / 1024 / 1024);
  return fmt("%.2f GiB", b / 1024 / 1024 / 1024);
}

std::string timeText(const ResultRow& r) {
  if (!r.timeMedianUs) return "-";
  std::string s = fmt("%.4g", *r.timeMedianUs);
  if (r.timeStddevUs) s += " ± " + fmt("%.2g", *r.timeStddevUs);
  return s;
}

std::string pctText(const std::optional<double>& v) { return v ? fmt("%+.1f%%", *v) : ""; }

std::string predictedVsMeasured(const std::optional<int64_t>& pred,
                                const std::optional<int64_t>& meas) {
  if (!pred && !meas) return "-";
  return bytes(pred) + " / " + bytes(meas);
}

std::string errText(const ResultRow& r) {
  if (!r.errRatio) return r.maxAbsErr ? "abs " + fmt("%.2g", *r.maxAbsErr) : "-";
  return fmt("%.3g", *r.errRatio) + (r.worstTensor.empty() ? "" : " (" + r.worstTensor + ")");
}

std::string htmlEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

std::string mdEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '|')
      o += "\\|";
    else if (c == '\n')
      o += ' ';
    else
      o += c;
  }
  return o;
}

std::string base64(const std::string& in) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const unsigned v = (static_cast<unsigned char>(in[i]) << 16) |
                       (static_cast<unsigned char>(in[i + 1]) << 8) |
                       static_cast<unsigned char>(in[i + 2]);
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += k[(v >> 6) & 63];
    out += k[v & 63];
  }
  if (i < in.size()) {
    unsigned v = static_cast<unsigned char>(in[i]) << 16;
    if (i + 1 < in.size()) v |= static_cast<unsigned char>(in[i + 1]) << 8;
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += i + 1 < in.size() ? k[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---- a small document model, rendered both as Markdown and as HTML --------------------------

struct Cell {
  std::string text;
  std::string cls;  // a status or verdict: colours the HTML cell
};

struct Table {
  std::vector<std::string> head;
  std::vector<std::vector<Cell>> rows;
  std::string id;  // HTML id, for the browser test and for links
};

struct Block {
  enum class Kind { kHeading, kParagraph, kTable, kList, kImage };
  explicit Block(Kind k) : kind(k) {}
  Kind kind;
  int level = 2;
  std::string text;  // heading / paragraph text, image alt
  std::string path;  // image path relative to the report
  std::string cls;   // paragraph class (e.g. "gate-fail")
  Table table;
  std::vector<std::string> items;
};

class Document {
 public:
  void heading(int level, std::string text) {
    Block b(Block::Kind::kHeading);
    b.level = level;
    b.text = std::move(text);
    blocks_.push_back(std::move(b));
  }
  void paragraph(std::string text, std::string cls = "") {
    Block b(Block::Kind::kParagraph);
    b.text = std::move(text);
    b.cls = std::move(cls);
    blocks_.push_back(std::move(b));
  }
  void table(Table t) {
    Block b(Block::Kind::kTable);
    b.table = std::move(t);
    blocks_.push_back(std::move(b));
  }
  void list(std::vector<std::string> items) {
    if (items.empty()) return;
    Block b(Block::Kind::kList);
    b.items = std::move(items);
    blocks_.push_back(std::move(b));
  }
  void image(std::string path, std::string alt) {
    Block b(Block::Kind::kImage);
    b.path = std::move(path);
    b.text = std::move(alt);
    blocks_.push_back(std::move(b));
  }

  std::string markdown() const {
    std::ostringstream o;
    for (const auto& b : blocks_) {
      switch (b.kind) {
        case Block::Kind::kHeading:
          o << std::string(b.level, '#') << " " << b.text << "\n\n";
          break;
        case Block::Kind::kParagraph:
          o << b.text << "\n\n";
          break;
        case Block::Kind::kList:
          for (const auto& i : b.items) o << "- " << mdEscape(i) << "\n";
          o << "\n";
          break;
        case Block::Kind::kImage:
          o << "![" << b.text << "](" << b.path << ")\n\n";
          break;
        case Block::Kind::kTable: {
          const Table& t = b.table;
          o << "|";
          for (const auto& h : t.head) o << " " << mdEscape(h) << " |";
          o << "\n|";
          for (size_t i = 0; i < t.head.size(); ++i) o << "---|";
          o << "\n";
          for (const auto& r : t.rows) {
            o << "|";
            for (const auto& c : r) o << " " << mdEscape(c.text) << " |";
            o << "\n";
          }
          o << "\n";
          break;
        }
      }
    }
    return o.str();
  }

  // Self-contained: styles inline, every image a data: URI. A script counts the images that
  // decoded, so a headless browser can check that every plot loads.
  std::string html(const std::string& title, const std::string& baseDir) const {
    std::ostringstream o;
    o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>"
      << htmlEscape(title) << "</title>\n<style>\n"
      << "body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1400px;"
         "padding:0 1em;color:#222}\n"
         "table{border-collapse:collapse;margin:.5em 0 1em;font-size:13px}\n"
         "th,td{border:1px solid #ccc;padding:3px 7px;text-align:left;vertical-align:top}\n"
         "th{background:#f3f3f3}\n"
         "td.pass,td.ok,td.unchanged{background:#e9f7ec}\n"
         "td.fail,td.error,td.regressed{background:#fde2e1;font-weight:bold}\n"
         "td.unsupported,td.skipped,td.gone,td.new,td.warn{background:#fff5d6}\n"
         "td.improved,td.fixed{background:#dff0ff}\n"
         "p.gate-fail{color:#a40000;font-weight:bold;font-size:1.2em}\n"
         "p.gate-pass{color:#176b2c;font-weight:bold;font-size:1.2em}\n"
         "img.plot{max-width:100%;border:1px solid #ddd;margin:.3em 0}\n"
         "h2{border-bottom:1px solid #ccc;margin-top:1.6em}\n"
      << "</style></head>\n<body>\n";
    for (const auto& b : blocks_) {
      switch (b.kind) {
        case Block::Kind::kHeading:
          o << "<h" << b.level << ">" << htmlEscape(b.text) << "</h" << b.level << ">\n";
          break;
        case Block::Kind::kParagraph:
          o << "<p" << (b.cls.empty() ? "" : " class=\"" + b.cls + "\"") << ">"
            << htmlEscape(b.text) << "</p>\n";
          break;
        case Block::Kind::kList:
          o << "<ul>\n";
          for (const auto& i : b.items) o << "<li>" << htmlEscape(i) << "</li>\n";
          o << "</ul>\n";
          break;
        case Block::Kind::kImage:
          o << "<div><img class=\"plot\" alt=\"" << htmlEscape(b.text)
            << "\" src=\"data:image/png;base64," << base64(slurp(baseDir + "/" + b.path))
            << "\"></div>\n";
          break;
        case Block::Kind::kTable: {
          const Table& t = b.table;
          o << "<table" << (t.id.empty() ? "" : " id=\"" + htmlEscape(t.id) + "\"")
            << "><thead><tr>";
          for (const auto& h : t.head) o << "<th>" << htmlEscape(h) << "</th>";
          o << "</tr></thead><tbody>\n";
          for (const auto& r : t.rows) {
            o << "<tr>";
            for (const auto& c : r) {
              o << "<td" << (c.cls.empty() ? "" : " class=\"" + htmlEscape(c.cls) + "\"") << ">"
                << htmlEscape(c.text) << "</td>";
            }
            o << "</tr>\n";
          }
          o << "</tbody></table>\n";
          break;
        }
      }
    }
    o << "<script>\nwindow.addEventListener('load', function () {\n"
         "  var imgs = document.images, ok = 0, broken = [];\n"
         "  for (var i = 0; i < imgs.length; i++) {\n"
         "    if (imgs[i].complete && imgs[i].naturalWidth > 0) ok++; else "
         "broken.push(imgs[i].alt);\n"
         "  }\n"
         "  document.body.setAttribute('data-images-total', imgs.length);\n"
         "  document.body.setAttribute('data-images-loaded', ok);\n"
         "  document.body.setAttribute('data-images-broken', broken.join('|'));\n"
         "});\n</script>\n</body></html>\n";
    return o.str();
  }

 private:
  std::vector<Block> blocks_;
};

// ---- inputs ---------------------------------------------------------------------------------

struct HistoryRun {
  std::string dir;
  std::string timestamp;  // earliest row's
  std::vector<ResultRow> rows;
};

std::vector<HistoryRun> readHistory(const std::string& dir) {
  if (!fs::is_directory(dir)) throw ReportInputError(dir + ": --history expects a directory");
  std::vector<HistoryRun> runs;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_directory() || !fs::is_regular_file(e.path() / "results.csv")) continue;
    HistoryRun run;
    run.dir = e.path().string();
    run.rows = readResults(run.dir);
    if (run.rows.empty()) continue;
    run.timestamp = run.rows.front().timestampUtc;
    for (const auto& r : run.rows) run.timestamp = std::min(run.timestamp, r.timestampUtc);
    runs.push_back(std::move(run));
  }
  if (runs.empty()) {
    throw ReportInputError(dir + ": no runs in it (expected folders each holding a results.csv)");
  }
  std::sort(runs.begin(), runs.end(), [](const HistoryRun& a, const HistoryRun& b) {
    return std::tie(a.timestamp, a.dir) < std::tie(b.timestamp, b.dir);
  });
  return runs;
}

std::string defaultOutDir(const std::string& results) {
  if (fs::is_directory(results)) return results;
  const fs::path p(results);
  return p.has_parent_path() ? p.parent_path().string() : ".";
}

// ---- outputs --------------------------------------------------------------------------------

std::string csvLine(const std::vector<std::string>& fields) {
  std::string s;
  for (size_t i = 0; i < fields.size(); ++i) s += (i ? "," : "") + harness::csvQuote(fields[i]);
  return s + "\n";
}

std::string gateCell(const RowComparison& rc) {
  if (!rc.gateFailures.empty()) return "fail";
  if (!rc.warnings.empty()) return "warn";
  return "ok";
}

std::string reasons(const RowComparison& rc) {
  std::string s;
  for (const auto& f : rc.gateFailures) s += (s.empty() ? "" : "; ") + f;
  for (const auto& w : rc.warnings) s += (s.empty() ? "" : "; ") + w;
  return s;
}

std::string paramsText(const std::vector<std::pair<std::string, std::string>>& params) {
  std::string s;
  for (const auto& [k, v] : params) s += (s.empty() ? "" : ";") + k + "=" + v;
  return s;
}

std::optional<std::string> paramOf(const ResultRow& r, const std::string& key) {
  for (const auto& [k, v] : r.params) {
    if (k == key) return v;
  }
  return std::nullopt;
}

// A swept case's family: "prefill-1024/chunk=64" -> "prefill-1024".
std::string sweepBase(const std::string& caseName) {
  const size_t slash = caseName.rfind('/');
  if (slash == std::string::npos || caseName.find('=', slash) == std::string::npos) return caseName;
  return caseName.substr(0, slash);
}

// Chunking rows against the unchunked run of the same strategy in the same swept case (the
// row whose params say chunks=1): activation memory saved and time lost, in %.
struct AgainstUnchunked {
  std::map<std::string, const ResultRow*> unchunked;
  explicit AgainstUnchunked(const Comparison& cmp) {
    for (const auto& rc : cmp.rows) {
      const ResultRow* c = rc.current;
      if (c && c->status == "pass" && paramOf(*c, "chunks") == std::optional<std::string>("1")) {
        unchunked[key(*c)] = c;
      }
    }
  }
  static std::string key(const ResultRow& r) {
    return r.suite + "|" + sweepBase(r.caseName) + "|" + r.strategyId;
  }
  std::pair<std::string, std::string> of(const ResultRow* c) const {
    if (!c || c->status != "pass") return {"", ""};
    const auto it = unchunked.find(key(*c));
    const auto act = paramOf(*c, "activation_peak_bytes");
    if (it == unchunked.end() || !act) return {"", ""};
    const auto base = paramOf(*it->second, "activation_peak_bytes");
    std::string reduction, slowdown;
    if (base && std::stod(*base) > 0) {
      reduction = harness::formatDouble((1 - std::stod(*act) / std::stod(*base)) * 100);
    }
    if (c->timeMedianUs && it->second->timeMedianUs && *it->second->timeMedianUs > 0) {
      slowdown = harness::formatDouble((*c->timeMedianUs / *it->second->timeMedianUs - 1) * 100);
    }
    return {reduction, slowdown};
  }
};

std::string summaryCsv(const Comparison& cmp) {
  const AgainstUnchunked against(cmp);
  std::string out = csvLine({"suite",
                             "case",
                             "case_slug",
                             "workload",
                             "shape",
                             "dtype",
                             "mesh",
                             "backend",
                             "family",
                             "strategy_id",
                             "strategy",
                             "status",
                             "baseline_status",
                             "err_ratio",
                             "baseline_err_ratio",
                             "worst_tensor",
                             "max_abs_err",
                             "atol",
                             "rtol",
                             "time_us_median",
                             "time_us_stddev",
                             "repetitions",
                             "baseline_time_us_median",
                             "baseline_time_us_stddev",
                             "time_change_pct",
                             "time_p_value",
                             "time_verdict",
                             "noisy",
                             "peak_mem_bytes",
                             "baseline_peak_mem_bytes",
                             "mem_change_pct",
                             "mem_verdict",
                             "predicted_mem_bytes",
                             "comm_bytes",
                             "predicted_comm_bytes",
                             "predicted_time_us",
                             "params",
                             "activation_reduction_pct",
                             "slowdown_pct",
                             "numerics_verdict",
                             "prediction_verdict",
                             "verdict",
                             "gate",
                             "reasons"});
  const auto f = [](const std::optional<double>& v) {
    return v ? harness::formatDouble(*v) : std::string();
  };
  for (const auto& rc : cmp.rows) {
    const ResultRow& a = rc.any();
    const ResultRow* c = rc.current;
    const ResultRow* b = rc.baseline;
    const auto vsUnchunked = against.of(c);
    out += csvLine({a.suite,
                    a.caseName,
                    caseSlug(a.suite, a.caseName),
                    a.workload,
                    a.shape,
                    a.dtype,
                    a.mesh,
                    a.backend,
                    a.family,
                    a.strategyId,
                    a.strategy,
                    c ? c->status : "",
                    b ? b->status : "",
                    c ? f(c->errRatio) : "",
                    b ? f(b->errRatio) : "",
                    c ? c->worstTensor : "",
                    c ? f(c->maxAbsErr) : "",
                    c ? f(c->atol) : "",
                    c ? f(c->rtol) : "",
                    c ? f(c->timeMedianUs) : "",
                    c ? f(c->timeStddevUs) : "",
                    c ? std::to_string(c->repetitions) : "",
                    b ? f(b->timeMedianUs) : "",
                    b ? f(b->timeStddevUs) : "",
                    f(rc.timeChangePct),
                    f(rc.timePValue),
                    rc.time,
                    rc.noisy ? "1" : "0",
                    c ? optInt(c->peakMemBytes) : "",
                    b ? optInt(b->peakMemBytes) : "",
                    f(rc.memChangePct),
                    rc.mem,
                    c ? optInt(c->predictedMemBytes) : "",
                    c ? optInt(c->commBytes) : "",
                    c ? optInt(c->predictedCommBytes) : "",
                    c ? f(c->predictedTimeUs) : "",
                    c ? paramsText(c->params) : "",
                    vsUnchunked.first,
                    vsUnchunked.second,
                    rc.numerics,
                    rc.prediction,
                    verdictName(rc.verdict),
                    gateCell(rc),
                    reasons(rc)});
  }
  return out;
}

std::string tensorsCsv(const std::vector<ResultRow>& rows) {
  std::string out = csvLine(
      {"suite", "case", "case_slug", "strategy_id", "strategy", "status", "tensor", "err_ratio"});
  for (const auto& r : rows) {
    for (const auto& [t, v] : r.tensorErrRatio) {
      out += csvLine({r.suite, r.caseName, caseSlug(r.suite, r.caseName), r.strategyId, r.strategy,
                      r.status, t, harness::formatDouble(v)});
    }
  }
  return out;
}

std::string historyCsv(const std::vector<HistoryRun>& runs) {
  std::string out =
      csvLine({"run_index", "run_dir", "run_id", "timestamp_utc", "git_sha", "suite", "case",
               "case_slug", "strategy_id", "strategy", "status", "time_us_median"});
  for (size_t i = 0; i < runs.size(); ++i) {
    for (const auto& r : runs[i].rows) {
      out += csvLine({std::to_string(i), fs::path(runs[i].dir).filename().string(), r.runId,
                      runs[i].timestamp, r.gitSha, r.suite, r.caseName,
                      caseSlug(r.suite, r.caseName), r.strategyId, r.strategy, r.status,
                      r.timeMedianUs ? harness::formatDouble(*r.timeMedianUs) : ""});
    }
  }
  return out;
}

std::string pythonInterpreter() {
  if (const char* p = std::getenv("STRATBENCH_PYTHON"); p && *p) return p;
  // Debian's interpreter, which has Debian's matplotlib, even where another python3 (pyenv,
  // a virtualenv) comes first on PATH.
  if (::access("/usr/bin/python3", X_OK) == 0) return "/usr/bin/python3";
  return "python3";
}

std::string plotsScript() {
  if (const char* d = std::getenv("STRATBENCH_PLOTS_DIR"); d && *d) {
    return std::string(d) + "/make_plots.py";
  }
  // The checkout this was built from, else an installation's share/stratbench/plots beside
  // bin/ (cmake --install).
  const std::string checkout = std::string(SB_SOURCE_DIR) + "/reports/plots/make_plots.py";
  if (fs::is_regular_file(checkout)) return checkout;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed =
        exe.parent_path().parent_path() / "share/stratbench/plots/make_plots.py";
    if (fs::is_regular_file(installed)) return installed.string();
  }
  return checkout;
}

// Runs the plot scripts on DIR; returns an empty string or what went wrong.
std::string runPlots(const std::string& dir) {
  const std::string py = pythonInterpreter();
  const std::string script = plotsScript();
  if (!fs::is_regular_file(script)) return "plot scripts not found at " + script;
  std::vector<std::string> args = {py, script, dir};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawnp(&pid, py.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
    return "cannot start " + py + " (install python3-matplotlib, or set STRATBENCH_PYTHON)";
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return py + " " + script + " failed (exit " +
           std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
           "); see its messages above";
  }
  return "";
}

std::set<std::string> distinct(const std::vector<ResultRow>& rows, std::string ResultRow::*field) {
  std::set<std::string> s;
  for (const auto& r : rows) s.insert(r.*field);
  return s;
}

std::string joined(const std::set<std::string>& s) {
  std::string o;
  for (const auto& x : s) o += (o.empty() ? "" : ", ") + x;
  return o.empty() ? "-" : o;
}

Cell statusCell(const std::string& s) { return {s.empty() ? "-" : s, s}; }

Table provenanceTable(const std::vector<ResultRow>& cur, const std::vector<ResultRow>& base) {
  Table t;
  t.id = "provenance";
  t.head = {"", "results"};
  if (!base.empty()) t.head.push_back("baseline");
  const std::vector<std::pair<std::string, std::string ResultRow::*>> fields = {
      {"git sha", &ResultRow::gitSha},  {"host", &ResultRow::host},
      {"device", &ResultRow::device},   {"LibTorch", &ResultRow::torchVersion},
      {"backend", &ResultRow::backend}, {"suite", &ResultRow::suite},
      {"run id", &ResultRow::runId},    {"started (UTC)", &ResultRow::timestampUtc}};
  for (const auto& [name, field] : fields) {
    std::vector<Cell> row = {{name, ""}, {joined(distinct(cur, field)), ""}};
    if (!base.empty()) row.push_back({joined(distinct(base, field)), ""});
    t.rows.push_back(std::move(row));
  }
  std::set<std::string> files;
  for (const auto& r : cur) files.insert(r.file);
  std::vector<Cell> row = {{"files", ""}, {joined(files), ""}};
  if (!base.empty()) {
    std::set<std::string> bf;
    for (const auto& r : base) bf.insert(r.file);
    row.push_back({joined(bf), ""});
  }
  t.rows.push_back(std::move(row));
  return t;
}

Table familyTable(const Comparison& cmp) {
  static const std::vector<std::string> kStatuses = {"pass", "fail", "error", "unsupported",
                                                     "skipped"};
  static const std::vector<Verdict> kVerdicts = {
      Verdict::kRegressed, Verdict::kImproved, Verdict::kUnchanged, Verdict::kNew, Verdict::kGone};
  std::map<std::string, std::map<std::string, int>> counts;
  std::vector<std::string> order;
  for (const auto& rc : cmp.rows) {
    const std::string fam = rc.any().family;
    if (!counts.count(fam)) order.push_back(fam);
    auto& c = counts[fam];
    if (rc.current) c[rc.current->status]++;
    c[verdictName(rc.verdict)]++;
  }
  Table t;
  t.id = "summary";
  t.head = {"family"};
  for (const auto& s : kStatuses) t.head.push_back(s);
  if (cmp.hasBaseline) {
    for (auto v : kVerdicts) t.head.push_back(verdictName(v));
  }
  for (const auto& fam : order) {
    std::vector<Cell> row = {{fam, ""}};
    for (const auto& s : kStatuses) {
      const int n = counts[fam][s];
      row.push_back({std::to_string(n), n ? s : ""});
    }
    if (cmp.hasBaseline) {
      for (auto v : kVerdicts) {
        const int n = counts[fam][verdictName(v)];
        row.push_back({std::to_string(n), n ? verdictName(v) : ""});
      }
    }
    t.rows.push_back(std::move(row));
  }
  return t;
}

Table caseTable(const std::vector<const RowComparison*>& rows, bool hasBaseline,
                const std::string& id) {
  Table t;
  t.id = id;
  t.head = {"strategy",
            "status",
            "err / tol (worst tensor)",
            "tolerance",
            "time us (median ± sd)",
            "peak mem",
            "mem predicted / measured",
            "comm predicted / measured"};
  if (hasBaseline) {
    for (const char* h : {"baseline status", "Δ time", "Δ mem", "verdict"}) t.head.push_back(h);
  }
  t.head.push_back("notes");
  for (const RowComparison* rc : rows) {
    const ResultRow& a = rc->any();
    const ResultRow* c = rc->current;
    std::vector<Cell> row;
    row.push_back(
        {a.strategy.empty() ? a.strategyId : a.strategy + "  [" + a.strategyId + "]", ""});
    row.push_back(statusCell(c ? c->status : "gone"));
    row.push_back({c ? errText(*c) : "-", ""});
    std::string tol = "-";
    if (c && c->atol && c->rtol) {
      tol = (*c->atol == 0 && *c->rtol == 0)
                ? "bitwise"
                : "rtol " + fmt("%.2g", *c->rtol) + " atol " + fmt("%.2g", *c->atol);
    }
    row.push_back({tol, ""});
    row.push_back({c ? timeText(*c) + (rc->noisy ? " (noisy)" : "") : "-", ""});
    row.push_back({c ? bytes(c->peakMemBytes) : "-", ""});
    const bool memOff = c && c->mispredicted.find("memory") != std::string::npos;
    row.push_back({c ? predictedVsMeasured(c->predictedMemBytes, c->peakMemBytes) +
                           (memOff ? " (mispredicted)" : "")
                     : "-",
                   memOff ? "fail" : ""});
    row.push_back({c ? predictedVsMeasured(c->predictedCommBytes, c->commBytes) : "-", ""});
    if (hasBaseline) {
      row.push_back(statusCell(rc->baseline ? rc->baseline->status : "new"));
      row.push_back({pctText(rc->timeChangePct) +
                         (rc->time == "n/a" || rc->time == "unchanged" ? "" : " " + rc->time),
                     rc->time == "regressed" || rc->time == "improved" ? rc->time : ""});
      row.push_back({pctText(rc->memChangePct),
                     rc->mem == "regressed" || rc->mem == "improved" ? rc->mem : ""});
      row.push_back({verdictName(rc->verdict), verdictName(rc->verdict)});
    }
    std::string notes = reasons(*rc);
    if (notes.empty() && c && c->status != "pass") notes = c->message;
    row.push_back({notes, rc->gateFailures.empty() ? "" : "fail"});
    t.rows.push_back(std::move(row));
  }
  return t;
}

void writeText(const std::string& path, const std::string& text) {
  harness::writeFileAtomic(path, text);
}

constexpr const char* kStagingPrefix = ".report.new.";

// Removes a folder and everything in it, without following links; best effort. POSIX's nftw,
// not std::filesystem::remove_all: on the GPU machine (LibTorch 2.11 from a pip wheel, GCC 13)
// report crashed right after its last line, with its staging folder left behind, the one
// remove_all left to do; std::filesystem's symbols may resolve to the copy a wheel's LibTorch
// carries from its own toolchain. Not confirmed there yet (README, GPU).
void removeTree(const std::string& path) {
  ::nftw(
      path.c_str(),
      [](const char* p, const struct stat*, int, struct FTW*) {
        std::remove(p);
        return 0;
      },
      16, FTW_DEPTH | FTW_PHYS);
}

// Removes the staging folder unless the set was committed (an exception on the way out).
struct StagingGuard {
  std::string path;
  ~StagingGuard() { removeTree(path); }
};

// This host's name, as staging folders carry it.
std::string hostName() {
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "host";
  return host;
}

// The staging folder of this process: .report.new.HOST.PID (the host, so that a report folder
// shared between machines never has one machine's live staging taken for a dead one).
std::string stagingName() {
  return std::string(kStagingPrefix) + hostName() + "." + std::to_string(::getpid());
}

// Staging folders of this host's reports that died before their commit (SIGKILL, a crash):
// their pid is gone. A live one, or another host's, is left alone.
void removeStaleStaging(const std::string& dir) {
  std::error_code ec;
  const std::string mine = std::string(kStagingPrefix) + hostName() + ".";
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(mine, 0) != 0) continue;
    const std::string pidText = name.substr(mine.size());
    char* end = nullptr;
    const long pid = std::strtol(pidText.c_str(), &end, 10);
    if (end == pidText.c_str() || *end != '\0' || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) removeTree(e.path().string());
  }
}

// Whether the staged set can be moved in: every destination folder a writable folder on the
// staging folder's file system (a rename cannot cross one), no destination a folder. Checked
// before anything is moved, so that a set is moved whole or not at all. Returns the problem.
std::string checkDestinations(const std::string& stage, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir + "/plots", ec);
  struct stat st = {}, staged = {};
  for (const std::string& d : {dir, dir + "/plots"}) {
    if (::stat(d.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return d + " is not a folder the report can be written to";
    }
    if (::access(d.c_str(), W_OK) != 0) return d + ": " + std::strerror(errno);
    if (::stat(stage.c_str(), &staged) == 0 && staged.st_dev != st.st_dev) {
      return d + " is on another file system than " + stage +
             " (a symbolic link?): the report's files cannot be moved into it whole";
    }
  }
  return "";
}

// The moves of commitSet, in order, stopping at the first that fails; the previous set's
// files that the new one does not have go only once every move succeeded. Returns the problem.
std::string moveSet(const std::string& stage, const std::string& dir,
                    const std::vector<std::string>& files) {
  for (const auto& f : files) {
    const std::string to = dir + "/" + f;
    if (fs::is_directory(to)) return to + " is a folder; the report's file cannot replace it";
    if (std::rename((stage + "/" + f).c_str(), to.c_str()) != 0) {
      return "cannot move " + stage + "/" + f + " to " + to + ": " + std::strerror(errno);
    }
  }
  std::error_code ec;
  const std::set<std::string> keep(files.begin(), files.end());
  for (const auto& e : fs::directory_iterator(dir + "/plots", ec)) {
    if (e.path().extension() == ".png" && !keep.count("plots/" + e.path().filename().string())) {
      fs::remove(e.path(), ec);
    }
  }
  if (!keep.count("history.csv")) fs::remove(dir + "/history.csv", ec);
  return "";
}

// Moves a complete staged set into the report folder, with SIGINT, SIGTERM and SIGHUP held so
// that an interrupt lands before or after the whole move. Files of the previous set that the
// new one does not have (a plot no longer drawn, history.csv) go, so that the folder is
// exactly the new set. report.html is moved last.
void commitSet(const std::string& stage, const std::string& dir,
               const std::vector<std::string>& files) {
  if (const std::string problem = checkDestinations(stage, dir); !problem.empty()) {
    throw ReportInputError(problem);
  }
  std::string problem;
  {
    const harness::SignalHold hold;
    problem = moveSet(stage, dir, files);
  }
  if (!problem.empty()) throw std::runtime_error(problem);
}

}  // namespace

std::string caseSlug(const std::string& suite, const std::string& caseName) {
  std::string s = suite + "__" + caseName;
  for (char& c : s) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '_' || c == '.';
    if (!keep) c = '_';
  }
  return s;
}

int runReport(const ReportOptions& options, std::ostream& out, ReportFiles* filesOut) {
  // Everything is read and checked before anything is written: bad input leaves the output
  // directory as it was.
  std::vector<HistoryRun> history;
  if (!options.historyDir.empty()) history = readHistory(options.historyDir);
  std::vector<ResultRow> current;
  std::vector<std::string> resultPaths = options.results;
  if (resultPaths.empty()) {
    if (history.empty()) throw ReportInputError("report: give results files or --history DIR");
    resultPaths.push_back(history.back().dir);  // the newest run of the history
  }
  current = readAll(resultPaths);
  if (current.empty()) throw ReportInputError(resultPaths.front() + ": holds no result rows");
  const std::vector<ResultRow> baseline = readAll(options.baselines);
  if (!options.baselines.empty() && baseline.empty()) {
    throw ReportInputError(options.baselines.front() + ": the baseline holds no result rows");
  }
  const Comparison cmp = compare(current, baseline, options.gateOptions);

  // The report is one set of files (CSVs, plots, report.md, report.html), built whole in a
  // staging folder inside the report's and moved into place only when complete (commitSet):
  // an interrupted or failed report leaves the previous set as it was, never a mix.
  ReportFiles files;
  const std::string dir =
      options.outDir.empty() ? defaultOutDir(resultPaths.front()) : options.outDir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw ReportInputError(dir + ": cannot create the report directory: " + ec.message());
  removeStaleStaging(dir);
  const std::string stage = dir + "/" + stagingName();
  removeTree(stage);
  fs::create_directories(stage + "/plots", ec);
  if (ec) throw ReportInputError(stage + ": cannot create the staging folder: " + ec.message());
  StagingGuard guard{stage};
  std::vector<std::string> staged = {"summary.csv", "tensors.csv"};
  writeText(stage + "/summary.csv", summaryCsv(cmp));
  writeText(stage + "/tensors.csv", tensorsCsv(current));
  if (!history.empty()) {
    staged.push_back("history.csv");
    writeText(stage + "/history.csv", historyCsv(history));
  }

  if (options.plots)
    files.plotProblem = runPlots(stage);
  else
    files.plotProblem = "plots not requested (--no-plots)";
  const auto plot = [&](const std::string& name) -> std::optional<std::string> {
    const std::string rel = "plots/" + name + ".png";
    if (fs::is_regular_file(stage + "/" + rel) && fs::file_size(stage + "/" + rel) > 0) {
      files.plots.push_back(dir + "/" + rel);
      staged.push_back(rel);
      return rel;
    }
    return std::nullopt;
  };

  // The document.
  Document doc;
  doc.heading(1, "stratbench report");
  doc.table(provenanceTable(current, baseline));
  if (!files.plotProblem.empty()) doc.paragraph("Plots are missing: " + files.plotProblem, "warn");

  const auto failures = cmp.gateFailures();
  const auto warnings = cmp.warnings();
  doc.heading(2, "Gate");
  if (!cmp.hasBaseline) {
    doc.paragraph("No baseline given: every row is judged on its own (numerics only).");
  }
  if (failures.empty()) {
    doc.paragraph("Gate passed: no numerics regression, no misprediction, no memory regression" +
                      std::string(options.gateOptions.hardPerf ? ", no time regression" : "") + ".",
                  "gate-pass");
  } else {
    doc.paragraph("Gate failed: " + std::to_string(failures.size()) + " finding(s).", "gate-fail");
    doc.list(failures);
  }
  if (!warnings.empty()) {
    doc.paragraph("Warnings (" + std::to_string(warnings.size()) + "), reported but not gating:");
    doc.list(warnings);
  }
  doc.paragraph(
      "Thresholds: time " + fmt("%.3g", options.gateOptions.perfThresholdPct) +
      "% on the median and Mann-Whitney p < " + fmt("%.3g", options.gateOptions.alpha) +
      " over >= " + std::to_string(options.gateOptions.minSamples) + " repetitions a side (" +
      (options.gateOptions.hardPerf ? "hard" : "soft") + "); memory " +
      fmt("%.3g", options.gateOptions.memThresholdPct) +
      "% (hard); numerics hard; predictions within each strategy's stated tolerance " +
      (options.gateOptions.allowMispredicted ? "(soft: --allow-mispredicted)." : "(hard)."));

  doc.heading(2, "Summary by family");
  doc.table(familyTable(cmp));

  doc.heading(2, "Across cases");
  if (auto p = plot("predicted_vs_measured")) doc.image(*p, "predicted vs measured");
  // Family sweeps (checkpointing budgets): one plot per swept case family.
  std::vector<std::string> sweeps;
  for (const auto& e : fs::directory_iterator(stage + "/plots")) {
    const std::string name = e.path().stem().string();
    if (name.rfind("sweep_", 0) == 0 && e.path().extension() == ".png") sweeps.push_back(name);
  }
  std::sort(sweeps.begin(), sweeps.end());
  for (const auto& name : sweeps) {
    if (auto p = plot(name)) doc.image(*p, name);
  }
  if (!history.empty()) {
    doc.paragraph("History: " + std::to_string(history.size()) + " runs in " + options.historyDir +
                  ", oldest " + history.front().timestamp + ", newest " + history.back().timestamp +
                  ".");
    if (auto p = plot("history_status")) doc.image(*p, "history of statuses");
  }

  // Cases, in the order the results list them; gone rows join their case.
  std::vector<std::string> caseOrder;
  std::map<std::string, std::vector<const RowComparison*>> byCase;
  for (const auto& rc : cmp.rows) {
    const std::string slug = caseSlug(rc.any().suite, rc.any().caseName);
    if (!byCase.count(slug)) caseOrder.push_back(slug);
    byCase[slug].push_back(&rc);
  }
  for (const auto& slug : caseOrder) {
    const auto& rows = byCase[slug];
    const ResultRow& a = rows.front()->any();
    doc.heading(2, "Case " + a.suite + "/" + a.caseName);
    doc.paragraph("workload " + a.workload + ", shape " + a.shape + ", " + a.dtype + ", mesh " +
                  a.mesh + ", inputs " + a.inputs + ", seed " + std::to_string(a.seed) +
                  ", backend " + a.backend + ", world size " + std::to_string(a.worldSize));
    doc.table(caseTable(rows, cmp.hasBaseline, "case-" + slug));
    for (const char* kind : {"time_", "memory_", "errors_", "history_"}) {
      if (auto p = plot(kind + slug)) doc.image(*p, std::string(kind) + slug);
    }
  }

  writeText(stage + "/report.md", doc.markdown());
  writeText(stage + "/report.html",
            doc.html("stratbench report: " + joined(distinct(current, &ResultRow::suite)), stage));
  staged.push_back("report.md");
  staged.push_back("report.html");  // last: a reader that sees it sees the whole set
  commitSet(stage, dir, staged);
  files.plotsDir = dir + "/plots";
  files.summaryCsv = dir + "/summary.csv";
  files.tensorsCsv = dir + "/tensors.csv";
  if (!history.empty()) files.historyCsv = dir + "/history.csv";
  files.markdown = dir + "/report.md";
  files.html = dir + "/report.html";

  // The console summary.
  int pass = 0, bad = 0;
  for (const auto& r : current) {
    if (r.status == "pass") ++pass;
    if (r.isBad()) ++bad;
  }
  out << "report: " << current.size() << " rows (" << pass << " pass, " << bad << " fail or error)"
      << (cmp.hasBaseline ? " against " + std::to_string(baseline.size()) + " baseline rows" : "")
      << "\n";
  for (const auto& w : warnings) out << "  warning: " << w << "\n";
  for (const auto& f : failures) out << "  GATE: " << f << "\n";
  if (!files.plotProblem.empty()) out << "  plots: " << files.plotProblem << "\n";
  out << "report: " << files.html << " (" << files.plots.size() << " plots), " << files.markdown
      << ", " << files.summaryCsv << "\n";
  if (options.gate) {
    out << "gate: "
        << (failures.empty() ? "passed"
                             : "FAILED (" + std::to_string(failures.size()) + " finding(s))")
        << "\n";
  }
  if (filesOut) *filesOut = files;
  return options.gate && !failures.empty() ? 1 : 0;
}

}  // namespace sb::reports
