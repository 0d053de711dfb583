#pragma once

// An imported model (import.h) as a chain of stages, the form the checkpointing family
// schedules (reference/chain_nets.h), cut as ColossalAI's linearize cuts a traced graph: after a
// node where one activation alone crosses to the nodes after it. Parameters, buffers and values
// computed from constants alone (a rotary table sliced from a buffer) are not activations: every
// stage reads them. A cut is also not made after a view (view, reshape, transpose, permute,
// split, an aten view such as slice, and a `contiguous` the importer put before a convolution
// only, which the chain runs as the module does, reading the input as it is), nor before a last
// stage of views alone, so that a stage's output is never its input's storage: the chain model
// counts x[i] and x[i+1] as separate bytes.
//
// A residual block is one stage (its input crosses beside the branch until the add); a dense
// block of torchvision's DenseNet is one stage (every earlier feature map crosses to the
// concatenation of the last layer); the layers between blocks are a stage each.
//
// Each stage runs its nodes with reference::opForward on whole tensors, freeing every value
// after its last use inside the stage, as an eager forward frees its temporaries. The chain's
// input x[0] is the model's first input (floats, or ids its first stage embeds); further inputs
// of ids or masks are read by every stage as constants. Its loss is sum(y * target) with target
// the torchscript workload's grad_output, so that the chain's gradients are the module's.
//
// Planted fault (import_fault: cut_where_two_cross): cuts are also made where exactly two
// activations cross; the one the chain does not carry reaches its stage beside the chain,
// detached, as a linearisation that ignores it would leave it, and its gradient is lost.

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "reference/chain_nets.h"
#include "reference/graph.h"

namespace sb::reference::torchscript {

struct ChainStage {
  std::string name;  // the modules its nodes belong to ("layer1.0", or "avgpool..fc")
  // The graph nodes it runs, in graph order: its activation nodes and the parameter-derived
  // nodes they read (a tied weight's transpose), which every stage reading them recomputes.
  std::vector<int> nodes;
  std::string input, output;
  // Only under the planted fault: values crossing into this stage beside the chain.
  std::vector<std::string> sideInputs;
};

// The stages of `g` from its one activation input `input` (a data input of the graph) to its
// output. `constants` are the graph inputs that are not activations (buffers, folded tensors).
// `cutWhereTwoCross` is the planted fault. Never empty: a graph with no cut is one stage.
std::vector<ChainStage> linearize(const Graph& g, const std::string& input,
                                  const std::vector<std::string>& constants,
                                  bool cutWhereTwoCross = false);

struct ImportedModel;
struct ImportSpec;

// Whether the chain's input may be ids: a checkpointed chain differentiates its input, a
// pipeline's first stage reads ids as an embedding does (no gradient to send back).
enum class ChainInput { kFloating, kFloatingOrIds };

// linearize() on an imported model from its first data input; further data inputs of ids or
// masks (a key-padding mask's token ids) are constants every stage reads, as a buffer. Throws
// ImportError, naming the inputs, where a further input is floating (an activation the chain
// would not carry) or, under kFloating, the first is ids.
std::vector<ChainStage> linearizeModel(const ImportedModel& m, bool cutWhereTwoCross = false,
                                       ChainInput in = ChainInput::kFloating);

// Throws ImportError where `spec` cuts the batch into micro-batches (shape key microbatches)
// and `m` takes a second input: the stages read it whole, a micro-batch would need its rows.
void refuseSecondInputOverMicrobatches(const ImportSpec& spec, const ImportedModel& m);

// The imported model of a torchscript case's shape as a chain network, holding `data`'s
// tensors (the torchscript workload's inputs, parameters and grad_output, so that a step of the
// chain computes the module's output and gradients). With the shape's `microbatches` M the
// stages are the graph imported on one micro-batch's rows (its shape constants folded at that
// size): they run on input().chunk(M) one at a time. Throws as linearizeModel, and where M > 1
// and the model takes a second input (a stage reads it whole; a micro-batch would need its rows).
std::unique_ptr<ChainNet> importedChainNet(const nlohmann::json& shape, const WorkloadData& data,
                                           ChainInput in = ChainInput::kFloating);

}  // namespace sb::reference::torchscript
