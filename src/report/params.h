// `loom params`: a table like Flax's Module.tabulate — one row per module (a scope that owns
// parameters), with its output shape/dtype and its parameters' shapes, dtypes, counts and bytes.
#pragma once
#include <string>

#include "nn/model.h"

namespace loom::nn {

int64_t count_params(const Graph& g);
std::string summarize(const ModelGraph& m);

}  // namespace loom::nn
