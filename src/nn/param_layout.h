// How parameters are laid out in files. Inside loom every layer has its own parameters
// ("block_3/mlp/input_layer/kernel"). The tutorial runs its blocks under nn.scan, so its
// parameters are stacked per layer: "block/mlp/input_layer/kernel" with a leading
// [num_layers] axis. With model.scan_layers = true loom reads and writes that stacked layout;
// execution is identical either way (loom has no scan, so no scan copies either).
#pragma once
#include <string>
#include <vector>

#include "graph/graph.h"

namespace loom::nn {

struct FileTensor {
  std::string name;             // name in the file
  Shape shape;                  // shape in the file
  std::vector<ValueId> params;  // the parameter values it holds, in layer order (one unless stacked)
};

// Which of a graph's parameters a file holds: all of them, or in a LoRA run (nn/lora.h) the
// trainable adapters (its checkpoints) or the frozen base (what model.init_from provides).
enum class ParamSubset : uint8_t { all, trainable, frozen };
// `all` when every parameter of g trains, else `frozen`: what a starting point provides.
ParamSubset base_subset(const Graph& g);

std::vector<FileTensor> param_file_layout(const Graph& g, bool scan_layers, ParamSubset subset = ParamSubset::all);

}  // namespace loom::nn
