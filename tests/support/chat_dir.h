// A chat data directory written directly (the files `loom prepare chat` writes, data/chat_data.h):
// train and val tokens with their loss masks, each split one example unless its docs say otherwise, and meta.json with
// the "chat" entry (conversational data, the masks marking the assistant turns, as `loom prepare chat` writes by
// default) and its target counts. For tests that train on masked tokens without a tokenizer or a template.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::testing {

struct ChatSplitData {
  std::vector<uint16_t> tokens;
  std::vector<uint8_t> mask;   // [tokens], 1 = a target
  std::vector<uint64_t> docs;  // example boundaries (S_docs.bin); empty: one example, {0, tokens}
};

// `tokenizer` goes into meta.json as it is (a Tokenizer::to_json object).
inline void write_chat_dir(const std::filesystem::path& dir, const ChatSplitData& train, const ChatSplitData& val,
                           int64_t vocab_size, const nlohmann::json& tokenizer) {
  std::filesystem::create_directories(dir);
  const auto bytes = [](const std::filesystem::path& p, const void* data, size_t n) {
    std::ofstream(p, std::ios::binary).write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  };
  nlohmann::json chat = {{"data_format", "conversational"},
                         {"loss_on", "assistant"},
                         {"mask_on", "assistant"},
                         {"template", nullptr},
                         {"mask", "uint8"},
                         {"docs", "uint64"}};
  const std::pair<const char*, const ChatSplitData*> splits[] = {{"train", &train}, {"val", &val}};
  for (const auto& [name, s] : splits) {
    const std::string n = name;
    bytes(dir / (n + ".bin"), s->tokens.data(), s->tokens.size() * 2);
    bytes(dir / (n + "_mask.bin"), s->mask.data(), s->mask.size());
    const std::vector<uint64_t> docs = s->docs.empty() ? std::vector<uint64_t>{0, s->tokens.size()} : s->docs;
    bytes(dir / (n + "_docs.bin"), docs.data(), docs.size() * 8);
    chat[n + "_examples"] = docs.size() - 1;
    int64_t targets = 0;
    for (uint8_t m : s->mask) targets += m;
    chat[n + "_target_tokens"] = targets;
  }
  const nlohmann::json meta = {{"format", "uint16"},
                               {"vocab_size", vocab_size},
                               {"train_tokens", train.tokens.size()},
                               {"val_tokens", val.tokens.size()},
                               {"source", "test"},
                               {"chat", chat},
                               {"tokenizer", tokenizer}};
  std::ofstream(dir / "meta.json") << meta.dump(2);
}

}  // namespace loom::testing
