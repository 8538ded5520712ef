// `loom export gguf RUN_OR_CKPT FILE.gguf --type f16|bf16|q8_0`: a loom run's model as the GGUF v3
// file llama.cpp (and Ollama) runs, converted as llama.cpp's convert_hf_to_gguf.py converts the
// Hugging Face directory `loom export hf` would write (train/hf_export.h):
//   - general.* and <arch>.* hyperparameter keys (integers as uint32, as the converter writes them);
//   - the tokenizer: tokenizer.ggml.model "gpt2" for byte-level BPE (tokens, token types, merges,
//     the pre-tokenizer's llama.cpp name), bos/eos ids, add_bos_token, the chat template;
//   - the tensors under llama.cpp's names (token_embd, blk.N.attn_q, ...), q_proj's and k_proj's rows
//     permuted per head for architectures that rotate adjacent pairs (nn/models/hf_arch.h), GPT-2's
//     Conv1D weights transposed; vectors and norm weights stay float32, the rest is `type`
//     (q8_0 falls back to f16 for a tensor whose rows are no multiple of 32, as the converter does).
#pragma once
#include <string>
#include <vector>

#include "io/gguf.h"

namespace loom {

struct GgufExport {
  std::string checkpoint;    // the checkpoint exported
  std::string architecture;  // llama.cpp's: "llama"
  int64_t tensors = 0;
  int64_t bytes = 0;  // of the file
  std::vector<std::string> skipped;  // newer checkpoints passed over as damaged ("ckpt_<step>: <why>")
};

// "f16", "bf16", "q8_0" (the --type values); anything else is a UserError naming --type.
GgufType gguf_type_named(const std::string& name);

// A LoRA run is written with its adapters merged. UserErrors: read_hf_checkpoint's, an architecture llama.cpp does not
// run, a tokenizer it cannot hold (naming the tokenizer.json field), an existing FILE (nothing is overwritten) or a
// missing directory for it. The file is written whole or not at all (io/gguf.h).
GgufExport export_gguf(const std::string& run_or_checkpoint, const std::string& file, GgufType type);

}  // namespace loom
