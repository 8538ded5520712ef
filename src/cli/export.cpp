// `loom export hf|peft RUN_OR_CKPT OUTDIR` (train/hf_export.h) and
// `loom export gguf RUN_OR_CKPT FILE.gguf [--type f16|bf16|q8_0]` (train/gguf_export.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "train/gguf_export.h"
#include "train/hf_export.h"

namespace loom::cli {

namespace {
struct ExportArgs {
  std::string format, checkpoint, out, type = "f16";
  bool merge = false;
};
}  // namespace

CommandBody add_export_command(CLI::App& sub) {
  auto a = std::make_shared<ExportArgs>();
  sub.add_option("format", a->format,
                 "hf: a Hugging Face directory (config.json, model.safetensors, the tokenizer's files); peft: a LoRA "
                 "run's adapters (adapter_config.json, adapter_model.safetensors); gguf: a GGUF file for llama.cpp and "
                 "Ollama")
      ->required()
      ->check(CLI::IsMember({"hf", "peft", "gguf"}));
  sub.add_option("checkpoint", a->checkpoint, "a run directory (its newest checkpoint) or a ckpt_<step> directory")
      ->required();
  sub.add_option("out", a->out, "hf, peft: the directory to create; gguf: the file to create")->required();
  const CLI::Option* type =
      sub.add_option("--type", a->type,
                     "gguf: the weights' type, f16 (default), bf16 or q8_0; vectors and norm weights stay float32")
          ->check(CLI::IsMember({"f16", "bf16", "q8_0"}));
  const CLI::Option* merge =
      sub.add_flag("--merge", a->merge,
                   "hf: a LoRA run's model with its adapters merged into the weights (gguf always merges them)");
  return [a, type, merge] {
    // A flag that does not apply is refused rather than ignored: the user expected it to change the output.
    if (type->count() > 0 && a->format != "gguf")
      throw UserError("--type", "applies to loom export gguf only", "drop --type for loom export " + a->format);
    if (merge->count() > 0 && a->format == "peft")
      throw UserError("--merge", "applies to loom export hf only (gguf always merges; peft writes the adapters)",
                      "drop --merge, or use loom export hf RUN DIR --merge for the merged model");
    if (a->format == "gguf") {
      const GgufExport r = export_gguf(a->checkpoint, a->out, gguf_type_named(a->type));
      for (const std::string& s : r.skipped) fmt::print(stderr, "skipping a damaged checkpoint: {}\n", s);
      fmt::print("exported {} as llama.cpp's {} to {}: {} tensors ({}), {:.1f} MiB\n", r.checkpoint, r.architecture,
                 a->out, r.tensors, a->type, static_cast<double>(r.bytes) / (1 << 20));
      return 0;
    }
    const HfExport r = a->format == "peft"
                           ? export_peft(a->checkpoint, a->out)
                           : export_hf(a->checkpoint, a->out, a->merge ? LoraMerge::merge : LoraMerge::refuse);
    for (const std::string& s : r.skipped) fmt::print(stderr, "skipping a damaged checkpoint: {}\n", s);
    fmt::print("exported {} as {} to {}: {}\n", r.checkpoint, r.architecture, a->out, fmt::join(r.files, ", "));
    if (!r.tokenizer_note.empty()) fmt::print("no tokenizer.json: {}\n", r.tokenizer_note);
    if (!r.end_of_turn_note.empty())
      fmt::print("generation_config.json names no end of turn, the chat template could not be read: {}\n",
                 r.end_of_turn_note);
    return 0;
  };
}

}  // namespace loom::cli
