// `loom export hf|peft RUN_OR_CKPT OUTDIR` (train/hf_export.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <memory>
#include <string>

#include "cli/command.h"
#include "train/hf_export.h"

namespace loom::cli {

namespace {
struct ExportArgs {
  std::string format, checkpoint, out_dir;
};
}  // namespace

CommandBody add_export_command(CLI::App& sub) {
  auto a = std::make_shared<ExportArgs>();
  sub.add_option("format", a->format,
                 "hf: a Hugging Face directory (config.json, model.safetensors, tokenizer.json); peft: a LoRA run's "
                 "adapters (adapter_config.json, adapter_model.safetensors)")
      ->required()
      ->check(CLI::IsMember({"hf", "peft"}));
  sub.add_option("checkpoint", a->checkpoint, "a run directory (its newest checkpoint) or a ckpt_<step> directory")
      ->required();
  sub.add_option("outdir", a->out_dir, "the directory to create")->required();
  return [a] {
    const HfExport r =
        a->format == "peft" ? export_peft(a->checkpoint, a->out_dir) : export_hf(a->checkpoint, a->out_dir);
    fmt::print("exported {} as {} to {}: {}\n", r.checkpoint, r.architecture, a->out_dir, fmt::join(r.files, ", "));
    if (!r.tokenizer_note.empty()) fmt::print("no tokenizer.json: {}\n", r.tokenizer_note);
    return 0;
  };
}

}  // namespace loom::cli
