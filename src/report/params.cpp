#include "report/params.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <vector>

#include "core/format.h"

namespace loom::nn {

namespace {
std::string desc(const Value& v) { return fmt::format("{}{}", dtype_name(v.dtype), v.shape.str()); }
}  // namespace

int64_t count_params(const Graph& g) {
  int64_t n = 0;
  for (const Param& p : g.params()) n += g.value(p.value).shape.numel();
  return n;
}

std::string summarize(const ModelGraph& m) {
  const Graph& g = m.graph;
  struct Row {
    std::string path;
    std::vector<ValueId> params;
    ValueId output = kNoValue;
  };
  // Modules in order of first parameter creation; a module's output is the last forward output
  // produced inside its scope.
  std::vector<Row> rows;
  std::map<std::string, size_t> index;
  for (const Param& p : g.params()) {
    const std::string& name = g.value(p.value).name;
    const std::string mod = name.substr(0, name.rfind('/'));
    if (!index.count(mod)) {
      index[mod] = rows.size();
      rows.push_back(Row{mod, {}, kNoValue});
    }
    rows[index[mod]].params.push_back(p.value);
  }
  for (const Node& n : g.nodes()) {
    if (n.phase != Phase::forward || n.out.empty()) continue;
    for (Row& r : rows)
      if (n.scope == r.path || n.scope.rfind(r.path + "/", 0) == 0) r.output = n.out[0];
  }
  std::vector<std::array<std::string, 4>> table;
  table.push_back({"path", "outputs", "params", "count (bytes)"});
  table.push_back({"", fmt::format("inputs: {}", desc(g.value(m.inputs))), "", ""});
  table[1][0] = m.name;
  table[1][1] += fmt::format("  ->  {}", desc(g.value(m.output)));
  int64_t total = 0, total_bytes = 0;
  for (const Row& r : rows) {
    std::vector<ValueId> ps = r.params;
    std::sort(ps.begin(), ps.end(), [&](ValueId a, ValueId b) { return g.value(a).name < g.value(b).name; });
    int64_t n = 0, bytes = 0;
    std::string plist;
    for (ValueId p : ps) {
      const Value& v = g.value(p);
      plist += fmt::format("{}{}: {}", plist.empty() ? "" : "  ", v.name.substr(v.name.rfind('/') + 1), desc(v));
      n += v.shape.numel();
      bytes += v.bytes();
    }
    total += n;
    total_bytes += bytes;
    table.push_back({r.path, r.output == kNoValue ? "" : desc(g.value(r.output)), plist,
                     fmt::format("{} ({})", format_count(n), format_bytes(bytes))});
  }
  table.push_back({"", "", "Total", fmt::format("{} ({})", format_count(total), format_bytes(total_bytes))});
  std::array<size_t, 4> w{};
  for (const auto& row : table)
    for (size_t i = 0; i < 4; ++i) w[i] = std::max(w[i], row[i].size());
  std::string out;
  auto line = [&](const std::array<std::string, 4>& row) {
    out += fmt::format("{:<{}}  {:<{}}  {:<{}}  {:>{}}\n", row[0], w[0], row[1], w[1], row[2], w[2], row[3], w[3]);
  };
  line(table[0]);
  out += fmt::format("{}  {}  {}  {}\n", std::string(w[0], '-'), std::string(w[1], '-'), std::string(w[2], '-'),
                     std::string(w[3], '-'));
  for (size_t i = 1; i < table.size(); ++i) {
    if (i + 1 == table.size()) out += fmt::format("{}\n", std::string(w[0] + w[1] + w[2] + w[3] + 6, '-'));
    line(table[i]);
  }
  out += fmt::format("\nTotal parameters: {} ({})\n", format_count(total), format_bytes(total_bytes));
  return out;
}

}  // namespace loom::nn
