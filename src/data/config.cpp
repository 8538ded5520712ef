#include "data/config.h"

namespace loom {

namespace {

using namespace keys;

bool classification_data(const DataConfig& c) { return c.kind == DataKind::random_classification; }
bool token_data(const DataConfig& c) { return is_token_data(c.kind); }
bool random_tokens(const DataConfig& c) { return c.kind == DataKind::random_tokens; }
bool token_files(const DataConfig& c) { return c.kind == DataKind::tokens; }

}  // namespace

#define REF(member) LOOM_KEY_REF(DataConfig, member)

const std::vector<KeySpec<DataConfig>>& data_keys() {
  static const std::vector<KeySpec<DataConfig>> keys = {
      choice<DataConfig>("data.kind", "data source", REF(kind)),
      integer<DataConfig>("data.batch_size", "examples per optimizer step (all minibatches together)", REF(batch_size)),
      only_if(integer<DataConfig>("data.num_inputs", "input features of random_classification data", REF(num_inputs)),
              classification_data),
      only_if(integer<DataConfig>("data.seq_len", "tokens per sequence", REF(seq_len)), token_data),
      only_if(
          integer<DataConfig>("data.vocab_size", "random_tokens: tokens drawn from [1, vocab_size)", REF(vocab_size)),
          random_tokens),
      only_if(path<DataConfig>("data.dir",
                               "tokens: directory written by `loom prepare` (train.bin, val.bin, meta.json)", REF(dir)),
              token_files),
      only_if(boolean<DataConfig>("data.packing",
                                  "chat data (loom prepare chat): fill each row of data.seq_len with several whole "
                                  "examples, attention and positions restarting at each; false (TRL's default): one "
                                  "example per row, padded",
                                  REF(packing)),
              token_files),
      only_if(choice<DataConfig>("data.loss_on",
                                 "chat data (loom prepare chat): the tokens the loss covers, chosen at train time "
                                 "from the stored mask; plain token data: auto or all (every token)",
                                 REF(loss_on)),
              token_files),
  };
  return keys;
}

#undef REF

void validate_data(const DataConfig& c) {
  check_key(c.kind != DataKind::tokens || !c.dir.empty(), "data.dir", "data.kind = tokens needs a data directory",
            "prepare one with `loom prepare char data/tinyshakespeare.txt data/shakespeare_char` and set data.dir");
  check_key(c.batch_size >= 1, "data.batch_size", "must be >= 1", "e.g. 512");
  check_key(c.num_inputs >= 1, "data.num_inputs", "must be >= 1", "e.g. 128");
}

}  // namespace loom
