#include "io/param_io.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "core/quant.h"
#include "core/quant_columns.h"
#include "nn/init.h"
#include "nn/param_layout.h"

namespace loom {

namespace {
// The file layout of g's parameters, which must be float32 masters: a narrowed copy cannot be
// written back as the values it was made from.
std::vector<nn::FileTensor> master_layout(const Graph& g, bool scan_layers, nn::ParamSubset subset) {
  for (const Param& p : g.params())  // a LoRA base stored in bf16, int8 or nf4 is exported widened
    LOOM_ASSERT(g.value(p.value).dtype == DType::f32 || !p.trainable(),
                "parameter '" + g.value(p.value).name + "' is narrowed");
  return nn::param_file_layout(g, scan_layers, subset);
}
}  // namespace

std::vector<StTensor> export_params(const Executor& ex, bool scan_layers, bool grads, const std::string& prefix) {
  const Graph& g = ex.graph();
  std::vector<StTensor> out;
  for (const nn::FileTensor& f :
       master_layout(g, scan_layers, grads ? nn::ParamSubset::trainable : nn::ParamSubset::all)) {
    StTensor t{.name = prefix + f.name,
               .dtype = DType::f32,
               .shape = f.shape,
               .bytes = std::vector<unsigned char>(static_cast<size_t>(f.shape.numel()) * 4)};
    size_t off = 0;
    for (ValueId p : f.params) {
      const ValueId v = grads ? g.grad_of(p) : p;
      const size_t bytes = static_cast<size_t>(g.value(v).shape.numel()) * 4;
      if (g.value(v).dtype == DType::f32)
        ex.download(v, t.bytes.data() + off);
      else  // a LoRA base: the values its dense kernels compute with (lora.base_dtype)
        std::memcpy(t.bytes.data() + off, download_param(ex, v).data(), bytes);
      off += bytes;
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<StSource> param_sources(const Executor& ex, bool scan_layers, const std::string& prefix,
                                    nn::ParamSubset subset) {
  const Graph& g = ex.graph();
  std::vector<StSource> out;
  for (const nn::FileTensor& f : master_layout(g, scan_layers, subset)) {
    // A stacked file tensor is its layers' buffers one after another: map the byte range onto them.
    auto read = [&ex, &g, params = f.params](void* dst, size_t off, size_t n) {
      auto* d = static_cast<unsigned char*>(dst);
      for (ValueId p : params) {
        const auto size = static_cast<size_t>(g.value(p).bytes());
        if (off < size) {
          const size_t k = std::min(n, size - off);
          ex.backend().copy_to_host(d, static_cast<const unsigned char*>(ex.ptr(p)) + off, k);
          d += k;
          n -= k;
          off = 0;
          if (n == 0) return;
        } else {
          off -= size;
        }
      }
    };
    out.push_back({.name = prefix + f.name, .dtype = DType::f32, .shape = f.shape, .read = std::move(read)});
  }
  return out;
}

namespace {
// Calls fn(param, file tensor, byte offset of its values in it) for every parameter of `g`, cut out
// of `tensors` (StTensor or StEntry: held or located) in the file layout; a missing tensor, a wrong
// shape or a non-float32 dtype is a UserError naming `file`.
template <class T, class Fn>
void for_each_param(const Graph& g, const std::map<std::string, const T*>& tensors, bool scan_layers,
                    const std::string& file, const std::string& prefix, Fn&& fn,
                    nn::ParamSubset subset = nn::ParamSubset::all) {
  for (const nn::FileTensor& f : nn::param_file_layout(g, scan_layers, subset)) {
    const std::string name = prefix + f.name;
    auto it = tensors.find(name);
    if (it == tensors.end())
      throw UserError(file, "tensor '" + name + "' is missing",
                      scan_layers ? "the file must hold every parameter, stacked per layer (model.scan_layers = true)"
                                  : "the file must hold every parameter by path (model.scan_layers = false)");
    const T& t = *it->second;
    // A quantized base kernel is its DenseGeneral kernel's [K, N] product (core/quant.h): the same
    // values in the same row-major order.
    const bool product =
        f.params.size() == 1 && dtype_is_quantized(g.value(f.params[0]).dtype) && t.shape.numel() == f.shape.numel();
    if (t.dtype != DType::f32 || (t.shape != f.shape && !product))
      throw UserError(file,
                      "tensor '" + name + "' is " + dtype_name(t.dtype) + t.shape.str() + ", the model needs float32" +
                          f.shape.str(),
                      "the file was written for a different model configuration");
    uint64_t off = 0;  // in the file tensor's bytes
    for (ValueId p : f.params) {
      fn(p, t, off);
      off += static_cast<uint64_t>(g.value(p).shape.numel()) * 4;
    }
  }
}
}  // namespace

void import_params(Executor& ex, const std::map<std::string, const StTensor*>& tensors, bool scan_layers,
                   const std::string& file, const std::string& prefix, nn::ParamSubset subset) {
  for_each_param(
      ex.graph(), tensors, scan_layers, file, prefix,
      [&](ValueId p, const StTensor& t, uint64_t off) {
        upload_param(ex, p, reinterpret_cast<const float*>(t.bytes.data() + off));
      },
      subset);
}

ParamSink executor_sink(Executor& ex) {
  auto scratch = std::make_shared<std::vector<unsigned char>>();  // the rounded bytes between stores
  return {.keep =
              [&ex](ValueId p) {
                return std::pair<int64_t, int64_t>{0, ex.graph().value(p).shape.numel()};
              },
          .store = [&ex, scratch](ValueId p, int64_t at, const float* values,
                                  size_t n) { store_param_values(ex, p, at, values, n, *scratch); },
          .ex = &ex};
}

void import_params(const Graph& g, const ParamSink& sink, const std::map<std::string, const StEntry*>& entries,
                   bool scan_layers, const std::string& file, const std::string& prefix, nn::ParamSubset subset,
                   const std::function<void()>& progress) {
  std::vector<float> buf;
  for_each_param(
      g, entries, scan_layers, file, prefix,
      [&](ValueId p, const StEntry& e, uint64_t off) {
        const Value& v = g.value(p);
        if (dtype_is_quantized(v.dtype)) {  // quantized by columns of the whole kernel
          LOOM_ASSERT(sink.ex, "a quantized kernel is loaded whole");
          std::vector<float> whole(static_cast<size_t>(v.shape.numel()));
          read_safetensors_range(file, e, off, whole.size() * sizeof(float), whole.data());
          upload_param(*sink.ex, p, whole.data());
          return;
        }
        const auto first = static_cast<int64_t>(off / sizeof(float));  // p's first element in e
        const auto [begin, end] = sink.keep(p);
        read_safetensors_f32(
            file, e, first + begin, first + end, buf,
            [&](int64_t at, int64_t n, const float* values) {
              sink.store(p, at - first, values, static_cast<size_t>(n));
            },
            progress);
      },
      subset);
}

void upload_param(Executor& ex, ValueId p, const float* values) {
  const Value& v = ex.graph().value(p);
  LOOM_ASSERT(v.kind == ValueKind::param, "'" + v.name + "' is not a parameter");
  if (v.dtype == DType::f32) {
    ex.upload(p, values);
    return;
  }
  std::vector<unsigned char> narrowed(static_cast<size_t>(v.bytes()));
  if (dtype_is_quantized(v.dtype))
    quantize_kernel(v.dtype, values, v.shape[0], v.shape[1], narrowed.data());
  else
    convert(values, DType::f32, narrowed.data(), v.dtype, static_cast<size_t>(v.shape.numel()));
  ex.upload(p, narrowed.data());
}

void store_param_values(Executor& ex, ValueId p, int64_t at, const float* values, size_t n,
                        std::vector<unsigned char>& scratch) {
  const DType dt = ex.graph().value(p).dtype;
  LOOM_ASSERT(!dtype_is_quantized(dt), "store_param_values: a quantized kernel is stored whole");
  const size_t elem = dtype_size(dt);
  const void* src = values;
  if (dt != DType::f32) {
    scratch.resize(n * elem);
    convert(values, DType::f32, scratch.data(), dt, n);
    src = scratch.data();
  }
  ex.backend().copy_to_device(static_cast<unsigned char*>(ex.ptr(p)) + at * static_cast<int64_t>(elem), src,
                              n * elem);
}

void init_param_in(Executor& ex, const Param& p, uint64_t seed, int64_t slice) {
  const Graph& g = ex.graph();
  const Value& v = g.value(p.value);
  const ParamDraw draw(g, p, seed);
  const int64_t numel = draw.numel();
  if (!dtype_is_quantized(v.dtype)) {
    // Row-major slices, each rounded to the stored dtype and copied to its place.
    std::vector<float> values(static_cast<size_t>(std::min(slice, numel)));
    std::vector<unsigned char> narrowed;
    for (int64_t i0 = 0; i0 < numel; i0 += slice) {
      const int64_t n = std::min(slice, numel - i0);
      draw.fill(i0, n, values.data());
      store_param_values(ex, p.value, i0, values.data(), static_cast<size_t>(n), narrowed);
    }
    return;
  }
  // A quantized kernel W [K, N]: slabs of whole columns of W (rows of Wᵀ, the order it is quantized
  // in) drawn element by element from their row-major indices k·N + n, quantized into the stored
  // bytes, which are uploaded once.
  const int64_t K = v.shape[0], N = v.shape[1], step = K > 0 ? quant_column_step(v.dtype, K) : 1;
  const int64_t cols = std::max<int64_t>(1, slice / std::max<int64_t>(1, K * step)) * step;
  std::vector<unsigned char> stored(static_cast<size_t>(v.bytes()));  // zeroed: nf4's padding
  std::vector<float> wt(static_cast<size_t>(std::min(cols, N) * K));
  for (int64_t n0 = 0; n0 < N && K > 0; n0 += cols) {
    const int64_t n1 = std::min(N, n0 + cols);
#pragma omp parallel
    {
      std::vector<float> row(static_cast<size_t>(n1 - n0));
#pragma omp for schedule(static)
      for (int64_t k = 0; k < K; ++k) {  // W[k, n0:n1], scattered into Wᵀ's rows
        draw.fill(k * N + n0, n1 - n0, row.data());
        for (int64_t n = n0; n < n1; ++n) wt[static_cast<size_t>((n - n0) * K + k)] = row[static_cast<size_t>(n - n0)];
      }
    }
    quantize_columns(v.dtype, wt.data(), K, N, n0, n1, stored.data());
  }
  ex.upload(p.value, stored.data());
}

std::vector<float> download_param(const Executor& ex, ValueId p) {
  const Value& v = ex.graph().value(p);
  std::vector<float> out(static_cast<size_t>(v.shape.numel()));
  if (v.dtype == DType::f32) {
    ex.download(p, out.data());
    return out;
  }
  std::vector<unsigned char> stored(static_cast<size_t>(v.bytes()));
  ex.download(p, stored.data());
  if (!dtype_is_quantized(v.dtype)) {
    convert(stored.data(), v.dtype, out.data(), DType::f32, out.size());
    return out;
  }
  const int64_t K = v.shape[0], N = v.shape[1];
  std::vector<float> wt(out.size());  // Wᵀ [N, K]
  dequantize_tile(v.dtype, stored.data(), K, N, 0, N, 0, K, wt.data(), K);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) out[static_cast<size_t>(k * N + n)] = wt[static_cast<size_t>(n * K + k)];
  return out;
}

std::vector<StTensor> params_by_path(const Graph& g, const std::map<std::string, const StTensor*>& tensors,
                                     bool scan_layers, const std::string& file, nn::ParamSubset subset) {
  std::vector<StTensor> out;
  for_each_param(
      g, tensors, scan_layers, file, {},
      [&](ValueId p, const StTensor& t, uint64_t off) {
        const Value& v = g.value(p);
        const unsigned char* bytes = t.bytes.data() + off;
        out.push_back({v.name, DType::f32, v.shape, std::vector<unsigned char>(bytes, bytes + v.shape.numel() * 4)});
      },
      subset);
  return out;
}

}  // namespace loom
