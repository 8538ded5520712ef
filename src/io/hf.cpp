#include "io/hf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "core/error.h"
#include "core/quant.h"
#include "core/quant_columns.h"
#include "nn/models/hf_arch.h"

namespace loom {

namespace {

namespace fs = std::filesystem;

nlohmann::json read_json(const std::string& path, const std::string& fix) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UserError(path, "cannot be opened", fix);
  const std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(path, std::string("is not valid JSON (") + e.what() + ")", fix);
  }
}

// The rows of one Hugging Face tensor as its layout walks them (for_each_run's r0, r1): each row's
// values map to loom's parameter independently of the others', so rows can be converted apart.
int64_t hf_rows(const nn::HfParam& p, const nn::HfModelMap& m) {
  switch (p.layout) {
    case nn::HfLayout::same:
      return p.hf_shape.rank >= 2 ? p.hf_shape[0] : 1;
    case nn::HfLayout::qkv_columns:
      return p.hf_shape.numel() / (3 * m.heads * m.head_dim);
    case nn::HfLayout::transposed:
    case nn::HfLayout::qkv_rows:
      return p.hf_shape[0];
  }
  return 1;
}

// Where rows [r0, r1) of one Hugging Face tensor's values sit in loom's parameter
// (nn/models/hf_arch.h's layouts): run(hf_offset, loom_offset, n) for each run of n consecutive
// floats in both, in element offsets into p.hf_shape and p.shape. A transposed tensor's runs come
// in loom's order, so that consecutive ones are consecutive in loom.
template <class Run>
void for_each_run(const nn::HfParam& p, const nn::HfModelMap& m, int64_t r0, int64_t r1, Run&& run) {
  const int64_t D = m.head_dim, n = p.hf_shape.numel(), w = n / std::max<int64_t>(1, hf_rows(p, m));
  switch (p.layout) {
    case nn::HfLayout::same:
      run(r0 * w, r0 * w, (r1 - r0) * w);
      return;
    case nn::HfLayout::qkv_columns: {  // rows of (3, H, D) <-> rows of (H, 3, D)
      const int64_t H = m.heads, C = H * D;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t s = 0; s < 3; ++s)
          for (int64_t h = 0; h < H; ++h) run(r * 3 * C + s * C + h * D, r * 3 * C + h * 3 * D + s * D, D);
      return;
    }
    case nn::HfLayout::transposed: {  // hf [a, b] <-> loom [b, a]
      const int64_t a = p.hf_shape[0], b = n / a;
      for (int64_t k = 0; k < b; ++k)
        for (int64_t i = r0; i < r1; ++i) run(i * b + k, k * a + i, 1);
      return;
    }
    case nn::HfLayout::qkv_rows: {  // hf row (j·slots + s)·D + d <-> loom [c, j, (slot + s)·D + d]
      const int64_t C = p.hf_shape.rank == 2 ? p.hf_shape[1] : 1, width = p.shape.numel() / C,
                    per_head = width / m.kv_heads;
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t col = r / (p.slots * D) * per_head + p.slot * D + r % (p.slots * D);
        for (int64_t c = 0; c < C; ++c) run(r * C + c, c * width + col, 1);
      }
      return;
    }
  }
}
template <class Run>
void for_each_run(const nn::HfParam& p, const nn::HfModelMap& m, Run&& run) {
  for_each_run(p, m, 0, hf_rows(p, m), run);
}

void check_float(DType dt, const std::string& name, const std::string& source) {
  if (dt != DType::f32 && dt != DType::bf16 && dt != DType::f16)
    throw UserError(source, "tensor '" + name + "' is " + dtype_name(dt) + ", not a float",
                    "save the checkpoint in float32, bfloat16 or float16");
}

// `t`'s values as float32 (float32, bfloat16 and float16 files).
std::vector<float> to_f32(const StTensor& t, const std::string& source) {
  check_float(t.dtype, t.name, source);
  std::vector<float> v(static_cast<size_t>(t.shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_f32(t.bytes.data(), t.dtype, i);
  return v;
}

}  // namespace

bool is_hf_model_dir(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / "config.json", ec);
}

HfConfig read_hf_config(const std::string& dir) {
  HfConfig out;
  out.path = (fs::path(dir) / "config.json").string();
  const nlohmann::json j = read_json(out.path, "give a Hugging Face model directory (config.json, model.safetensors)");
  if (!j.is_object()) throw UserError(out.path, "is not a JSON object", "use the config.json transformers wrote");
  std::string type = j.value("model_type", "");
  if (auto a = j.find("architectures"); a != j.end() && a->is_array() && !a->empty() && (*a)[0].is_string())
    out.architecture = (*a)[0].get<std::string>();
  const nn::HfArchitecture* arch = nn::find_hf_architecture(type, out.architecture);
  if (arch) {
    out.architecture = arch->architecture;
    arch->read_config(nn::HfConfigJson(j, out.path, &out.absent), out.model, out.keys);
    return out;
  }
  const std::string what = out.architecture.empty() ? "model_type \"" + type + "\"" : out.architecture;
  std::string fix = "loom imports ";
  const auto rows = nn::hf_architectures();
  for (size_t i = 0; i < rows.size(); ++i)
    fix += std::string(i == 0 ? "" : i + 1 == rows.size() ? " and " : ", ") + std::string(rows[i]->listed_as);
  fix += " checkpoints";
  if (const std::string_view why = nn::hf_near_miss(type); !why.empty())
    throw UserError(out.path, what + " " + std::string(why), fix);
  throw UserError(out.path, what + " is not an architecture loom can run", fix);
}

nlohmann::json hf_config_json(const ModelConfig& c, int32_t bos_id, int32_t eos_id) {
  const nn::HfArchitecture& arch = nn::hf_architecture_of(c);
  nlohmann::json j = arch.write_config(c, arch.tensor_map(c));
  // null, not absent: the config classes' defaults (GPT-2's 50256, Llama's 1 and 2) may be outside
  // the vocabulary or mean other tokens.
  j["bos_token_id"] = bos_id >= 0 ? nlohmann::json(bos_id) : nlohmann::json(nullptr);
  j["eos_token_id"] = eos_id >= 0 ? nlohmann::json(eos_id) : nlohmann::json(nullptr);
  return j;
}

namespace {

// The tensors of dir/model.safetensors, or of the shards its index lists, each file read by
// read(path) (a vector of things with a name): read_hf_tensors' files and checks.
template <class Read>
auto read_hf_files(const std::string& dir, std::string* file, Read&& read) {
  const fs::path single = fs::path(dir) / "model.safetensors", index = fs::path(dir) / "model.safetensors.index.json";
  std::error_code ec;
  const bool one = fs::is_regular_file(single, ec);
  if (file) *file = (one ? single : index).string();
  if (one) return read(single.string());
  if (!fs::is_regular_file(index, ec))
    throw UserError(dir, "has neither model.safetensors nor model.safetensors.index.json",
                    "loom reads safetensors checkpoints; convert a pytorch_model.bin with transformers' "
                    "save_pretrained(DIR, safe_serialization=True)");
  const std::string fix = "use the index and shards save_pretrained wrote, complete";
  const nlohmann::json j = read_json(index.string(), fix);
  auto wm = j.find("weight_map");
  if (!j.is_object() || wm == j.end() || !wm->is_object() || wm->empty())
    throw UserError(index.string(), "has no \"weight_map\" object", fix);
  std::map<std::string, std::vector<std::string>> by_shard;  // shard file -> the tensors it should hold
  for (const auto& [name, shard] : wm->items()) {
    if (!shard.is_string() || shard.template get<std::string>().find('/') != std::string::npos)
      throw UserError(index.string(), "the shard of tensor '" + name + "' is not a file name in the directory", fix);
    by_shard[shard.template get<std::string>()].push_back(name);
  }
  decltype(read(single.string())) out;
  for (const auto& [shard, names] : by_shard) {
    const std::string path = (fs::path(dir) / shard).string();
    auto ts = read(path);
    std::set<std::string> held;
    for (const auto& t : ts) held.insert(t.name);
    for (const std::string& n : names)
      if (!held.count(n))
        throw UserError(path, "does not hold tensor '" + n + "', which " + index.filename().string() + " puts there",
                        fix);
    for (auto& t : ts) out.push_back(std::move(t));
  }
  return out;
}

// A tensor config.json's model lacks, misses or shapes otherwise: what a key config.json leaves to
// its config class's default can cause (match_hf below).
struct HfMapMismatch : UserError {
  using UserError::UserError;
};

// Which file tensor is which parameter of the map: `found` by HfParam::hf_name, and a tied
// model's lm_head.weight. T has name, dtype and shape (StTensor, HfEntry). A missing, extra or
// misshapen tensor is an HfMapMismatch, a doubled or non-float one a UserError, naming `source`.
template <class T>
struct HfMatch {
  std::map<std::string, const T*> found;
  const T* tied_head = nullptr;
};
template <class T>
HfMatch<T> match_hf(const nn::HfModelMap& map, const std::vector<T>& hf, const std::string& source) {
  const std::string fix = "the checkpoint must hold exactly the parameters its config.json describes";
  std::map<std::string, const nn::HfParam*> expected;
  for (const nn::HfParam& p : map.params) expected[p.hf_name] = &p;
  HfMatch<T> m;
  for (const T& t : hf) {
    if (map.is_buffer && map.is_buffer(t.name)) continue;
    if (t.name == "lm_head.weight" && !expected.count(t.name)) {
      m.tied_head = &t;
      continue;
    }
    // Files written from the base model class (GPT2Model: the original GPT-2 hub checkpoint) lack
    // the prefix.
    const std::string name =
        expected.count(t.name) || !expected.count(map.prefix + t.name) ? t.name : map.prefix + t.name;
    if (!expected.count(name))
      throw HfMapMismatch(
          source, "tensor '" + t.name + "' is not a parameter of " + map.architecture + " as config.json has it", fix);
    if (!m.found.emplace(name, &t).second)
      throw UserError(source, "tensor '" + name + "' is there twice (with and without '" + map.prefix + "')", fix);
  }
  for (const nn::HfParam& p : map.params) {
    LOOM_ASSERT(!p.path.empty(), "hf_to_loom: a model from config.json has every bias its architecture has");
    auto it = m.found.find(p.hf_name);
    if (it == m.found.end()) throw HfMapMismatch(source, "tensor '" + p.hf_name + "' is missing", fix);
    if (it->second->shape != p.hf_shape)
      throw HfMapMismatch(source,
                          "tensor '" + p.hf_name + "' is " + it->second->shape.str() + "; config.json's model needs " +
                              p.hf_shape.str(),
                          fix);
    check_float(it->second->dtype, p.hf_name, source);
  }
  if (m.tied_head) check_float(m.tied_head->dtype, m.tied_head->name, source);
  return m;
}

// match_hf, where a mismatch also names the keys dir/config.json lacks, when it lacks any: their
// config class's defaults decided the tensors the model needs, so a default that is not the
// model's shows as a mismatch; a file cut short shows the same way, so the tensor stays named first.
template <class T>
HfMatch<T> match_hf(const nn::HfModelMap& map, const std::vector<T>& hf, const std::string& source,
                    const std::string& dir) {
  try {
    return match_hf(map, hf, source);
  } catch (const HfMapMismatch& e) {
    if (!is_hf_model_dir(dir)) throw;
    const HfConfig c = read_hf_config(dir);
    if (c.absent.empty()) throw;
    std::string keys, values;
    for (const auto& [key, value] : c.absent) {
      keys += (keys.empty() ? "\"" : ", \"") + key + "\"";
      values += (values.empty() ? "" : ", ") + key + " = " + value;
    }
    const std::string what = e.what(), problem = e.subject().empty() ? what : what.substr(e.subject().size() + 2);
    throw UserError(
        e.subject(),
        problem + "; " + c.path + " lacks " + keys + ", read as " + c.architecture + "'s defaults (" + values + ")",
        "if those defaults are not the model's, add the missing keys with the values it was trained with "
        "(transformers writes them all); otherwise " +
            e.hint());
  }
}

[[noreturn]] void untied_head(const nn::HfModelMap& map, const std::string& source) {
  throw UserError(source,
                  "tensor 'lm_head.weight' differs from '" + map.params.front().hf_name + "', but config.json ties them",
                  "set tie_word_embeddings as the checkpoint was trained");
}

}  // namespace

std::vector<StTensor> read_hf_tensors(const std::string& dir, std::string* file) {
  return read_hf_files(dir, file, [](const std::string& path) { return read_safetensors(path); });
}

std::vector<StTensor> hf_to_loom(const ModelConfig& c, const std::vector<StTensor>& hf, const std::string& source) {
  const nn::HfModelMap map = nn::hf_model_map(c);
  const HfMatch<StTensor> m = match_hf(map, hf, source, fs::path(source).parent_path().string());
  std::vector<StTensor> out;  // in the order of their first tensor in the map
  std::map<std::string, size_t> index;
  for (const nn::HfParam& p : map.params) {
    const std::vector<float> v = to_f32(*m.found.at(p.hf_name), source);
    if (auto [at, added] = index.emplace(p.path, out.size()); added)
      out.push_back(
          {p.path, DType::f32, p.shape, std::vector<unsigned char>(static_cast<size_t>(p.shape.numel()) * 4)});
    auto* dst = reinterpret_cast<float*>(out[index.at(p.path)].bytes.data());
    for_each_run(p, map, [&](int64_t h, int64_t l, int64_t n) {
      std::memcpy(dst + l, v.data() + h, static_cast<size_t>(n) * 4);
    });
  }
  if (m.tied_head) {  // it must be the embedding (transformers would tie it and drop its values)
    const std::vector<float> head = to_f32(*m.tied_head, source);
    const StTensor& table = out[index.at("embed/embedding")];
    if (m.tied_head->shape != table.shape || std::memcmp(head.data(), table.bytes.data(), table.bytes.size()) != 0)
      untied_head(map, source);
  }
  return out;
}

std::vector<StTensor> loom_to_hf(const ModelConfig& c, const std::map<std::string, const StTensor*>& loom) {
  const nn::HfModelMap map = nn::hf_model_map(c);
  std::vector<StTensor> out;
  out.reserve(map.params.size());
  for (const nn::HfParam& p : map.params) {
    out.push_back(
        {p.hf_name, DType::f32, p.hf_shape, std::vector<unsigned char>(static_cast<size_t>(p.hf_shape.numel()) * 4)});
    if (p.path.empty()) continue;  // a bias the model lacks: zero
    auto it = loom.find(p.path);
    // The same row-major values: a quantized LoRA base kernel is stored as its [K, N] product.
    LOOM_ASSERT(it != loom.end() && it->second->dtype == DType::f32 && it->second->shape.numel() == p.shape.numel(),
                "loom_to_hf: parameter '" + p.path + "' is missing or misshapen");
    const auto* src = reinterpret_cast<const float*>(it->second->bytes.data());
    auto* dst = reinterpret_cast<float*>(out.back().bytes.data());
    for_each_run(p, map,
                 [&](int64_t h, int64_t l, int64_t n) { std::memcpy(dst + h, src + l, static_cast<size_t>(n) * 4); });
  }
  return out;
}

namespace {

// A tensor of a Hugging Face file, located and checked (scan_safetensors) but not read.
struct HfEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  StEntry st;
  std::string file;
};

// One Hugging Face tensor that fills (part of) a loom parameter.
struct HfSource {
  const nn::HfParam* p;
  const HfEntry* e;
  int64_t rows() const { return hf_rows(*p, map); }
  const nn::HfModelMap& map;
};

// Rows [r0, r1) of s's tensor as float32 in vals, read through raw: to_f32's values. `progress`
// (when given) before the read.
void read_rows(const HfSource& s, int64_t r0, int64_t r1, std::vector<unsigned char>& raw, std::vector<float>& vals,
               const std::function<void()>& progress) {
  if (progress) progress();
  const int64_t w = s.p->hf_shape.numel() / std::max<int64_t>(1, s.rows());
  const size_t es = dtype_size(s.e->dtype), n = static_cast<size_t>((r1 - r0) * w);
  raw.resize(n * es);
  vals.resize(n);
  read_safetensors_range(s.e->file, s.e->st, static_cast<uint64_t>(r0 * w) * es, n * es, raw.data());
  for (size_t i = 0; i < n; ++i) vals[i] = load_as_f32(raw.data(), s.e->dtype, i);
}

// Rows per read of s's tensor: about `slice` values, at least one row.
int64_t rows_per_read(const HfSource& s, int64_t slice) {
  return std::max<int64_t>(1, slice / std::max<int64_t>(1, s.p->hf_shape.numel() / std::max<int64_t>(1, s.rows())));
}

// The rows of s that `reaches` in reads of at most `most` consecutive rows (into raw and vals, as
// read_rows, `progress` before each), each followed by take(r0, r1) with the rows it read.
template <class Reaches, class Take>
void read_reaching_rows(const HfSource& s, int64_t most, Reaches&& reaches, std::vector<unsigned char>& raw,
                        std::vector<float>& vals, const std::function<void()>& progress, Take&& take) {
  for (int64_t r = 0, rows = s.rows(); r < rows;) {
    if (!reaches(r)) {
      ++r;
      continue;
    }
    const int64_t r0 = r;
    while (r < rows && r - r0 < most && reaches(r)) ++r;
    read_rows(s, r0, r, raw, vals, progress);
    take(r0, r);
  }
}

// The elements sink.keep(v) of parameter v (stored unquantized) from its sources, in reads of
// about `slice` values, each handed to the sink a run of consecutive loom values at a time. Only
// the rows of a source that reach the kept elements are read: a slice of a row-major or
// column-permuted (GPT-2's c_attn) tensor reads about its share of the file; a transposed or
// q/k/v-packed one (Llama's) spreads every row over the whole parameter, so it is read whole, a
// slice at a time. `progress` before every read.
void load_plain(const ParamSink& sink, ValueId v, const std::vector<HfSource>& srcs, int64_t slice,
                const std::function<void()>& progress) {
  const auto [k0, k1] = sink.keep(v);
  std::vector<unsigned char> raw;
  std::vector<float> vals, run;  // run: the pending loom values [at, at + run.size())
  int64_t at = 0;
  auto put = [&](const float* x, size_t n, int64_t to) { sink.store(v, to, x, n); };
  auto flush = [&] {
    if (!run.empty()) put(run.data(), run.size(), at);
    run.clear();
  };
  for (const HfSource& s : srcs) {
    const int64_t rows = s.rows(), step = rows_per_read(s, slice),
                  w = s.p->hf_shape.numel() / std::max<int64_t>(1, rows);
    const bool all = k0 == 0 && k1 == s.p->shape.numel();
    run.reserve(static_cast<size_t>(std::min(rows, step) * w));  // one read's values at most, held exactly
    auto reaches = [&](int64_t r) {
      bool hit = all;
      if (!hit)
        for_each_run(*s.p, s.map, r, r + 1,
                     [&](int64_t, int64_t l, int64_t n) { hit = hit || (l < k1 && l + n > k0); });
      return hit;
    };
    read_reaching_rows(s, step, reaches, raw, vals, progress, [&](int64_t r0, int64_t r1) {
      for_each_run(*s.p, s.map, r0, r1, [&](int64_t h, int64_t l, int64_t n) {
        const int64_t lo = std::max(l, k0), hi = std::min(l + n, k1);  // the kept part of the run
        if (lo >= hi) return;
        h += lo - l - r0 * w;  // into vals
        l = lo;
        n = hi - lo;
        if (l != at + static_cast<int64_t>(run.size())) flush();
        if (run.empty() && n > 1) {  // a run that is one in both: straight from vals
          put(vals.data() + h, static_cast<size_t>(n), l);
          at = l + n;
          return;
        }
        if (run.empty()) at = l;
        run.insert(run.end(), vals.begin() + h, vals.begin() + h + n);
      });
      flush();
    });
  }
}

// Quantized kernel v [K, N] from its sources, as init_param_in draws one: slabs of whole columns
// (about `slice` values), each quantized into one host copy of the stored bytes, reading only the
// rows of the sources that reach the slab; `progress` before every read.
void load_quantized(Executor& ex, ValueId v, const std::vector<HfSource>& srcs, int64_t slice,
                    const std::function<void()>& progress) {
  const Value& val = ex.graph().value(v);
  const int64_t K = val.shape[0], N = val.shape[1], step = K > 0 ? quant_column_step(val.dtype, K) : 1;
  const int64_t cols = std::max<int64_t>(1, slice / std::max<int64_t>(1, K * step)) * step;
  // The loom columns each source row reaches, [first, last].
  std::vector<std::vector<std::pair<int64_t, int64_t>>> span(srcs.size());
  for (size_t i = 0; i < srcs.size(); ++i) {
    span[i].assign(static_cast<size_t>(srcs[i].rows()), {N, -1});
    for (int64_t r = 0; r < srcs[i].rows(); ++r) {
      auto& [c0, c1] = span[i][static_cast<size_t>(r)];
      for_each_run(*srcs[i].p, srcs[i].map, r, r + 1, [&, N](int64_t, int64_t l, int64_t n) {
        const int64_t a = l % N, b = (l + n - 1) % N;
        const bool all = n >= N || b < a;
        c0 = std::min(c0, all ? 0 : a);
        c1 = std::max(c1, all ? N - 1 : b);
      });
    }
  }
  std::vector<unsigned char> stored(static_cast<size_t>(val.bytes())), raw;  // zeroed: nf4's padding
  std::vector<float> wt(static_cast<size_t>(std::min(cols, N) * K)), vals;
  for (int64_t n0 = 0; n0 < N && K > 0; n0 += cols) {
    const int64_t n1 = std::min(N, n0 + cols);
    for (size_t i = 0; i < srcs.size(); ++i) {
      const HfSource& s = srcs[i];
      const int64_t rows = s.rows(), most = rows_per_read(s, slice), w = s.p->hf_shape.numel() / std::max<int64_t>(1, rows);
      auto reaches = [&](int64_t r) {
        const auto [c0, c1] = span[i][static_cast<size_t>(r)];
        return c0 < n1 && c1 >= n0;
      };
      read_reaching_rows(s, most, reaches, raw, vals, progress, [&](int64_t r0, int64_t r1) {
        for_each_run(*s.p, s.map, r0, r1, [&](int64_t h, int64_t l, int64_t n) {
          for (int64_t j = 0; j < n; ++j) {  // W[k, c] is Wᵀ's row c - n0
            const int64_t k = (l + j) / N, c = (l + j) % N;
            if (c >= n0 && c < n1)
              wt[static_cast<size_t>((c - n0) * K + k)] = vals[static_cast<size_t>(h - r0 * w + j)];
          }
        });
      });
    }
    quantize_columns(val.dtype, wt.data(), K, N, n0, n1, stored.data());
  }
  ex.upload(v, stored.data());
}

}  // namespace

void load_hf_params(Executor& ex, const ModelConfig& c, const std::string& dir, nn::ParamSubset subset,
                    std::string* file, int64_t slice, const std::function<void()>& progress) {
  load_hf_params(ex.graph(), executor_sink(ex), c, dir, subset, file, slice, progress);
}

void load_hf_params(const Graph& g, const ParamSink& sink, const ModelConfig& c, const std::string& dir,
                    nn::ParamSubset subset, std::string* file, int64_t slice, const std::function<void()>& progress) {
  std::string source;
  const nn::HfModelMap map = nn::hf_model_map(c);
  // Every rank reads every value here, before any is stored: a NaN or an infinity in a weight is
  // refused by name on all of them alike, not found as a divergence at the first step. Buffers
  // (a causal mask) are not weights.
  const std::vector<HfEntry> hf = read_hf_files(dir, &source, [&map, &progress](const std::string& path) {
    const auto finite = [&map, &path](const StEntry& e, const unsigned char* bytes, size_t n) {
      if (!dtype_is_float(e.dtype) || (map.is_buffer && map.is_buffer(e.name))) return;
      for (size_t i = 0; i < n / dtype_size(e.dtype); ++i)
        if (!std::isfinite(load_as_f32(bytes, e.dtype, i)))
          throw UserError(path, "tensor '" + e.name + "' holds a NaN or an infinity",
                          "the weights are damaged or come from a diverged run: download or export them again");
    };
    std::vector<HfEntry> out;
    for (StEntry& e : scan_safetensors(path, finite, progress))
      out.push_back({.name = e.name, .dtype = e.dtype, .shape = e.shape, .st = e, .file = path});
    return out;
  });
  if (file) *file = source;
  const HfMatch<HfEntry> m = match_hf(map, hf, source, dir);
  if (m.tied_head) {  // it must be the embedding (transformers would tie it and drop its values)
    auto it = std::find_if(map.params.begin(), map.params.end(),
                           [](const nn::HfParam& p) { return p.path == "embed/embedding"; });
    LOOM_ASSERT(it != map.params.end(), "a tied model has an embedding");
    const HfSource head{&*it, m.tied_head, map}, table{&*it, m.found.at(it->hf_name), map};
    if (m.tied_head->shape != table.e->shape) untied_head(map, source);
    std::vector<unsigned char> raw;
    std::vector<float> a, b;
    for (int64_t r0 = 0, step = rows_per_read(table, slice); r0 < table.rows(); r0 += step) {
      const int64_t r1 = std::min(table.rows(), r0 + step);
      read_rows(head, r0, r1, raw, a, progress);
      read_rows(table, r0, r1, raw, b, progress);
      if (std::memcmp(a.data(), b.data(), a.size() * 4) != 0) untied_head(map, source);
    }
  }
  for (const nn::FileTensor& f : nn::param_file_layout(g, /*scan_layers=*/false, subset)) {
    std::vector<HfSource> srcs;
    for (const nn::HfParam& p : map.params)
      if (p.path == f.name) srcs.push_back({&p, m.found.at(p.hf_name), map});
    const ValueId v = f.params.at(0);
    const bool quantized = dtype_is_quantized(g.value(v).dtype);
    if (srcs.empty() || (srcs[0].p->shape != f.shape && !(quantized && srcs[0].p->shape.numel() == f.shape.numel())))
      throw UserError(source, "parameter '" + f.name + "' of the model is not in the checkpoint as " + f.shape.str(),
                      "the file was written for a different model configuration");
    if (quantized) {
      LOOM_ASSERT(sink.ex, "a quantized kernel is loaded whole");
      load_quantized(*sink.ex, v, srcs, slice, progress);
    } else {
      load_plain(sink, v, srcs, slice, progress);
    }
  }
}

}  // namespace loom
