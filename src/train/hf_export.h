// `loom export hf RUN_OR_CKPT OUTDIR`: a loom run's model as a Hugging Face directory that
// transformers' AutoModelForCausalLM.from_pretrained(OUTDIR) loads (io/hf.h):
//   config.json         the architecture (io/hf.h, hf_config_json)
//   model.safetensors   the parameters in transformers' names and layouts, float32
//   tokenizer.json      the run's tokenizer, when it came from a tokenizer.json (`loom prepare hf`)
// Importing the directory again (model.init_from) gives bit-identical parameters.
#pragma once
#include <string>
#include <vector>

namespace loom {

struct HfExport {
  std::string checkpoint;          // the checkpoint exported (a run's newest that verifies)
  std::string architecture;        // "GPT2LMHeadModel"
  std::vector<std::string> files;  // written, in OUTDIR
  std::string tokenizer_note;      // why no tokenizer.json was written ("" when one was)
};

// UserErrors: a source that is no loom checkpoint, a model transformers' architectures cannot
// hold (nn/models/hf_arch.h: the architecture names the key), an OUTDIR that exists and is not empty (nothing is
// overwritten). The files are written into OUTDIR.loom-export.tmp, which is then renamed to
// OUTDIR: a failed export leaves no OUTDIR.
HfExport export_hf(const std::string& run_or_checkpoint, const std::string& out_dir);

// `loom export peft RUN_OR_CKPT OUTDIR`: a LoRA run's adapters (nn/lora.h) as the directory
// peft.PeftModel.from_pretrained(base, OUTDIR) loads (io/peft.h):
//   adapter_config.json        LoraConfig (base_model_name_or_path: the run's model.init_from)
//   adapter_model.safetensors  the adapters in PEFT's names, float32
// UserErrors as export_hf's, and for a run that trained every parameter (no adapters).
HfExport export_peft(const std::string& run_or_checkpoint, const std::string& out_dir);

}  // namespace loom
