// The walk that turns a TorchScript module into a graph (import.h): every node executed once on
// example inputs, its operator mapped to graph nodes or kept as "aten".
//
// Whole, and why: it is one class, Walker (about 640 lines), and the cache around it;
// the loading and validation of the file already live apart (export.h's loadModelFile), and the
// operator mapping too (import_map.h). Every check of the walk reads the Walker's state at the
// node it runs (each value's Entry, when it was computed, the storages of inputs, parameters and
// buffers, what was written in place), so no part of it moves out as it is: a cut is a change of
// design, not a move. Its one seam: the memory-use checks (State, noteState, checkMemoryUse,
// refuseIfStale and their maps, about 200 lines) as a class of their own over import_map.h's Env
// that the walk calls before each node, taking the walk's `where` for its messages. To be done
// with the imported and hostile tests of both CPU legs run after it, not in a stop's last minutes.

#include "reference/torchscript/import.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <sys/stat.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/runtime/operator.h>
#include <torch/csrc/jit/serialization/import.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iomanip>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include "reference/hidden_text.h"
#include "reference/torchscript/export.h"
#include "reference/torchscript/import_map.h"

namespace sb::reference::torchscript {
namespace {

using torch::jit::Node;
using torch::jit::Value;

// "file.py:42" of a node's source, or "" where the file does not record one.
std::string sourceLine(const Node* n) {
  const auto flc = n->sourceRange().file_line_col();
  return flc ? std::get<0>(*flc) + ":" + std::to_string(std::get<1>(*flc)) : "";
}

constexpr const char* kControlFlow =
    ": control flow (from torch.jit.script) is not imported; trace the model with "
    "torch.jit.trace at the shapes to study";

// The dtype of a module's example inputs: float64 where every floating parameter and buffer is
// float64, float32 otherwise (none, several: the module converts between them itself).
at::ScalarType floatingDtypeOf(const torch::jit::Module& m) {
  std::optional<at::ScalarType> dtype;
  bool mixed = false;
  const auto see = [&](const at::Tensor& t) {
    if (!at::isFloatingType(t.scalar_type())) return;
    if (dtype && *dtype != t.scalar_type()) mixed = true;
    dtype = t.scalar_type();
  };
  for (const auto& p : m.named_parameters(true)) see(p.value);
  for (const auto& b : m.named_buffers(true)) see(b.value);
  // (A half-precision module's example run would need kernels LibTorch's CPU lacks; its case
  // converts it anyway.)
  return dtype && !mixed && *dtype == at::kDouble ? at::kDouble : at::kFloat;
}

// A parameter's or buffer's name goes into every row's tensor names ("param/NAME" in
// tensor_err_ratio, "NAME=RATIO;..."): a name holding ';' or '=' or what a name must not hold (a
// control character, a C1 control, a text-direction mark, an invisible character: hidden_text.h,
// as for case names; register_parameter takes any text without '.') made the run's own
// results.csv one `report` refused, or one name show as another. What is wrong with it, or "".
std::string stateNameProblem(const std::string& name) {
  if (const HiddenCharacter h = hiddenCharacter(name, TextKind::kName)) return "holds " + h.text();
  if (const size_t at = name.find_first_of(";="); at != std::string::npos) {
    return std::string("holds '") + name[at] + "'";
  }
  return "";
}

class Walker {
 public:
  Walker(const ImportSpec& spec, const ModelFile& file, ImportedModel& out)
      : spec_(spec), file_(file), module_(file.module), out_(out), map_(out) {
    for (const auto& p : module_.named_parameters(true)) checkStateName("parameter", p.name);
    for (const auto& b : module_.named_buffers(true)) checkStateName("buffer", b.name);
    // A frozen parameter (requires_grad=False, as a fine-tuning script leaves a backbone) is
    // module state as a buffer is: a graph input, neither differentiated nor trained.
    for (const auto& p : module_.named_parameters(true)) {
      const auto* impl = p.value.unsafeGetTensorImpl();
      if (paramName_.count(impl) || bufferName_.count(impl)) continue;
      if (p.value.requires_grad()) {
        paramName_[impl] = p.name;
      } else {
        bufferName_[impl] = p.name;
        frozen_.insert(impl);
      }
    }
    for (const auto& b : module_.named_buffers(true)) {
      bufferName_[b.value.unsafeGetTensorImpl()] = b.name;
    }
    // The memory of the module's state, by storage: a view of a parameter shares its storage,
    // so a write through one is a write into the parameter.
    for (const auto& p : module_.named_parameters(true)) {
      noteState(p.value, frozen_.count(p.value.unsafeGetTensorImpl())
                             ? State{State::kBuffer, "the frozen parameter '" + p.name + "'"}
                             : State{State::kParameter, "the parameter '" + p.name + "'"});
    }
    for (const auto& b : module_.named_buffers(true)) {
      noteState(b.value, {State::kBuffer, "the buffer '" + b.name + "'"});
    }
  }

  void checkStateName(const char* kind, const std::string& name) const {
    if (const std::string why = stateNameProblem(name); !why.empty()) {
      // Escaped (every character the check refuses as \uXXXX) and cut: the message is printed.
      const std::string shown = escapeHidden(name.substr(0, 80), TextKind::kName);
      throw ImportError(spec_.file + ": the " + kind + " named '" + shown + "' " + why +
                        ": every result row names tensors by it (tensor_err_ratio's "
                        "'param/NAME=RATIO;...', printed to the terminal); rename it in the "
                        "module (letters, digits, '_')");
    }
  }

  void run() {
    auto method = module_.get_method("forward");
    const auto& args = method.function().getSchema().arguments();
    if (args.size() - 1 != spec_.inputs.size()) {
      throw ImportError(spec_.file + ": its forward takes " + std::to_string(args.size() - 1) +
                        " inputs, the case gives " + std::to_string(spec_.inputs.size()));
    }
    std::vector<Entry> in;
    Entry self;
    self.v = module_._ivalue();
    in.push_back(self);
    // Floating example inputs in the dtype the module was saved in (a model saved in float64
    // runs on float64 inputs), as a case then runs it converted to its own dtype.
    const at::ScalarType savedDtype = floatingDtypeOf(module_);
    // Each input alone, then all of them together: two inputs of 60% of the memory each fail
    // the allocator as surely as one of 120%.
    double total = 0;
    for (size_t i = 0; i < spec_.inputs.size(); ++i) {
      const InputSpec& s = spec_.inputs[i];
      total += refuseOverMemory(i, s, s.dtype == "int64" ? at::kLong : savedDtype);
    }
    if (const double memory = physicalMemory(); memory > 0 && total > memory) {
      std::ostringstream os;
      os << std::fixed << std::setprecision(1) << spec_.file << ": the " << spec_.inputs.size()
         << " inputs hold " << total / (1 << 30) << " GiB together, more than this machine's "
         << "memory (" << memory / (1 << 30) << " GiB); the import runs the model once at the "
         << "case's shapes";
      throw ImportError(os.str());
    }
    for (size_t i = 0; i < spec_.inputs.size(); ++i) {
      const InputSpec& s = spec_.inputs[i];
      Entry e;
      // Example values: only their shapes matter (numbers read from computed tensors are
      // refused), drawn from a generator of our own so that the process's stays as it was.
      e.v = s.dtype == "int64" ? at::randint(s.low, s.high, s.shape, gen_, at::kLong)
                               : at::randn(s.shape, gen_, savedDtype);
      e.dynamic = true;
      e.name = args[i + 1].name();
      noteState(e.v.toTensor(), {State::kInput, "the input '" + e.name + "'"});
      out_.dataInputs.push_back(e.name);
      out_.graph.inputs.emplace_back(e.name, s.shape);
      in.push_back(e);
    }
    std::vector<Entry> results = walk(*method.graph(), in, "");
    const Entry& r = results.at(0);
    std::string output = r.name;
    if (output.empty()) output = r.first;  // a tuple: its first tensor (nested: the first's)
    if (!r.dynamic || output.empty()) {
      throw ImportError(spec_.file +
                        ": the forward returns nothing computed from its inputs or "
                        "parameters (expected a tensor, or a tuple starting with one)");
    }
    // The output's value on the example inputs: a floating-point tensor, or the backward has
    // nothing to start from.
    c10::IValue value = r.v;
    while (value.isTuple() && !value.toTupleRef().elements().empty()) {
      value = value.toTupleRef().elements().at(0);
    }
    if (value.isTensor() && value.toTensor().numel() == 0) {
      std::ostringstream dims;
      dims << value.toTensor().sizes();
      throw ImportError(spec_.file + ": forward returns a tensor of shape " + dims.str() +
                        " at the case's input shapes: no elements, so no output to compare "
                        "and no gradient to start the backward from (check the inputs' shapes "
                        "and the model's slicing)");
    }
    if (value.isTensor() && !at::isFloatingType(value.toTensor().scalar_type())) {
      throw ImportError(spec_.file + ": forward returns a tensor of " +
                        std::string(c10::toString(value.toTensor().scalar_type())) +
                        ", which has no gradient: return the floating-point tensor the loss is "
                        "made from (the logits, not their argmax)");
    }
    out_.graph.output = output;
    map_.finish(output);
    out_.coverage = map_.coverage();
  }

 private:
  // "node aten::mul_ (in 'block', code/__torch__.py:13)": where(), without the file.
  std::string nodeText(const Node* n, const std::string& path) const {
    return where(n, path).substr(spec_.file.size() + 2);
  }

  std::string where(const Node* n, const std::string& path) const {
    const std::string line = sourceLine(n);
    std::string loc = line.empty() ? "" : ", " + line;
    if (auto it = file_.nodeName.find(n); it != file_.nodeName.end()) {
      loc += ", export node '" + it->second + "'";
    }
    return spec_.file + ": node " + n->kind().toQualString() + " (in " +
           (path.empty() ? "the top module" : "'" + path + "'") + loc + ")";
  }

  // The module a node runs in: its call's, or for an export (one flat forward) its
  // nn_module_stack's innermost.
  std::string pathOf(const Node* n, const std::string& path) const {
    if (auto it = file_.modulePath.find(n); it != file_.modulePath.end()) return it->second;
    return path;
  }

  std::string inputsText() const {
    std::string s;
    for (const auto& i : spec_.inputs) s += (s.empty() ? "" : ", ") + i.toJson().dump();
    return s;
  }

  // A failing node's tensor operands, each with where it comes from: "'x' [4, 16] Float (an
  // input), 'a.weight' [32, 17] Float (a parameter of the file)".
  std::string operandsText(const Node* n, const std::map<const Value*, Entry>& env) const {
    std::string out;
    for (const Value* v : n->inputs()) {
      const Entry& e = env.at(v);
      std::vector<at::Tensor> tensors;  // a tensor, or a list's (cat, stack)
      if (e.v.isTensor()) tensors.push_back(e.v.toTensor());
      if (e.v.isTensorList()) tensors = e.v.toTensorVector();
      for (size_t k = 0; k < tensors.size(); ++k) {
        const std::string name =
            e.v.isTensor() ? v->debugName() : v->debugName() + "[" + std::to_string(k) + "]";
        out += (out.empty() ? "" : ", ") + describeOperand(tensors[k], name, e);
      }
    }
    return out.empty() ? "none" : out;
  }

  // One operand: "'a.weight' [32, 17] Float (a parameter of the file)".
  std::string describeOperand(const at::Tensor& t, std::string name, const Entry& e) const {
    const auto* impl = t.unsafeGetTensorImpl();
    std::string from = "computed";
    if (auto it = paramName_.find(impl); it != paramName_.end()) {
      name = it->second;
      from = "a parameter of the file";
    } else if (auto b = bufferName_.find(impl); b != bufferName_.end()) {
      name = b->second;
      from = frozen_.count(impl) ? "a frozen parameter of the file" : "a buffer of the file";
    } else if (e.v.isTensor() && std::find(out_.dataInputs.begin(), out_.dataInputs.end(),
                                           e.name) != out_.dataInputs.end()) {
      name = e.name;
      from = "an input, at the case's shape";
    } else if (!e.dynamic) {
      from = "a constant of the trace";
    }
    std::ostringstream dims;
    dims << t.sizes();
    return "'" + name + "' " + dims.str() + " " + std::string(c10::toString(t.scalar_type())) +
           " (" + from + ")";
  }

  // Which party the failure points at: tensors of two floating dtypes, a parameter the file
  // holds in another shape than its code uses, or (most often) shapes other than the trace's.
  std::string failureHint(const Node* n, const std::map<const Value*, Entry>& env) const {
    std::set<at::ScalarType> floating;
    bool parameter = false;
    for (const Value* v : n->inputs()) {
      const Entry& e = env.at(v);
      std::vector<at::Tensor> tensors;
      if (e.v.isTensor()) tensors.push_back(e.v.toTensor());
      if (e.v.isTensorList()) tensors = e.v.toTensorVector();
      for (const at::Tensor& t : tensors) {
        if (at::isFloatingType(t.scalar_type())) floating.insert(t.scalar_type());
        parameter |= paramName_.count(t.unsafeGetTensorImpl()) > 0;
      }
    }
    if (floating.size() > 1) {
      return "; the operation mixes floating dtypes: the model converts between them itself "
             "(trace it after model.to(one dtype))";
    }
    return std::string("; the model was probably traced at other shapes than the case's") +
           (parameter ? ", or the file's parameters do not fit its code (an edited or corrupt "
                        "file: compare their shapes with the module's)"
                      : "");
  }

  // An input of more bytes than the machine has is refused naming it, before the allocator
  // fails with a message that names nothing of the case.
  static double physicalMemory() {
    const long pages = sysconf(_SC_PHYS_PAGES), pageSize = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || pageSize <= 0) return 0;  // not known: the allocator decides
    return static_cast<double>(pages) * static_cast<double>(pageSize);
  }

  // The input's bytes; refused naming it where they alone pass the machine's memory.
  double refuseOverMemory(size_t i, const InputSpec& s, at::ScalarType dtype) const {
    double bytes = static_cast<double>(c10::elementSize(dtype));
    for (int64_t d : s.shape) bytes *= static_cast<double>(d);
    const double memory = physicalMemory();
    if (memory <= 0) return bytes;
    if (bytes > memory) {
      std::ostringstream os;
      os << std::fixed << std::setprecision(1) << spec_.file << ": inputs[" << i << "] "
         << s.toJson().dump() << " holds " << bytes / (1 << 30) << " GiB of "
         << c10::toString(dtype) << ", more than this machine's memory (" << memory / (1 << 30)
         << " GiB); the import runs the model once at the case's shapes";
      throw ImportError(os.str());
    }
    return bytes;
  }

  // Where a tensor's memory belongs to the model's state or the case's inputs.
  struct State {
    enum Kind { kInput, kParameter, kBuffer } kind;
    std::string what;  // "the parameter 'fc.weight'"
  };

  static const c10::StorageImpl* storageOf(const at::Tensor& t) {
    if (!t.defined() || !t.has_storage()) return nullptr;
    return t.storage().unsafeGetStorageImpl();
  }

  void noteState(const at::Tensor& t, State s) {
    if (const auto* st = storageOf(t)) state_.emplace(st, std::move(s));
  }

  // Before a node runs: what it writes in place and what it reads, against the memory of the
  // case's inputs, the model's parameters and buffers, and memory left uninitialised.
  //   - A write into an input or a parameter is refused: the reference runs the module on the
  //     stored input and parameters, so each run of it would start from other values than the
  //     graph's (and than the strategies').
  //   - A write into a buffer is module state for the next forward (batch norm's
  //     num_batches_tracked counter); one that this forward then reads is refused, as above.
  //   - Memory from torch.empty is refused where a node reads it before filling it.
  // Views, shape queries and operators that take a tensor only as a template of shape and
  // dtype (zeros_like, new_full, the functional fill/zero/copy of a decomposed export) read no
  // values. Every read of the node is judged before its writes are noted (b.add_(b) reads b
  // before it writes it).
  void checkMemoryUse(const Node* n, const std::map<const Value*, Entry>& env,
                      const std::string& path) {
    const c10::FunctionSchema* schema = n->maybeSchema();
    const std::string k = n->kind().toQualString();
    static const std::set<std::string> kReadsNoValues = {"aten::size",
                                                         "aten::dim",
                                                         "aten::numel",
                                                         "prim::dtype",
                                                         "prim::device",
                                                         "prim::layout",
                                                         "prim::ListConstruct",
                                                         "prim::TupleConstruct",
                                                         "prim::ListUnpack",
                                                         "prim::TupleUnpack",
                                                         "aten::zeros_like",
                                                         "aten::ones_like",
                                                         "aten::full_like",
                                                         "aten::empty_like",
                                                         "aten::new_zeros",
                                                         "aten::new_ones",
                                                         "aten::new_full",
                                                         "aten::new_empty",
                                                         "aten::new_empty_strided"};
    // Operators whose first argument gives only the shape (and dtype) of what they return.
    static const std::set<std::string> kFirstIsTemplate = {"aten::fill", "aten::zero",
                                                           "aten::copy"};
    bool view = false;
    if (schema && !schema->returns().empty()) {
      const auto* ret = schema->returns()[0].alias_info();
      view = ret && !ret->isWrite();
    }
    const auto argName = [&](size_t i) {
      return schema && i < schema->arguments().size() ? schema->arguments()[i].name()
                                                      : std::string();
    };
    const auto written = [&](size_t i) {
      if (!schema || i >= schema->arguments().size()) return false;
      const auto* a = schema->arguments()[i].alias_info();
      return a && a->isWrite();
    };
    const bool fills = k == "aten::fill_" || k == "aten::zero_" || k == "aten::copy_";
    const auto tensorsOf = [&](size_t i) {
      std::vector<at::Tensor> out;
      const Entry& e = env.at(n->input(i));
      if (e.v.isTensor()) out.push_back(e.v.toTensor());
      if (e.v.isTensorList()) out = e.v.toTensorVector();
      return out;
    };
    // Reads.
    const bool readsNone = view || kReadsNoValues.count(k) > 0;
    for (size_t i = 0; i < n->inputs().size() && !readsNone; ++i) {
      if (i == 0 && kFirstIsTemplate.count(k)) continue;
      if (k == "aten::type_as" && i == 1) continue;
      // Written whole without being read: the first argument of fill_/zero_/copy_, an out=.
      if (written(i) && ((fills && i == 0) || argName(i) == "out")) continue;
      for (const at::Tensor& t : tensorsOf(i)) {
        const c10::StorageImpl* st = storageOf(t);
        if (!st) continue;
        if (auto it = uninitialised_.find(st); it != uninitialised_.end()) {
          throw ImportError(where(n, path) + " reads memory that " + it->second.second +
                            " left uninitialised (torch.empty): its values are whatever the "
                            "allocator held, other on every run; fill it first (torch.zeros, "
                            ".fill_, .copy_)");
        }
        // (A node that updates the buffer again, add_ on it, only moves its state further.)
        if (auto it = writtenState_.find(st); it != writtenState_.end() && !written(i)) {
          throw ImportError(where(n, path) + " reads " + it->second.first +
                            ", which this forward wrote in place before (" + it->second.second +
                            "): the reference runs the module's forward again for every "
                            "micro-batch and step, each time from the state the last one left, "
                            "while the graph holds one forward's; keep the update out of the "
                            "forward, or do not read it there");
        }
      }
    }
    // Writes.
    for (size_t i = 0; i < n->inputs().size(); ++i) {
      if (!written(i)) continue;
      for (const at::Tensor& t : tensorsOf(i)) {
        const c10::StorageImpl* st = storageOf(t);
        if (!st) continue;
        lastWrite_[st] = {clock_, nodeText(n, path)};
        if (auto it = state_.find(st); it != state_.end()) {
          if (it->second.kind != State::kBuffer) {
            const bool input = it->second.kind == State::kInput;
            throw ImportError(
                where(n, path) + " writes in place into " + it->second.what +
                ": the forward changes " + (input ? "its input" : "a parameter") +
                ", so the reference, which runs the module on the stored tensors, would start "
                "each run from other values than the graph; " +
                (k == "aten::embedding_renorm_"
                     ? "nn.Embedding(max_norm=...) renormalises its weight in place: trace it "
                       "without max_norm"
                     : "write the model out of place (x = x + 1, not x.add_(1))"));
          }
          writtenState_.emplace(st, std::make_pair(it->second.what, nodeText(n, path)));
        }
        // Filled whole: no longer uninitialised. (A write through a view of part of it counts
        // as filling it all: a read of the rest is not caught.)
        if ((fills && i == 0) || argName(i) == "out") uninitialised_.erase(st);
      }
    }
  }

  static std::string join(const std::string& a, const std::string& b) {
    return a.empty() ? b : a + "." + b;
  }

  std::vector<Entry> walk(torch::jit::Graph& graph, const std::vector<Entry>& args,
                          const std::string& path) {
    std::map<const Value*, Entry> env;
    for (size_t i = 0; i < graph.inputs().size(); ++i) {
      env[graph.inputs()[i]] = args.at(i);
      born_[graph.inputs()[i]] = clock_;
    }
    for (Node* n : graph.nodes()) step(n, env, pathOf(n, path));
    std::vector<Entry> out;
    for (const Value* v : graph.outputs()) {
      refuseIfStale(v, env.at(v),
                    path.empty() ? spec_.file + ": the forward's result"
                                 : spec_.file + ": what '" + path + "' returns");
      out.push_back(env.at(v));
    }
    return out;
  }

  Entry getAttr(const Node* n, const Entry& obj) {
    const std::string name = n->s(c10::attr::name);
    Entry e;
    e.v = obj.v.toObject()->getAttr(name);
    const std::string qualified = join(obj.module, name);
    if (e.v.isObject()) {
      e.module = qualified;
    } else if (e.v.isTensor()) {
      const auto* impl = e.v.toTensor().unsafeGetTensorImpl();
      if (auto it = paramName_.find(impl); it != paramName_.end()) {
        e.dynamic = true;
        e.name = map_.parameter(it->second, e.v.toTensor(), spec_.fault == "wrong_parameter");
      } else if (bufferName_.count(impl)) {
        e.dynamic = true;  // module state: a graph input, converted as module.to() converts it
        e.name = map_.buffer(bufferName_.at(impl), e.v.toTensor());
      }
    }
    return e;
  }

  // A value read after its memory was written in place by a later node (through a view of it,
  // or it a view of what was written): the graph holds values, not memory, so it would read
  // the value as it was before the write, where the module reads it after. Refused, naming it.
  void refuseIfStale(const Value* v, const Entry& e, const std::string& who) const {
    // (A constant of the trace is folded as its memory holds it, written or not.)
    if (!e.dynamic) return;
    std::vector<at::Tensor> tensors;
    if (e.v.isTensor()) tensors.push_back(e.v.toTensor());
    if (e.v.isTensorList()) tensors = e.v.toTensorVector();
    const auto born = born_.find(v);
    const uint64_t bornAt = born == born_.end() ? 0 : born->second;
    for (const at::Tensor& t : tensors) {
      const auto w = lastWrite_.find(storageOf(t));
      if (w == lastWrite_.end() || w->second.first <= bornAt) continue;
      throw ImportError(who + " reads '" + v->debugName() + "', whose memory " + w->second.second +
                        " wrote in place after it was computed (through a view of it, or of what "
                        "it is a view of): the graph holds values, so it would read it as it was "
                        "before that write, and the module after; write the model out of place "
                        "(y = y * 2, or torch.cat, not an in-place op on a view)");
    }
  }

  void step(Node* n, std::map<const Value*, Entry>& env, const std::string& path) {
    const auto kind = n->kind();
    if (kind == c10::prim::Constant) {
      env[n->output()].v = torch::jit::toIValue(n->output()).value();
      return;
    }
    if (kind == c10::prim::GetAttr) {
      env[n->output()] = getAttr(n, env.at(n->input(0)));
      born_[n->output()] = clock_;
      return;
    }
    ++clock_;
    // What the node reads, against in-place writes since each value was computed (shape
    // queries read no values).
    {
      const std::string k = kind.toQualString();
      if (!(k == "aten::size" || k == "aten::dim" || k == "aten::numel" || k == "prim::dtype" ||
            k == "prim::device" || k == "prim::layout")) {
        for (const Value* v : n->inputs()) refuseIfStale(v, env.at(v), where(n, path));
      }
    }
    for (const Value* v : n->outputs()) born_[v] = clock_;
    // A decomposed export's buffer update (export.h): module state for the next forward, not
    // part of this one's graph.
    if (kind == c10::prim::SetAttr) return;
    if (kind == c10::prim::CallMethod) {
      const Entry& self = env.at(n->input(0));
      torch::jit::Module sub(self.v.toObject());
      auto method = sub.get_method(n->s(c10::attr::name));
      std::vector<Entry> args;
      for (const Value* v : n->inputs()) args.push_back(env.at(v));
      const auto results = walk(*method.graph(), args, self.module);
      for (size_t i = 0; i < n->outputs().size(); ++i) {
        env[n->outputs()[i]] = results.at(i);
        born_[n->outputs()[i]] = clock_;  // as the call returns, after its nodes' writes
      }
      return;
    }
    if (kind == c10::prim::If || kind == c10::prim::Loop || kind == c10::prim::CallFunction ||
        kind == c10::prim::fork || n->blocks().size() > 0) {
      throw ImportError(where(n, path) + kControlFlow);
    }
    bool dynamic = false;
    for (const Value* v : n->inputs()) dynamic |= env.at(v).dynamic;
    // Dropout that drops nothing is the identity; any other draw from torch's generator is not
    // something a graph can repeat the way the module's own run draws it. With the shape's
    // `random: true` it is recorded (the model's draws) and the graph keeps the operator: only
    // the reference and the executors that run the module itself draw as it does (harness
    // drawsRandomNumbers; every other executor is refused before it runs the graph).
    const std::string k = kind.toQualString();
    bool drawn = false;
    if (k == "aten::dropout" || k == "aten::dropout_" || k == "aten::feature_dropout") {
      const double p = env.at(n->input(1)).v.toDouble();
      const bool train = env.at(n->input(2)).v.toBool();
      if (p == 0 || !train) {
        env[n->output()] = env.at(n->input(0));
        return;
      }
      if (!spec_.random) {
        throw ImportError(where(n, path) + ": dropout with p = " + std::to_string(p) +
                          " in training draws its mask from torch's generator, which a graph "
                          "cannot repeat; trace the model with dropout 0 or in eval mode (or "
                          "say shape key random: true, for the executors that run the module "
                          "itself: torch/checkpoint, torch/sac)");
      }
      drawn = true;
    }
    // PyTorch 2.x's fused attention (nn.MultiheadAttention, torchvision's ViT) and the
    // recurrent layers (aten::lstm, gru, rnn_tanh: marked random in 2.x) are random only
    // through their dropout: with dropout 0, or outside training, they draw nothing.
    bool drawsNothing = false;
    if (const c10::FunctionSchema* schema = n->maybeSchema()) {
      std::optional<double> dropout;
      std::optional<bool> train;
      const auto& args = schema->arguments();
      for (size_t i = 0; i < args.size() && i < n->inputs().size(); ++i) {
        const c10::IValue& v = env.at(n->input(i)).v;
        if ((args[i].name() == "dropout" || args[i].name() == "dropout_p") && v.isDouble()) {
          dropout = v.toDouble();
        }
        if (args[i].name() == "train" && v.isBool()) train = v.toBool();
      }
      drawsNothing = dropout && (*dropout == 0 || (train && !*train));
    }
    if (spec_.random && !drawsNothing && (drawn || n->isNondeterministic())) {
      drawn = true;
      out_.draws.push_back(where(n, path));
    }
    if (k == "aten::scaled_dot_product_attention" && !drawsNothing && !drawn) {
      throw ImportError(where(n, path) +
                        ": scaled_dot_product_attention with dropout draws its mask from torch's "
                        "generator, which a graph cannot repeat; trace the model with dropout 0 "
                        "or in eval mode");
    }
    if (n->isNondeterministic() && !drawsNothing && !drawn) {
      throw ImportError(where(n, path) + ": a random operator; its draws cannot be repeated");
    }
    if (dynamic && (k == "aten::item" || k == "aten::Int" || k == "aten::Float" ||
                    k == "aten::Bool" || k == "aten::ScalarImplicit")) {
      throw ImportError(where(n, path) +
                        ": a number read from a tensor computed by the model: the graph would "
                        "depend on the data");
    }
    checkMemoryUse(n, env, path);
    torch::jit::Stack stack;
    for (const Value* v : n->inputs()) stack.push_back(env.at(v).v);
    try {
      // The interpreter runs these four itself (instructions, not operators).
      if (kind == c10::prim::ListConstruct) {
        c10::impl::GenericList list(
            n->output()->type()->expectRef<c10::ListType>().getElementType());
        for (const auto& v : stack) list.push_back(v);
        stack = {c10::IValue(list)};
      } else if (kind == c10::prim::TupleConstruct) {
        stack = {c10::ivalue::Tuple::create(stack)};
      } else if (kind == c10::prim::ListUnpack) {
        const auto elems = stack.at(0).toListRef().vec();
        stack.assign(elems.begin(), elems.end());
      } else if (kind == c10::prim::TupleUnpack) {
        const auto elems = stack.at(0).toTupleRef().elements().vec();
        stack.assign(elems.begin(), elems.end());
      } else {
        n->getOperation()(stack);
      }
    } catch (const std::exception& e) {
      throw ImportError(where(n, path) + " fails on the inputs given (" + inputsText() +
                        "): " + errorFirstLine(e.what()) +
                        "; its tensors: " + operandsText(n, env) + failureHint(n, env));
    }
    for (size_t i = 0; i < n->outputs().size(); ++i) env[n->outputs()[i]].v = stack.at(i);
    // Memory left as the allocator had it: its values are whatever was there before, another
    // on every run, so a graph that folds them in and the module's own forward never agree.
    // (Kept alive by the map, so that no later tensor reuses the address; one of no bytes
    // holds nothing to read.)
    if (k == "aten::empty" || k == "aten::empty_like" || k == "aten::empty_strided" ||
        k == "aten::empty_permuted" || k == "aten::new_empty" || k == "aten::new_empty_strided") {
      if (stack.at(0).isTensor()) {
        const at::Tensor& t = stack.at(0).toTensor();
        if (const auto* st = storageOf(t); st && t.storage().nbytes() > 0) {
          uninitialised_.emplace(st, std::make_pair(t.storage(), nodeText(n, path)));
        }
      }
    }
    if (kind == c10::aten::size && spec_.fault == "shape_constant_off_by_one" && !faulted_ &&
        stack.at(0).isInt()) {
      env[n->output()].v = stack.at(0).toInt() + 1;  // planted: a folded shape off by one
      faulted_ = true;
    }
    if (!dynamic) return;  // folded: constants, whatever they are
    // Lists and tuples carry their elements' names; unpacking hands them out.
    if (kind == c10::prim::ListConstruct || kind == c10::prim::TupleConstruct) {
      Entry& e = env[n->output()];
      e.dynamic = true;
      for (const Value* v : n->inputs()) e.names.push_back(env.at(v).name);
      if (n->inputs().size() > 0) {
        const Entry& head = env.at(n->input(0));
        e.first = head.name.empty() ? head.first : head.name;
      }
      return;
    }
    if (kind == c10::prim::ListUnpack || kind == c10::prim::TupleUnpack) {
      const Entry& list = env.at(n->input(0));
      for (size_t i = 0; i < n->outputs().size(); ++i) {
        Entry& e = env[n->outputs()[i]];
        e.name = list.names.at(i);
        e.dynamic = !e.name.empty();
      }
      return;
    }
    bool tensorOut = false;
    for (const Value* v : n->outputs()) {
      const auto& iv = env.at(v).v;
      tensorOut |= iv.isTensor() || iv.isTensorList();
    }
    if (!tensorOut) return;  // shape arithmetic on traced (fixed) shapes: constants
    try {
      map_.emit(n, env, path);
    } catch (const ImportError& e) {
      throw ImportError(where(n, path) + ": " + e.what());
    }
  }

  const ImportSpec& spec_;
  const ModelFile& file_;
  torch::jit::Module module_;
  ImportedModel& out_;
  GraphMapper map_;
  std::map<const c10::TensorImpl*, std::string> paramName_, bufferName_;
  std::set<const c10::TensorImpl*> frozen_;         // parameters with requires_grad=False
  std::map<const c10::StorageImpl*, State> state_;  // inputs', parameters' and buffers' memory
  // Buffers written in place so far: what, and by which node.
  std::map<const c10::StorageImpl*, std::pair<std::string, std::string>> writtenState_;
  // torch.empty's memory not yet filled: the storage (held, so that its address is not reused
  // by a later tensor while it is listed) and the node that made it.
  std::map<const c10::StorageImpl*, std::pair<c10::Storage, std::string>> uninitialised_;
  // Nodes run so far, when each value was computed, and the last in-place write into each
  // storage (when, and by which node): a value read after a later write is stale.
  uint64_t clock_ = 0;
  std::map<const Value*, uint64_t> born_;
  std::map<const c10::StorageImpl*, std::pair<uint64_t, std::string>> lastWrite_;
  bool faulted_ = false;
  at::Generator gen_ = at::make_generator<at::CPUGeneratorImpl>(0);
};

std::string cacheKey(const ImportSpec& s) {
  struct stat st {};
  std::string key = s.file + "|" + s.fault + "|" + (s.random ? "random|" : "|");
  if (::stat(s.file.c_str(), &st) == 0) {
    key += std::to_string(st.st_mtime) + "." + std::to_string(st.st_size);
  }
  for (const auto& i : s.inputs) key += "|" + i.toJson().dump();
  return key;
}

}  // namespace

std::shared_ptr<const ImportedModel> importModel(const ImportSpec& spec) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const ImportedModel>> cache;
  const std::string key = cacheKey(spec);
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  auto out = importModelUncached(spec);
  cache[key] = out;
  return out;
}

std::shared_ptr<const ImportedModel> importModelUncached(const ImportSpec& spec) {
  auto out = std::make_shared<ImportedModel>();
  out->inputSpecs = spec.inputs;
  const auto t0 = std::chrono::steady_clock::now();
  const ModelFile file = loadModelFile(spec.file, spec.fault);
  const torch::jit::Module& module = file.module;
  const auto loaded = std::chrono::steady_clock::now();
  if (file.exported) {
    // Checked once per file (and planted fault): the rows' reference is this program.
    static std::mutex mu;
    static std::map<std::string, ExportCheck> checks;
    ImportSpec fileOnly;
    fileOnly.file = spec.file;
    fileOnly.fault = spec.fault;
    const std::string key = cacheKey(fileOnly);
    ExportCheck check;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = checks.find(key);
      if (it == checks.end()) it = checks.emplace(key, verifyExport(spec.file, spec.fault)).first;
      check = it->second;
    }
    if (!check.pass) {
      throw ImportError(spec.file + ": the program run here " + check.text +
                        ": this reader does not run it as PyTorch does");
    }
    out->exported = true;
    out->exportedBy = file.torchVersion;
    out->exportCheck = check.text;
    out->checkSeconds = check.seconds;
  }
  const auto t1 = std::chrono::steady_clock::now();
  if (!module.find_method("forward")) {
    throw ImportError(spec.file + ": the module has no forward method");
  }
  // Control flow anywhere (torch.jit.script), found before anything runs: a traced graph is
  // straight-line code at fixed shapes, which is what the graph can hold.
  {
    auto g = module.get_method("forward").graph()->copy();
    torch::jit::Inline(*g);
    const std::function<void(torch::jit::Block*)> scan = [&](torch::jit::Block* b) {
      for (torch::jit::Node* n : b->nodes()) {
        if (n->kind() == c10::prim::If || n->kind() == c10::prim::Loop) {
          const std::string line = sourceLine(n);
          throw ImportError(spec.file + ": node " + n->kind().toQualString() +
                            (line.empty() ? "" : " (" + line + ")") + kControlFlow);
        }
        for (torch::jit::Block* inner : n->blocks()) scan(inner);
      }
    };
    scan(g->block());
    // What forward returns: a tensor (or a tuple whose first element is one), the output
    // every strategy's is compared with and whose gradient drives the backward. A dict, a list
    // or a number has none (an integer tensor is refused once the walk has its value).
    c10::TypePtr ret = g->outputs().at(0)->type();
    while (const auto tuple = ret->cast<c10::TupleType>()) {
      if (tuple->elements().empty()) break;
      ret = tuple->elements().at(0);
    }
    const auto tensor = ret->cast<c10::TensorType>();
    if (!tensor) {
      throw ImportError(spec.file + ": forward returns " + ret->annotation_str() +
                        "; stratbench verifies a forward that returns a tensor (or a tuple "
                        "whose first element is one): return the tensor the loss is made from");
    }
  }
  {
    at::NoGradGuard noGrad;
    Walker(spec, file, *out).run();
  }
  if (spec.random && out->draws.empty()) {
    throw ImportError(spec.file +
                      ": shape key random: true, but the model draws nothing (no dropout or "
                      "random operator in training): leave the key out");
  }
  if (out->graph.parameters.empty()) {
    // A parameter that reaches no output has no gradient either: named, so that the user
    // sees what the forward leaves out.
    std::string unreached, frozen;
    int count = 0, frozenCount = 0;
    for (const auto& p : module.named_parameters(true)) {
      if (!p.value.requires_grad()) {
        if (++frozenCount <= 8) frozen += (frozen.empty() ? "" : ", ") + p.name;
        continue;
      }
      if (++count <= 8) unreached += (unreached.empty() ? "" : ", ") + p.name;
    }
    if (count > 8) unreached += ", ... (" + std::to_string(count) + " in all)";
    if (frozenCount > 8) frozen += ", ... (" + std::to_string(frozenCount) + " in all)";
    throw ImportError(spec.file +
                      (count == 0 && frozenCount == 0 ? std::string(": the model has no parameters")
                       : count == 0 ? ": every parameter of the model is frozen (requires_grad="
                                      "False: " +
                                          frozen + ")"
                                    : ": no trainable parameter of the model reaches its "
                                      "output (" +
                                          unreached + ")") +
                      ": there is nothing to train, shard or checkpoint, and no gradient to "
                      "verify");
  }
  const auto t2 = std::chrono::steady_clock::now();
  out->loadSeconds = std::chrono::duration<double>(loaded - t0).count();
  out->importSeconds = std::chrono::duration<double>(t2 - t1).count();
  return out;
}

}  // namespace sb::reference::torchscript
