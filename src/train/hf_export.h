// `loom export hf RUN_OR_CKPT OUTDIR`: a loom run's model as a Hugging Face directory that
// transformers' AutoModelForCausalLM.from_pretrained(OUTDIR) loads (io/hf.h):
//   config.json         the architecture (io/hf.h, hf_config_json)
//   model.safetensors   the parameters in transformers' names and layouts, float32
//   tokenizer.json      the run's tokenizer, when it came from a tokenizer.json (`loom prepare hf`
//                       or `loom prepare chat`)
//   tokenizer_config.json, special_tokens_map.json, chat_template.jinja, generation_config.json
//                       those of them that were beside that tokenizer.json, or else in
//                       model.init_from's Hugging Face directory, byte for byte (the chat
//                       template and special tokens for apply_chat_template, the generation
//                       defaults)
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

}  // namespace loom
