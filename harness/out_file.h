#pragma once

// Replacing a result file that a user named (--out of `solve shard`, `calibrate`): only a
// regular file, or nothing, is ever replaced. A device, a FIFO, a folder or a socket at the path
// (or at the end of a symbolic link there) is refused: a rename over it would swap the system's
// /dev/null for a JSON file when run as root, and writing through a FIFO blocks.

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace sb::harness {

// Checks, before any work, that `path` may receive a result file (the rules below, and never an
// existing run's results.csv / results.json, partial or not); returns the path written (the end
// of a symbolic link at `path`). Throws InputError naming the path.
std::string checkResultPath(const std::string& path);

// A file the command reads, by the option that names it ({"--model", "m.pt"}): a result file
// never replaces one (`solve shard --model m.pt --out m.pt` lost the model to its plan).
using InputFiles = std::vector<std::pair<std::string, std::string>>;

// checkResultPath, and `path` is none of `inputs` (the same file, through links and other
// spellings: by device and inode). Throws InputError naming both options.
std::string checkResultPath(const std::string& path, const InputFiles& inputs);

// Writes `content` to `path`: into a temporary file beside it (PATH.tmp.PID), flushed to disk,
// then renamed over it. A symbolic link at `path` is followed, and its target (a regular file,
// or nothing in an existing folder) replaced. Throws InputError naming the path and what is
// there when it is not a regular file, and on any failure to write; the temporary file is gone
// on every way out.
void replaceResultFile(const std::string& path, const std::string& content,
                       const InputFiles& inputs = {});

// An input kept where a command writes: `path` (named by `option`) is, as given or through links,
// the file `name` in the folder `at`.
struct InputAmongOutputs {
  std::string option, path, name, at;
};
// The first of `inputs` that is, as given or through links, a file named one of `names` in the
// folder `dir` (which may not be there yet: then compared by its spelled path), or nothing. A
// command that writes those names into `dir` would replace that input (`run out/results.csv
// --out out`, a report's baseline kept as its summary.csv).
std::optional<InputAmongOutputs> inputAmongOutputs(const std::string& dir,
                                                   const std::set<std::string>& names,
                                                   const InputFiles& inputs);

}  // namespace sb::harness
