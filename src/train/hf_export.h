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
//                       defaults); but when they carry a chat template, generation_config.json
//                       (written when there was none) lists the template's end-of-turn ids
//                       (data/end_of_turn.h) in eos_token_id after its own, so that generate()
//                       stops at the end of the assistant's turn as `loom sample --chat` does, as
//                       transformers' own chat models list theirs (Llama 3.1: [128001, 128008,
//                       128009]); its other fields are kept, and its bos_token_id and pad_token_id
//                       are config.json's where it names none
// Importing the directory again (model.init_from) gives bit-identical parameters.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/hf_tokenizer.h"
#include "io/safetensors.h"
#include "nn/models/hf_arch.h"
#include "train/config.h"

namespace loom {

// A loom run's model in transformers' names and layouts: what export_hf writes and
// train/gguf_export.h converts further.
struct HfCheckpoint {
  std::string checkpoint;                // the checkpoint read (a run's newest that verifies)
  Config config;                         // its configuration
  nn::HfModelMap map;                    // the architecture's tensor map
  std::vector<StTensor> tensors;         // float32, in map order, transformers' names and shapes
  std::unique_ptr<Tokenizer> tokenizer;  // the run's, or nullptr
  std::vector<std::string> skipped;      // newer checkpoints passed over as damaged ("ckpt_<step>: <why>")
};
// What a reader does with a LoRA run's adapters: `refuse` the run (its checkpoints hold the
// adapters, not the model), `merge` them (W += scale · B·A, PEFT's merge_and_unload) and refuse a
// run without adapters (the user asked for a merge that cannot happen), or merge them `if_lora`.
enum class LoraMerge { refuse, merge, if_lora };
// UserErrors: those of `lora` above, a source that is no loom checkpoint (a Hugging Face directory
// already), a model transformers' architectures cannot hold (nn/models/hf_arch.h: the architecture
// names the key), a LoRA base that changed.
HfCheckpoint read_hf_checkpoint(const std::string& run_or_checkpoint, LoraMerge lora = LoraMerge::refuse);
// The config.json of `c` with tokenizer start token `start` as bos_token_id, and as eos_token_id
// unless `eos` (a chat template's end-of-turn ids, generation_config.json's list) is given; both
// the source's own when the run was fine-tuned from a Hugging Face directory that names them:
// Llama 3's differ, and an instruct model's eos may be a list.
nlohmann::json hf_export_config(const ModelConfig& c, int32_t start, const std::vector<int32_t>& eos = {});
// The companion files of the run's tokenizer ({name: text}, HfTokenizer::companions: carried from
// the directory `loom prepare hf|chat` read), with those it lacks taken from c.init_from when that
// is a Hugging Face directory: the chat template and generation defaults of the model fine-tuned.
nlohmann::json hf_export_companions(const ModelConfig& c, const HfTokenizer& tok);

struct HfExport {
  std::string checkpoint;          // the checkpoint exported (a run's newest that verifies)
  std::string architecture;        // "GPT2LMHeadModel"
  std::vector<std::string> files;  // written, in OUTDIR
  std::string tokenizer_note;      // why no tokenizer.json was written ("" when one was)
  std::string end_of_turn_note;    // why a chat template's end of turn is not in generation_config.json ("" if it is)
  std::vector<std::string> skipped;  // newer checkpoints passed over as damaged ("ckpt_<step>: <why>")
};

// UserErrors: read_hf_checkpoint's, an OUTDIR that exists and is not empty (nothing is
// overwritten). The files are written into OUTDIR.loom-export.tmp, which is then renamed to
// OUTDIR: a failed export leaves no OUTDIR.
HfExport export_hf(const std::string& run_or_checkpoint, const std::string& out_dir,
                   LoraMerge lora = LoraMerge::refuse);

// `loom export peft RUN_OR_CKPT OUTDIR`: a LoRA run's adapters (nn/lora.h) as the directory
// peft.PeftModel.from_pretrained(base, OUTDIR) loads (io/peft.h):
//   adapter_config.json        LoraConfig (base_model_name_or_path: the run's model.init_from)
//   adapter_model.safetensors  the adapters in PEFT's names, float32
// UserErrors as export_hf's, and for a run that trained every parameter (no adapters).
HfExport export_peft(const std::string& run_or_checkpoint, const std::string& out_dir);

}  // namespace loom
