#include "nn/param_layout.h"

#include <algorithm>
#include <map>
#include <stdexcept>

namespace loom::nn {

namespace {
// "block_12/mlp/x" -> (12, "block/mlp/x"); -1 for paths outside a numbered block.
int64_t split_layer(const std::string& path, std::string* stacked) {
  const std::string prefix = "block_";
  if (path.rfind(prefix, 0) != 0) return -1;
  const size_t slash = path.find('/');
  const std::string num =
      path.substr(prefix.size(), slash == std::string::npos ? std::string::npos : slash - prefix.size());
  if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos) return -1;
  *stacked = "block" + (slash == std::string::npos ? std::string() : path.substr(slash));
  return std::stoll(num);
}
}  // namespace

ParamSubset base_subset(const Graph& g) {
  for (const Param& p : g.params())
    if (!p.trainable()) return ParamSubset::frozen;
  return ParamSubset::all;
}

std::vector<FileTensor> param_file_layout(const Graph& g, bool scan_layers, ParamSubset subset) {
  std::vector<FileTensor> out;
  std::map<std::string, size_t> stacked_index;
  std::map<std::string, std::vector<std::pair<int64_t, ValueId>>> layers;
  for (const Param& p : g.params()) {
    if ((subset == ParamSubset::trainable && !p.trainable()) || (subset == ParamSubset::frozen && p.trainable()))
      continue;
    const Value& v = g.value(p.value);
    std::string stacked;
    const int64_t layer = scan_layers ? split_layer(v.name, &stacked) : -1;
    if (layer < 0) {
      out.push_back(FileTensor{.name = v.name, .shape = v.shape, .params = {p.value}});
      continue;
    }
    if (!stacked_index.count(stacked)) {
      stacked_index[stacked] = out.size();
      out.push_back(FileTensor{.name = stacked, .shape = {}, .params = {}});
    }
    layers[stacked].emplace_back(layer, p.value);
  }
  for (auto& [name, ls] : layers) {
    std::sort(ls.begin(), ls.end());
    FileTensor& f = out[stacked_index[name]];
    const Shape per = g.value(ls.front().second).shape;
    f.shape = Shape{static_cast<int64_t>(ls.size())};
    for (int i = 0; i < per.rank; ++i) f.shape.push_back(per[i]);
    for (size_t l = 0; l < ls.size(); ++l) {
      if (ls[l].first != static_cast<int64_t>(l) || g.value(ls[l].second).shape != per)
        throw std::invalid_argument("parameter '" + name + "' is not present with one shape in every layer");
      f.params.push_back(ls[l].second);
    }
  }
  return out;
}

}  // namespace loom::nn
