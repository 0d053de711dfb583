// Memory per rank of a plan (model.h): the liveness walk over the graph in execution order,
// a plan's peak and its rows. Its own file because the walk is one long function that the
// cost model does not need, and that program.cpp reuses for the integer program's memory rows.

#include "strategies/sharding/auto/model.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>
#include <tuple>

#include "harness/comm/mesh.h"
#include "strategies/sharding/auto/model_internal.h"
#include "strategies/sharding/auto/plan_memory.h"

namespace sb::strategies::autoshard {
namespace {

using harness::Box;
using harness::Layout;
using reference::Graph;
using reference::GraphNode;

bool isAliasOp(const reference::OpShape& s) {
  const std::string& op = s.op;
  return op == "view" || op == "permute" || op == "transpose" || op == "split" ||
         op == "contiguous" || (op == "aten" && s.attrs.value("view", false));
}

}  // namespace

void forEachLivenessRow(const ShardingModel& m, const std::map<std::string, int>& firstReader,
                        const std::function<bool(int layer)>& wants,
                        const std::function<void(const NodeRow&)>& sink) {
  const Graph& g = m.graph();
  const int N = static_cast<int>(g.nodes.size());
  const int64_t es = static_cast<int64_t>(c10::elementSize(m.options().dtype));
  const auto coords = harness::DeviceMesh(m.mesh()).coords(0);
  // Rank 0's bytes of a tensor, per (shape, layout): the blocks repeat the same few, for every
  // candidate of every node.
  std::map<std::pair<std::vector<int64_t>, Layout>, double> boxes;
  const auto boxBytes = [&](const std::vector<int64_t>& shape, const Layout& l) {
    auto [it, fresh] = boxes.try_emplace({shape, l}, 0.0);
    if (fresh) it->second = static_cast<double>(l.box(shape, m.mesh(), coords).numel() * es);
    return it->second;
  };
  // A quantity per candidate, computed once per candidate set (nodes of one shape share theirs:
  // the layers of a model) and call site `tag`, not once per node.
  std::map<std::pair<const void*, int>, std::vector<double>> perSet;
  const auto perCand = [&](int v, int tag, auto fn) {
    const auto& cands = m.candidates(v);
    auto [it, fresh] = perSet.try_emplace({&cands, tag});
    if (fresh) {
      for (const auto& c : cands) it->second.push_back(fn(c));
    }
    return it->second;
  };
  enum Site {
    kOut = 0,
    kOperand = 1000,
    kStored = 2000,
    kReduceCopy = 3000,
    kStats = 4000,
    kIds = 5000
  };
  const auto add = [](std::vector<double>& acc, const std::vector<double>& x) {
    if (acc.empty()) acc.assign(x.size(), 0.0);
    for (size_t k = 0; k < x.size(); ++k) acc[k] += x[k];
  };
  // Whether a node's output is a new tensor (views share their input's storage; a view of a
  // permuted tensor copies, and so does making it contiguous), and whose storage it lives in.
  std::vector<bool> allocates(N, true);
  std::vector<int> root(N);
  for (int v = 0; v < N; ++v) {
    const GraphNode& n = g.nodes[v];
    root[v] = v;
    if (!isAliasOp(n.shape)) continue;
    const auto [p, j] = g.producer(n.args[0]);
    const bool copies = (n.shape.op == "view" || n.shape.op == "contiguous") && p >= 0 &&
                        (g.nodes[p].shape.op == "permute" || g.nodes[p].shape.op == "transpose");
    if (!copies) {
      allocates[v] = false;
      root[v] = p >= 0 ? root[p] : -1;  // -1: a view of a parameter or input
    }
  }
  std::vector<int> lastUse(N, -1);
  std::map<std::string, int> lastReader;
  // Per node, the nodes reading one of its outputs (each once), in order.
  std::vector<std::vector<int>> readers(N);
  for (int v = 0; v < N; ++v) {
    for (const auto& a : g.nodes[v].args) {
      lastReader[a] = v;
      const auto [p, j] = g.producer(a);
      if (p >= 0 && root[p] >= 0) lastUse[root[p]] = std::max(lastUse[root[p]], v);
      if (p >= 0 && (readers[p].empty() || readers[p].back() != v)) readers[p].push_back(v);
    }
  }
  const int outputNode = g.producer(g.output).first;
  const auto isActivation = [&](const std::string& a) {
    if (g.isInput(a) || g.isParameter(a) || !g.requiresGrad(a)) return false;
    return root[g.producer(a).first] >= 0;
  };
  // Per node: its outputs, what it saves, the parameters it owns and the inputs it slices,
  // its activation operands (their gradients), and each owned parameter's gradient.
  std::vector<std::vector<double>> out(N), saved(N), base(N), grads(N), reduceCopies(N),
      transient(N);
  std::vector<std::tuple<int, int, std::vector<double>>> paramGrads;  // owner, last reader
  // An activation some node saves for its backward, once however many save it: its storage
  // (a root node), the first node that saves it (it lives until that node's backward) and its
  // bytes in that node's layout. Before its last reader's forward the producer's output counts
  // it already.
  struct SavedValue {
    int saver = -1;
    std::vector<double> bytes;
  };
  std::map<int, SavedValue> savedValues;
  const auto saveValue = [&](int storage, int v, std::vector<double> bytes) {
    SavedValue& sv = savedValues[storage];
    if (sv.saver < 0 || v < sv.saver) sv = {v, std::move(bytes)};
  };
  // A read that a node saves for its backward, of a value laid out by another node's choice
  // (its producer's output, or a parameter's owner's operand): where the two layouts differ,
  // the edge's redistribution made the saved tensor, a copy beside the value's own storage.
  struct SavedRead {
    int saver = 0, from = 0;
    std::function<Layout(const Candidate&)> layoutOf;  // the value's layout under `from`
    size_t operand = 0;
    int storage = -1;  // the value's storage (a root node); -1 for a parameter
  };
  std::vector<SavedRead> savedReads;
  for (int v = 0; v < N; ++v) {
    const GraphNode& n = g.nodes[v];
    out[v] = perCand(v, kOut, [&](const Candidate& c) {
      double b = 0;
      const auto shapes = n.shape.outputs();
      for (size_t j = 0; j < shapes.size(); ++j) b += boxBytes(shapes[j], c.outputs[j]);
      return b;
    });
    const auto operand = [&](size_t i) {
      return perCand(v, kOperand + static_cast<int>(i), [&](const Candidate& c) {
        return boxBytes(n.shape.operandShape(c.op.spec.operands[i]), c.op.operands[i]);
      });
    };
    const std::string& op = n.shape.op;
    bool records = false;  // autograd records the node (it saves) when a gradient flows through
    for (const auto& o : n.outputs()) records = records || g.requiresGrad(o);
    for (size_t i = 0; i < n.args.size(); ++i) {
      const std::string& a = n.args[i];
      const bool owned = g.isParameter(a) && firstReader.at(a) == v;
      if (owned && m.rowsWithoutParameters()) continue;  // the planted fault
      // An owned parameter lives, and takes its gradient, in its stored layout (ZeRO-3: split
      // further than it is read).
      const auto stored = [&] {
        return perCand(v, kStored + static_cast<int>(i), [&](const Candidate& c) {
          return boxBytes(n.shape.operandShape(c.op.spec.operands[i]), c.storedLayout(i));
        });
      };
      if (owned) paramGrads.emplace_back(v, lastReader.at(a), stored());
      if (owned) add(base[v], stored());
      // Data: token ids (an embedding's input) are int64 whatever the case's type, as the
      // executor holds them; other inputs in the case's type.
      if (g.isInput(a) && op == "embedding" && i == 0) {
        add(base[v], perCand(v, kIds, [&](const Candidate& c) {
              return boxBytes(n.shape.operandShape(c.op.spec.operands[i]), c.op.operands[i]) /
                     static_cast<double>(es) * 8.0;
            }));
      } else if (g.isInput(a)) {
        add(base[v], operand(i));
      }
      // A gradient partial over some mesh axes is all-reduced through a copy and the backend's
      // scratch (the threads backend's: the block again) during the node's backward.
      if (g.isParameter(a) || isActivation(a)) {
        add(reduceCopies[v], perCand(v, kReduceCopy + static_cast<int>(i), [&](const Candidate& c) {
              if (c.op.gradPartial[i].empty()) return 0.0;
              int64_t ranks = 1;
              for (int ax : c.op.gradPartial[i]) ranks *= m.mesh()[static_cast<size_t>(ax)];
              if (ranks == 1) return 0.0;
              return 2.0 * boxBytes(n.shape.operandShape(c.op.spec.operands[i]), c.op.operands[i]);
            }));
      }
      // aten: what an unknown kernel saves is not known here; all it reads is counted
      const bool savesOperand =
          records &&
          (op == "addmm" || op == "mm" || op == "bmm" || op == "matmul" || op == "mul" ||
           (i == 0 && (op == "layer_norm" || op == "rms_norm" || op == "gelu" || op == "silu")) ||
           (op == "aten" && !isAliasOp(n.shape)));
      // A view of a parameter (the tied head's transposed embedding) read through an edge: the
      // copy as a parameter's, against the view's layout.
      if (!g.isParameter(a) && !g.isInput(a) && savesOperand) {
        const auto [p, j] = g.producer(a);
        if (p >= 0 && root[p] < 0) {
          savedReads.push_back({v, p, [j = j](const Candidate& c) { return c.outputs[j]; }, i, -1});
        }
      }
      if (g.isParameter(a) && !owned && savesOperand) {
        const int owner = firstReader.at(a);
        const GraphNode& o = g.nodes[owner];
        const size_t oi =
            static_cast<size_t>(std::find(o.args.begin(), o.args.end(), a) - o.args.begin());
        savedReads.push_back(
            {v, owner, [oi](const Candidate& c) { return c.storedLayout(oi); }, i, -1});
      }
      // A parameter stored split further than it is read: the gathered copy, kept for the
      // backward where the operator's node saves that operand (the replay's savesOperand),
      // otherwise a transient of the node; in the backward its gradient as read, before it
      // goes back to the pieces.
      if (owned) {
        std::vector<bool> takesGrad;
        for (const auto& b : n.args) takesGrad.push_back(g.requiresGrad(b));
        std::vector<double> kept, dropped, gathered;
        for (const auto& c : m.candidates(v)) {
          const double b = c.stored.count(i) ? boxBytes(n.shape.operandShape(c.op.spec.operands[i]),
                                                        c.op.operands[i])
                                             : 0.0;
          const bool keeps = autoshard::savesOperand(c.op, i, takesGrad);
          kept.push_back(keeps ? b : 0.0);
          dropped.push_back(keeps ? 0.0 : b);
          gathered.push_back(b);
        }
        add(saved[v], kept);
        add(transient[v], dropped);
        add(grads[v], gathered);
      }
      if (!isActivation(a)) continue;
      add(grads[v], operand(i));
      if (!records) continue;
      if (i == 0 && op == "dropout") add(saved[v], operand(i));  // its mask, the input's size
      if (savesOperand) {
        const auto [p, j] = g.producer(a);
        saveValue(root[p], v, operand(i));
        savedReads.push_back(
            {v, p, [j = j](const Candidate& c) { return c.outputs[j]; }, i, root[p]});
      }
    }
    if (op == "layer_norm") {  // the mean and inverse deviation per row, in float
      add(saved[v], perCand(v, kStats, [&](const Candidate& c) {
            const Box in = c.op.operands[0].box(n.shape.input, m.mesh(), coords);
            return 2.0 * in.numel() / std::max<int64_t>(1, in.length.back()) * 4;
          }));
    }
    if (op == "rms_norm") {  // the inverse root mean square per row
      add(saved[v], perCand(v, kStats + 1, [&](const Candidate& c) {
            const Box in = c.op.operands[0].box(n.shape.input, m.mesh(), coords);
            return static_cast<double>(in.numel() / std::max<int64_t>(1, in.length.back()) * es);
          }));
    }
    if (op == "embedding" && records) {
      // The vocabulary split (Megatron's VocabParallelEmbedding) keeps its ids shifted to the
      // rank's rows (int64) and the mask of the foreign ones (bool) for its backward.
      add(saved[v], perCand(v, kStats + 4, [&](const Candidate& c) {
            if (c.op.spec.variant != "vocab") return 0.0;
            return boxBytes(n.shape.operandShape(c.op.spec.operands[0]), c.op.operands[0]) /
                   static_cast<double>(es) * 9.0;
          }));
    }
    if (op == "softmax" && records) saveValue(v, v, out[v]);
    if (op == "softmax" && (n.shape.scale() != 1.0 || n.shape.causal())) {
      // attentionSoftmax's scaled and masked copies: one alive beside the output it makes, and
      // one gradient more in its backward; the causal mask (bool) saved between.
      const auto rowsCols = [&](const Candidate& c) {
        const Box in = c.op.operands[0].box(n.shape.input, m.mesh(), coords);
        return static_cast<double>(in.length[in.length.size() - 2] * in.length.back());
      };
      transient[v] = perCand(v, kStats + 2, [&](const Candidate& c) {
        const Box in = c.op.operands[0].box(n.shape.input, m.mesh(), coords);
        return static_cast<double>(in.numel() * es);
      });
      if (n.shape.causal()) add(saved[v], perCand(v, kStats + 3, rowsCols));
    }
  }
  // The copies: per saved read, its saver's operand bytes where the layouts differ. Alive from
  // the saver's forward to its backward where another node holds the value too (the first to
  // save it, or a parameter's owner); where the saver is the first, the liveness above counts
  // its tensor, and the value's own storage is extra only while a later reader still needs it
  // (forward rows before its last use).
  struct Copy {
    int saver = 0, from = 0;
    int forwardUntil = 0;   // forward rows t in [saver, forwardUntil)
    bool backward = false;  // and backward rows t >= saver
    std::vector<std::vector<double>> bytes;
  };
  std::vector<Copy> copies;
  for (const auto& rd : savedReads) {
    Copy c;
    c.saver = rd.saver;
    c.from = rd.from;
    const bool first = rd.storage >= 0 && savedValues.at(rd.storage).saver == rd.saver;
    if (first) {
      c.forwardUntil = lastUse[rd.storage];
      if (c.forwardUntil <= rd.saver) continue;
    } else {
      c.forwardUntil = N;
      c.backward = true;
    }
    const GraphNode& n = g.nodes[rd.saver];
    const auto& from = m.candidates(rd.from);
    const auto& to = m.candidates(rd.saver);
    c.bytes.assign(from.size(), std::vector<double>(to.size(), 0.0));
    bool any = false;
    for (size_t l = 0; l < to.size(); ++l) {
      const Layout& want = to[l].op.operands[rd.operand];
      const double b = boxBytes(n.shape.operandShape(to[l].op.spec.operands[rd.operand]), want);
      for (size_t k = 0; k < from.size(); ++k) {
        if (rd.layoutOf(from[k]) != want) c.bytes[k][l] = b, any = true;
      }
    }
    if (any) copies.push_back(std::move(c));
  }
  // A view that reads its operand through an edge's redistribution views the edge's copy, not
  // the producer's storage: the copy lives while the view's readers (and their views) still
  // need it, and the producer's own storage only until its last other reader (the liveness
  // above counted it as long as any reader through the view). Forward rows t in
  // [view, through): + the copy; from max(view, other) on: - the producer's output. Each only
  // where the two layouts differ.
  // Per node: its last reader, or that of a view of it (a reader is later than its producer,
  // so one pass from the end sees every reader's final value).
  const auto isViewOf = [&](int w, int v) {
    return !allocates[w] && root[v] >= 0 && root[w] == root[v];
  };
  std::vector<int> through(N, -1);
  for (int v = N - 1; v >= 0; --v) {
    for (int w : readers[v])
      through[v] = std::max(through[v], isViewOf(w, v) ? std::max(w, through[w]) : w);
  }
  struct ViewCopy {
    int view = 0, from = 0, through = 0, other = 0;
    std::vector<std::vector<double>> copy, producer;
  };
  std::vector<ViewCopy> viewCopies;
  for (int v = 0; v < N; ++v) {
    const GraphNode& n = g.nodes[v];
    if (allocates[v] || root[v] < 0) continue;
    const auto [p, j] = g.producer(n.args[0]);
    if (p < 0 || !allocates[p] || through[v] <= v) continue;
    // Where a node saves the producer's storage (its own output, an operand, the view or a view
    // of it), the saved-value terms above hold it to a backward: left to them, as before (an
    // estimate, never under).
    if (savedValues.count(p)) continue;
    ViewCopy c;
    c.view = v;
    c.from = p;
    c.through = through[v];
    for (int w : readers[p]) {
      if (w != v) c.other = std::max(c.other, isViewOf(w, p) ? std::max(w, through[w]) : w);
    }
    const auto& from = m.candidates(p);
    const auto& to = m.candidates(v);
    c.copy.assign(from.size(), std::vector<double>(to.size(), 0.0));
    c.producer = c.copy;
    bool any = false;
    for (size_t l = 0; l < to.size(); ++l) {
      const Layout& want = to[l].op.operands[0];
      const double b = boxBytes(n.shape.operandShape(to[l].op.spec.operands[0]), want);
      for (size_t k = 0; k < from.size(); ++k) {
        if (from[k].outputs[static_cast<size_t>(j)] == want) continue;
        c.copy[k][l] = b;
        c.producer[k][l] = -out[p][k];
        any = true;
      }
    }
    if (any) viewCopies.push_back(std::move(c));
  }
  // Selective checkpointing priced (model.h's RecomputePricing): a node not kept drops what it
  // saves of its own and its copies, and a saver drops a value whose storage a node of its block
  // not kept made; each comes back when its block's backward recomputes it (from the block's
  // last node's backward on), as the replay has it.
  const RecomputePricing* rp = m.recomputePricing();
  std::map<int, int> regionEnd;
  if (rp) {
    for (int v = 0; v < N; ++v) {
      if (rp->region[v] >= 0) regionEnd[rp->region[v]] = v;
    }
  }
  const auto dropsOwn = [&](int v) { return rp && rp->region[v] >= 0 && !rp->save[v]; };
  const auto dropsValue = [&](int storage, int saver) {
    return rp && storage >= 0 && rp->region[saver] >= 0 &&
           rp->region[storage] == rp->region[saver] && !rp->save[storage];
  };
  // A value that a recomputed node reads from the forward (its storage made by a node that is
  // kept, or outside the block) is held for the block's recomputation, from its forward to the
  // backward of the block's last node (of the blocks reading it, the one whose backward comes
  // last: the earliest in the forward).
  std::vector<int> heldForRecompute(N, -1);  // per storage: that block's last node
  if (rp) {
    for (int w = 0; w < N; ++w) {
      if (rp->region[w] < 0 || !rp->recomputed[w]) continue;
      for (const auto& a : g.nodes[w].args) {
        const int p = g.producer(a).first;
        if (p < 0 || root[p] < 0) continue;
        const int st = root[p];
        if (rp->region[st] == rp->region[w] && rp->recomputed[st]) continue;  // rerun too
        const int end = regionEnd.at(rp->region[w]);
        if (heldForRecompute[st] < 0 || end < heldForRecompute[st]) heldForRecompute[st] = end;
      }
    }
  }
  // In the backward row of node t: a dropped tensor of `saver`'s is back once its block's
  // backward begins.
  const auto backAt = [&](int saver, int t) { return t <= regionEnd[rp->region[saver]]; };
  const auto addCopies = [&](NodeRow& r, int t, bool backward) {
    for (const auto& c : copies) {
      if (dropsOwn(c.saver) && (!backward || !backAt(c.saver, t))) continue;
      const bool live = backward ? c.backward && t >= c.saver : t >= c.saver && t < c.forwardUntil;
      if (live) r.pairs.push_back({c.from, c.saver, &c.bytes});
    }
  };
  NodeRow always;
  for (int v = 0; v < N; ++v) {
    if (!base[v].empty()) always.terms.emplace_back(v, &base[v]);
  }
  always.terms.emplace_back(outputNode, &out[outputNode]);  // the gradient seed
  // Forward: after node t.
  for (int t = 0; t < N; ++t) {
    if (!wants(g.nodes[t].layer)) continue;
    NodeRow r = always;
    r.what = "forward, after " + g.nodes[t].name;
    r.layer = g.nodes[t].layer;
    for (int u = 0; u <= t; ++u) {
      if (!saved[u].empty() && !dropsOwn(u)) r.terms.emplace_back(u, &saved[u]);
      const int last = m.rowsFreeEarly() ? lastUse[u] - 1 : lastUse[u];  // the planted fault
      if (allocates[u] && (last > t || u == outputNode || u == t)) {
        r.terms.emplace_back(u, &out[u]);
      }
    }
    std::vector<bool> savedHeld(N, false);
    for (const auto& [storage, sv] : savedValues) {
      const bool outputCounted = lastUse[storage] > t || storage == outputNode || storage == t;
      if (sv.saver <= t && !outputCounted && !dropsValue(storage, sv.saver)) {
        r.terms.emplace_back(sv.saver, &sv.bytes);
        savedHeld[storage] = true;
      }
    }
    for (int u = 0; u <= t; ++u) {
      const bool outputCounted = lastUse[u] > t || u == outputNode || u == t;
      if (heldForRecompute[u] >= 0 && allocates[u] && !outputCounted && !savedHeld[u]) {
        r.terms.emplace_back(u, &out[u]);
      }
    }
    for (const auto& c : viewCopies) {
      if (t < c.view || t >= c.through) continue;
      r.pairs.push_back({c.from, c.view, &c.copy});
      if (t >= c.other && c.from != outputNode) r.pairs.push_back({c.from, c.view, &c.producer});
    }
    if (!transient[t].empty()) {
      r.terms.emplace_back(t, &transient[t]);
      r.transient = &transient[t];
      r.transientOf = t;
    }
    addCopies(r, t, false);
    sink(r);
  }
  // Backward: during node t's backward (its saved tensors and its outputs' gradients still
  // held, its operands' gradients made), with the output kept for the results.
  for (int t = N - 1; t >= 0; --t) {
    if (!wants(g.nodes[t].layer)) continue;
    NodeRow r = always;
    r.what = "backward of " + g.nodes[t].name;
    r.layer = g.nodes[t].layer;
    r.terms.emplace_back(outputNode, &out[outputNode]);
    std::vector<bool> savedHeld(N, false);
    for (const auto& [storage, sv] : savedValues) {
      // At the block's first backward node the recomputation's outputs (below) hold them.
      const bool recomputing =
          rp && rp->region[sv.saver] >= 0 && regionEnd.at(rp->region[sv.saver]) == t;
      const bool held = !dropsValue(storage, sv.saver) || (backAt(sv.saver, t) && !recomputing);
      if (sv.saver <= t && held) {
        r.terms.emplace_back(sv.saver, &sv.bytes);
        savedHeld[storage] = true;
      }
    }
    for (int u = 0; u <= t; ++u) {
      if (heldForRecompute[u] >= 0 && t >= heldForRecompute[u] && allocates[u] && !savedHeld[u]) {
        r.terms.emplace_back(u, &out[u]);
      }
    }
    for (int u = 0; u <= t; ++u) {
      if (!saved[u].empty() && (!dropsOwn(u) || backAt(u, t))) r.terms.emplace_back(u, &saved[u]);
      // An activation's gradient, after its last reader's backward (which makes it: grads) to
      // its producer's.
      if (allocates[u] && lastUse[u] > t) r.terms.emplace_back(u, &out[u]);
    }
    for (const auto& [owner, last, bytes] : paramGrads) {
      if (last >= t) r.terms.emplace_back(owner, &bytes);
    }
    // The block's recomputation, at its backward's first node: every node it reruns holds its
    // output until the recomputation returns.
    if (rp && rp->region[t] >= 0 && regionEnd[rp->region[t]] == t) {
      for (int u = 0; u <= t; ++u) {
        if (rp->region[u] == rp->region[t] && rp->recomputed[u] && allocates[u]) {
          r.terms.emplace_back(u, &out[u]);
        }
      }
    }
    if (!grads[t].empty()) r.terms.emplace_back(t, &grads[t]);
    if (!reduceCopies[t].empty()) r.terms.emplace_back(t, &reduceCopies[t]);
    if (!transient[t].empty()) r.terms.emplace_back(t, &transient[t]);
    addCopies(r, t, true);
    sink(r);
  }
}

int64_t ShardingModel::peakBytes(const std::vector<int>& choice) const {
  double peak = 0;
  forEachLivenessRow(
      *this, firstReader_, [](int) { return true; },
      [&](const NodeRow& r) {
        double live = 0;
        for (const auto& [v, b] : r.terms) live += (*b)[choice[v]];
        for (const auto& p : r.pairs) live += (*p.bytes)[choice[p.u]][choice[p.v]];
        peak = std::max(peak, live);
      });
  return static_cast<int64_t>(peak);
}

std::vector<LivenessPoint> ShardingModel::livenessRows(const std::vector<int>& choice) const {
  std::vector<LivenessPoint> rows;
  forEachLivenessRow(
      *this, firstReader_, [](int) { return true; },
      [&](const NodeRow& r) {
        double live = 0;
        for (const auto& [v, b] : r.terms) live += (*b)[choice[v]];
        for (const auto& p : r.pairs) live += (*p.bytes)[choice[p.u]][choice[p.v]];
        const double during = r.transient ? (*r.transient)[choice[r.transientOf]] : 0.0;
        rows.push_back({r.what, static_cast<int64_t>(live), static_cast<int64_t>(during)});
      });
  return rows;
}

}  // namespace sb::strategies::autoshard
