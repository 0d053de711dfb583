// The autograd tape model of the chunking estimator: training's tape replayed on the counter
// (Tape), and the taped ops the transformer and the pair stack share (tape.cpp): a layer norm, a
// view, an elementwise op, a sum, and a chunked region recomputed in its backward. Internal to
// strategies/chunking/estimator/.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "strategies/chunking/estimator/estimator_internal.h"

namespace sb::strategies::chunking::estimator {

// ---------------------------------------------------------------------------------------------
// Training: autograd's tape, replayed.
//
// A forward with grad mode records, op by op, the tensors each backward node saves; the backward
// runs the nodes in reverse order of creation (autograd's order for these graphs), and each
// node allocates its inputs' gradients, then drops the gradient it consumed and its saved
// tensors, then its parameters' gradient temporaries (accumulated in place into .grad, which
// lives across steps; a slice of a fused parameter first becomes a full-size zero-padded
// gradient). Gradients meeting at one tensor are added into a new buffer; a leaf keeps the
// first gradient it gets and adds later ones in place. Storage is reference counted: a view
// holds its base, a saved tensor lives until its node has run.

class Tape {
 public:
  explicit Tape(Counter& m) : m_(m) {}
  Counter& counter() { return m_; }

  int alloc(int64_t bytes) {
    m_.alloc(bytes);
    store_.push_back({bytes, 1});
    return static_cast<int>(store_.size()) - 1;
  }
  // A handle on bytes the counter already holds (a region's output).
  int adopt(int64_t bytes) {
    store_.push_back({bytes, 1});
    return static_cast<int>(store_.size()) - 1;
  }
  void ref(int h) {
    if (h >= 0) ++store_[h].refs;
  }
  void unref(int h) {
    if (h < 0) return;
    if (--store_[h].refs == 0) {
      m_.release(store_[h].bytes);
      unref(store_[h].base);
    }
  }
  // A view of `h` (no bytes of its own; holds its base), strided when `strided`.
  int view(int h, bool strided) {
    ref(h);
    store_.push_back({0, 1, h, strided});
    return static_cast<int>(store_.size()) - 1;
  }
  // Whether a backward consuming gradient `h` first makes it contiguous.
  bool strided(int h) const { return h >= 0 && store_[h].strided; }
  int64_t bytes(int h) const { return h < 0 ? 0 : store_[h].bytes; }

  int slot() { return nextSlot_++; }
  void leaf(int slot) { leaves_.insert(slot); }

  // A parameter's gradient temporary, from inside a node's backward.
  void paramGrad(int64_t bytes, int64_t fullBytes = 0) {
    m_.alloc(bytes);
    params_.push_back({bytes, fullBytes});
  }

  using Fn = std::function<std::vector<std::pair<int, int>>(const std::vector<int>& grads)>;
  // A node consuming the gradients of `outs` and saving `saved` (referenced until it runs).
  void node(std::vector<int> outs, std::vector<int> saved, Fn fn) {
    for (int h : saved) ref(h);
    nodes_.push_back({std::move(outs), std::move(saved), std::move(fn)});
  }

  // Runs every node from the last; `grads` holds the seeded gradients and ends with the leaves'.
  // A region's backward records and runs its own chunks' tapes meanwhile: this call owns the
  // nodes recorded so far.
  void backward(std::map<int, int>& grads) {
    std::vector<Node> nodes;
    nodes.swap(nodes_);
    for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
      std::vector<int> in;
      bool any = false;
      for (int s : it->outs) {
        auto g = grads.find(s);
        in.push_back(g == grads.end() ? -1 : g->second);
        if (g != grads.end()) {
          any = true;
          grads.erase(g);
        }
      }
      std::vector<std::pair<int, int>> out;
      if (any) out = it->fn(in);
      for (int g : in) unref(g);
      for (int h : it->saved) unref(h);
      std::vector<ParamTemp> params;
      params.swap(params_);
      for (const auto& p : params) {
        if (p.full > 0) {
          m_.alloc(p.full);
          m_.release(p.bytes);
          m_.release(p.full);
        } else {
          m_.release(p.bytes);
        }
      }
      for (const auto& [s, g] : out) accumulate(grads, s, g);
    }
  }

 private:
  void accumulate(std::map<int, int>& grads, int slot, int g) {
    auto it = grads.find(slot);
    if (slot < 0) {
      unref(g);
    } else if (it == grads.end()) {
      grads[slot] = g;
    } else if (leaves_.count(slot)) {
      unref(g);  // added in place into the leaf's gradient
    } else {
      const int sum = alloc(bytes(g));
      unref(it->second);
      unref(g);
      it->second = sum;
    }
  }

  struct Storage {
    int64_t bytes;
    int refs;
    int base = -1;
    bool strided = false;
  };
  struct Node {
    std::vector<int> outs;
    std::vector<int> saved;
    Fn fn;
  };
  struct ParamTemp {
    int64_t bytes, full;
  };
  Counter& m_;
  std::vector<Storage> store_;
  std::vector<Node> nodes_;
  std::vector<ParamTemp> params_;
  std::set<int> leaves_;
  int nextSlot_ = 0;
};

// A differentiable value: its gradient slot and its storage.
struct Val {
  int slot = -1;
  int h = -1;
};

// The taped ops (tape.cpp); each returns its output's value.
Val tapedLayerNorm(Tape& t, const Val& x, int64_t rows, int64_t ch, int64_t es, bool contig);
Val tapedView(Tape& t, const Val& x, int64_t gradBytes);
Val tapedElementwise(Tape& t, const Val& x, bool savesOutput);
Val tapedAdd(Tape& t, const Val& a, const Val& b, int64_t bytes);
Val tapedRegion(Tape& t, const std::vector<Val>& in, int64_t outBytes, int64_t extent,
                int64_t chunk, const std::function<int64_t(int64_t, int64_t)>& forward,
                const std::function<Val(const std::vector<Val>&, int64_t, int64_t)>& taped,
                const std::function<bool(int64_t, int64_t)>& strided);

}  // namespace sb::strategies::chunking::estimator
