// model.remat = auto: fitting a training run into a memory budget (README, "Fitting a memory
// budget").
//
// A choice is one LayerRemat per layer (regions and policy, the options below), a minibatch
// count (optimizer.num_minibatches, the global batch kept) and, with model.head_chunk = auto, the
// head: plain, or fused in chunks of vocabulary columns (the candidates below). Its measure is the plan: the total
// `loom memory` prints (parameters, gradients, optimizer state, the arena with its kernel
// workspace, inputs, communication buffers, evaluation), so a returned choice fits by
// construction. The objective is the least recomputed FLOPs (the op table's cost rules over the
// recompute nodes, and the fused head's backward forming its logits again, graph/ops/linear_cross_entropy.h):
// on a CPU the step time is the GEMMs' time, and recompute adds FLOPs at the
// same GEMM rate, so FLOPs rank choices as step time does without a timing model that a busy
// machine would skew; of multisets of equal FLOPs (below) the first the search finds wins, and
// between head chunks the larger chunk (fewer, larger products; every chunk recomputes the same
// FLOPs). Fewer minibatches come first: a
// minibatch count above the configured one is tried only when no remat and head choice fits.
//
// The search: layers are identical, so recomputed FLOPs depend only on how many layers take each
// option (a multiset), over the options no other beats in FLOPs, bytes and saved bytes (the
// levels; levels() measures them at one sequence a rank in one minibatch, so every batch and
// minibatch count searches the same options); each multiset is laid out with the heavier options
// on the earlier layers (their saved activations are live longest) and, when that does not fit,
// on the later ones (a peak late in the step, as a fused head's backward puts it, can favour
// that). Other orders are not tried: with a fused head on 3 layers a mixed order can fit a budget
// neither does (test_fit.cpp compares with exhaustive search over every order on 2 layers there).
// A branch and bound finds the multiset of least FLOPs whose lower bound (lower_bound: buffers
// live at one step, measured per option on one plan of a model of at most 3 layers) fits the
// budget in either layout; it is planned in full, and is the answer if it fits, else it is
// excluded and the search runs again. So every multiset of fewer FLOPs is ruled out by a bound or
// a plan: the answer is proven least for its minibatch count, and its total is a plan's.
// Accumulating over minibatches can plan the same layers larger than one minibatch of that size
// (a wider weight-gradient workspace, the arena placed around it), so at one budget one minibatch
// may fit layers that recompute less than those chosen for more, never the reverse (test_fit.cpp
// checks it on real shapes). Past 64 multisets planned (the search then trusts the bound plus the
// least gap between a plan and its bound seen, for 64 more) or 4 million branch-and-bound nodes, or with a plan below
// its bound (the bound would be wrong for this model), the answer still fits but is not proven least;
// so is a single option on every layer outside the levels, the last resort (smallest()). That search runs once per head
// candidate (the head moves the peak), the least FLOPs over them wins, and a candidate whose own recompute (the fused
// head's, with no layer remat) is no less than the best found is skipped.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "nn/config.h"
#include "train/config.h"

namespace loom {

class Backend;

// "24GiB", "512MiB", "3.5GB", "1000000" -> bytes. Throws UserError naming `what`.
int64_t parse_bytes(const std::string& text, const std::string& what);

// One choice and its plan.
struct FitChoice {
  std::vector<LayerRemat> layers;  // one per layer
  int64_t num_minibatches = 1;
  int64_t head_chunk = 0;      // model.head_chunk: 0 the plain head
  int64_t total_bytes = 0;     // the plan's total, as `loom memory` prints it
  int64_t fixed_bytes = 0;     // parameters, gradients, optimizer state, inputs, library and other buffers, evaluation
  int64_t arena_bytes = 0;     // activations and the kernel workspace
  double recompute_flops = 0;  // per step, all minibatches
  double step_flops = 0;       // forward and backward per step without recompute
  bool proven_least = true;    // false: the search could not prove it least (Fitter::fit_layers)
};

// Runs of equal layers in layer order: "12×Block/nothing_saveable, 36×none".
std::string describe_layers(const std::vector<LayerRemat>& layers);
// "plain" or "8192 columns": the head of a choice.
std::string describe_head(int64_t head_chunk);
// "12×Block/nothing_saveable, 36×none in 2 minibatches, head 8192 columns".
std::string describe_choice(const FitChoice& f);

class Fitter {
 public:
  // Plans `c`'s training program for one rank of `ranks` with the kernel workspace of c.device.
  explicit Fitter(const Config& c, int ranks = 1);

  // The options a layer may take, `none` first.
  const std::vector<LayerRemat>& options() const { return options_; }
  int64_t num_layers() const { return num_layers_; }
  // The heads to try, model.head_chunk's value alone unless it is auto: then the plain head (0)
  // and chunks of the largest power of two <= V/4 and a quarter of that columns, descending.
  const std::vector<int64_t>& head_chunks() const { return head_chunks_; }
  // The levels the search takes a layer's option from with a head: indices into options(), by
  // recomputed FLOPs ascending; measured at one sequence a rank in one minibatch, so the same at
  // every batch and minibatch count.
  std::vector<size_t> levels(int64_t head_chunk);
  // The minibatch counts to try, ascending from the configured one (each divides the batch).
  std::vector<int64_t> minibatch_counts() const;
  // The exact plan of a choice (one full build and plan, remembered).
  FitChoice plan(const std::vector<LayerRemat>& layers, int64_t num_minibatches, int64_t head_chunk);
  // The least-recompute choice whose plan totals at most `budget`; when none does, a UserError
  // naming `budget_key` (where the budget came from), the least total of any plan made (one that
  // fits) and what dominates it.
  FitChoice fit(int64_t budget, const std::string& budget_key = "train.memory_budget");
  // The least-recompute choice at each of `steps` + 1 budgets evenly spaced from the no-remat plan
  // down to smallest() (`loom memory --fit`), with the time and the full plans each fit took.
  struct FitPoint {
    int64_t budget = 0;
    FitChoice choice;
    double seconds = 0;
    int plans = 0;
  };
  std::vector<FitPoint> frontier(int steps = 8);
  // The smallest total of any one option on every layer, with any head, at the most minibatches.
  FitChoice smallest();
  // Full plans made so far.
  int plans_made() const { return plans_; }
  // A total no plan of `layers` is below (the search discards a layout whose bound exceeds the
  // budget without planning it): the fixed part plus, as the arena, the larger of the bytes live
  // at the head's backward (every layer's saved activations and the head's) and, for each layer j,
  // at its own backward (the saved activations of the layers before it, less the previous
  // layer's output, which j's backward may free, and j's own). Each term is a set of buffers live
  // at one step, so no allocator fits them in fewer bytes.
  int64_t lower_bound(const std::vector<LayerRemat>& layers, int64_t num_minibatches, int64_t head_chunk);

  // `c` with the choice applied (model.remat_layers, optimizer.num_minibatches, model.head_chunk).
  Config apply(const FitChoice& f) const;

 private:
  Config c_;
  int ranks_;
  int64_t num_layers_;
  std::vector<LayerRemat> options_;
  std::vector<int64_t> head_chunks_;
  int plans_ = 0;
  std::map<std::tuple<std::string, int64_t, int64_t>, FitChoice> plans_by_choice_;
  std::shared_ptr<Backend> be_;  // c.device's, for the kernels' workspace sizes
  // Per minibatch count and head, measured on the uniform plans of a model of at most 3 layers
  // (layers are identical: what one layer adds carries over to any depth and any neighbours).
  struct Calibration {
    // Per option: recomputed FLOPs and bytes added per layer, relative to none (the search's order).
    std::vector<std::pair<double, double>> increments;
    // Per option and position (the first layer, the ones between, the last), for lower_bound: the
    // bytes of a layer's activations live after the forward and before any layer's backward (its
    // saved activations), of those the ones nodes outside the layer read (its output), and the most
    // of its own activations and kernel workspace, with those outside the layers, live at a step of
    // its own backward or recompute.
    std::vector<std::array<int64_t, 3>> saved, output, own_backward;
    // The most bytes of activations and workspace outside the layers live at one step between the
    // last layer's forward and the first layer's backward (the head and the loss), at least under
    // every option; -1: the program has no such steps and no layers (no bound but the fixed part).
    int64_t head = -1;
    std::vector<int64_t> head_steps;  // per step of the head, the least so far (measure)
    int64_t fixed = 0;                // the deep model's total less its arena and the evaluator's arena
  };
  std::map<std::pair<int64_t, int64_t>, Calibration> calibration_;
  std::map<int64_t, std::vector<size_t>> levels_;  // per head, when measured on another Fitter
  const Calibration& calibrate(int64_t num_minibatches, int64_t head_chunk);
  // lower_bound of the layers taking options()[opt[i]].
  static int64_t bound_of(const Calibration& cal, const std::vector<size_t>& opt);
  // The plan of a choice without the cache; `cal`, when given, receives that plan's live-bytes
  // structure for one option on every layer (saved, output, own_backward at [option], head).
  FitChoice measure(const std::vector<LayerRemat>& layers, int64_t num_minibatches, int64_t head_chunk,
                    Calibration* cal, size_t option);
  // Per minibatch count and head: the evaluator's arena and inputs (no remat changes the forward).
  std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>> eval_bytes_;
  // The least-recompute layers for one minibatch count and head, or an empty choice (no layers)
  // when none fits; `proven` is cleared when the search could not prove its answer least (or,
  // with no layers, that nothing fits).
  FitChoice fit_layers(int64_t budget, int64_t num_minibatches, int64_t head_chunk, bool& proven);
};

// The budget `loom train` fits model.remat = auto into: train.memory_budget, else the memory the
// backend reports available divided among the ranks on this machine (-1: unknown).
int64_t fit_budget(const Config& c, int64_t available, int ranks_on_host);

}  // namespace loom
