// Training data sources. A batch is host memory for the model's `inputs` and `labels` values,
// examples laid out row-major, so minibatch i is a contiguous slice.
#pragma once
#include <cstdint>
#include <vector>

#include "train/config.h"

namespace loom {

struct Batch {
  std::vector<unsigned char> inputs;  // batch_size examples, inputs_bytes_per_example each
  std::vector<int32_t> labels;        // batch_size × labels_per_example
  int64_t batch_size = 0;
};

// The tutorial's classification batch: inputs ~ N(0, 1) [batch, num_inputs] f32 and labels
// uniform in [0, num_classes), drawn from the seed. The same batch every step, as in the tutorial.
Batch random_classification_batch(const Config& c);

// The tutorial's language-model batch: tokens [batch, seq_len] uniform in [1, vocab_size) from
// the seed; inputs are the tokens shifted right with a 0 in front, labels are the tokens.
Batch random_tokens_batch(const Config& c);

// The configured data source's batch (both kinds are one fixed batch, as in the tutorials).
Batch make_batch(const Config& c);

}  // namespace loom
