// Hugging Face tokenizer.json (src/data/hf_tokenizer.h) against the `tokenizers` library: the
// fixtures of tools/make_hf_fixtures.sh (tests/golden/hf/tokenizers/) hold four byte-level BPE
// tokenizers, one per pre-tokenizer style (GPT-2, SmolLM, Llama 3, Qwen2), and the ids
// `tokenizers` gives for a set of texts. Then what loom adds: the NFC check, the start token,
// `loom prepare hf` (uint32 token files for a large vocabulary) and the errors.
#include "data/hf_tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "data/token_data.h"
#include "data/unicode.h"
#include "support/files.h"

namespace loom {
namespace {

using testing::hf_golden;
using testing::read_file;
using testing::TempDir;
using testing::user_error;
using testing::write_file;

const char* kVariants[] = {"gpt2", "smollm", "llama3", "qwen2"};

nlohmann::json golden_json(const std::string& rel) { return nlohmann::json::parse(read_file(hf_golden(rel))); }

TEST(HfTokenizer, IdsMatchTheTokenizersLibrary) {
  const nlohmann::json expected = golden_json("tokenizers/expected.json");
  const auto& texts = expected["texts"];
  for (const char* v : kVariants) {
    const auto tok = HfTokenizer::load(hf_golden(std::string("tokenizers/") + v + ".json"));
    EXPECT_EQ(tok->kind(), TokenizerKind::hf);
    for (size_t k = 0; k < texts.size(); ++k) {
      const std::string text = texts[k].get<std::string>();
      const std::vector<int32_t> want = expected["ids"][v][k].get<std::vector<int32_t>>();
      const std::vector<int32_t> got = tok->encode(text);
      EXPECT_EQ(got, want) << v << ", text " << k << ": " << text;
      EXPECT_EQ(tok->decode(got), text) << v << ", text " << k;
    }
  }
}

// tools/hf_tokenizer_fixtures.py: SentencePiece-style tokenizers in the pipeline shapes of Llama 2,
// Mistral and Gemma (and one with holes in its byte tokens), plus the byte-level ones, on texts
// with accents, CJK, emoji, control characters, characters only byte fallback encodes and the
// families' special tokens; ids and decoded text from `tokenizers`.
const char* kSpmVariants[] = {"llama2", "mistral", "gemma", "llama2_gaps", "gpt2", "smollm", "llama3", "qwen2"};

TEST(HfTokenizer, SentencePieceIdsAndTextMatchTheTokenizersLibrary) {
  const nlohmann::json expected = golden_json("tokenizers/expected_spm.json");
  const auto& texts = expected["texts"];
  for (const char* v : kSpmVariants) {
    const auto tok = HfTokenizer::load(hf_golden(std::string("tokenizers/") + v + ".json"));
    for (size_t k = 0; k < texts.size(); ++k) {
      if (expected["ids"][v][k].is_null()) continue;  // qwen2 and the non-NFC text
      const std::string text = texts[k].get<std::string>();
      const std::vector<int32_t> want = expected["ids"][v][k].get<std::vector<int32_t>>();
      EXPECT_EQ(tok->encode(text), want) << v << ", text " << k << ": " << text;
      EXPECT_EQ(tok->decode(want), expected["decoded"][v][k].get<std::string>()) << v << ", text " << k;
    }
  }
}

// Ids cut anywhere (inside a character's bytes or a byte-fallback run), and runs made invalid by a
// stray byte, decode as the library does: U+FFFD per from_utf8_lossy (byte-level) or one per byte
// of an invalid run (ByteFallback).
TEST(HfTokenizer, DecodeOfEveryPrefixMatchesTheLibrary) {
  const nlohmann::json expected = golden_json("tokenizers/expected_spm.json");
  for (const char* v : kSpmVariants) {
    const auto tok = HfTokenizer::load(hf_golden(std::string("tokenizers/") + v + ".json"));
    for (const nlohmann::json& p : expected["prefixes"][v]) {
      const auto ids = p["ids"].get<std::vector<int32_t>>();
      for (size_t n = 0; n <= ids.size(); ++n)
        EXPECT_EQ(tok->decode(std::span(ids).first(n)), p["decoded"][n].get<std::string>()) << v << ", " << n << " ids";
    }
  }
}

// What `loom sample` prints after a prompt: whole characters as the tokens come, adding up to the
// library's decode of all the ids past the prompt's.
TEST(HfTokenizer, DecodeStreamPrintsWholeCharactersAddingUpToTheDecode) {
  const nlohmann::json expected = golden_json("tokenizers/expected_spm.json");
  for (const char* v : kSpmVariants) {
    const auto tok = HfTokenizer::load(hf_golden(std::string("tokenizers/") + v + ".json"));
    for (const nlohmann::json& p : expected["prefixes"][v]) {
      const auto ids = p["ids"].get<std::vector<int32_t>>();
      // The prompt: the first ids whose text is whole characters (as a prompt's is).
      const std::string all = p["decoded"].back().get<std::string>();
      size_t start = 1;
      while (!all.starts_with(p["decoded"][start].get<std::string>()) ||
             p["decoded"][start].get<std::string>().ends_with("\xEF\xBF\xBD"))
        ++start;
      const std::string context_text = p["decoded"][start].get<std::string>();
      DecodeStream stream(*tok, std::span(ids).first(start));
      std::string out;
      int pieces = 0;
      for (size_t n = start; n < ids.size(); ++n) {
        const std::string piece = stream.push(ids[n]);
        EXPECT_NO_THROW(utf8_length(piece, "piece")) << v << " at " << n;
        EXPECT_FALSE(piece.ends_with("\xEF\xBF\xBD")) << v << " at " << n;  // the text cut here is not final
        pieces += !piece.empty();
        out += piece;
      }
      out += stream.flush();
      EXPECT_EQ(out, all.substr(context_text.size())) << v;
      EXPECT_GE(pieces, 1) << v;
      if (&p != &expected["prefixes"][v].back()) {  // text: incremental, not all at the end
        EXPECT_GT(pieces, 3) << v;
      }
    }
  }
}

TEST(HfTokenizer, SentencePieceStartTokens) {
  const auto llama = HfTokenizer::load(hf_golden("tokenizers/llama2.json"));
  EXPECT_EQ(llama->start_id(), 1);  // <s>
  const auto gemma = HfTokenizer::load(hf_golden("tokenizers/gemma.json"));
  EXPECT_EQ(gemma->start_id(), 2);  // <bos>
}

TEST(HfTokenizer, IdsOfAWholeBookMatchAcrossReloads) {
  // The JSON loom stores in meta.json rebuilds the same tokenizer.
  const std::string text = read_file(LOOM_SOURCE_DIR "/data/tinyshakespeare.txt").substr(0, 100000);
  for (const char* v : {"gpt2", "smollm", "llama3", "qwen2", "llama2", "mistral", "gemma"}) {
    const auto tok = HfTokenizer::load(hf_golden(std::string("tokenizers/") + v + ".json"));
    const auto back = Tokenizer::from_json(nlohmann::json::parse(tok->to_json().dump()), "meta.json");
    EXPECT_EQ(back->kind(), TokenizerKind::hf);
    const std::vector<int32_t> ids = tok->encode(text);
    EXPECT_EQ(back->encode(text), ids) << v;
    EXPECT_EQ(tok->decode(ids), text) << v;
    EXPECT_LT(ids.size(), text.size() * 3 / 4) << v;  // merges happened
  }
}

TEST(HfTokenizer, IgnoreMergesTakesWholeTokens) {
  // The llama3 fixture has ignore_merges and a token "Ġzebra" no merge builds.
  nlohmann::json j = golden_json("tokenizers/llama3.json");
  const HfTokenizer with(j, "llama3.json");
  const int32_t zebra = with.find("\xC4\xA0zebra");
  ASSERT_GE(zebra, 0);
  EXPECT_EQ(with.encode(" zebra"), std::vector<int32_t>{zebra});
  j["model"]["ignore_merges"] = false;
  const HfTokenizer without(j, "llama3.json");
  const std::vector<int32_t> pieces = without.encode(" zebra");
  EXPECT_GT(pieces.size(), 1u);
  EXPECT_EQ(without.decode(pieces), " zebra");
}

TEST(HfTokenizer, StartToken) {
  const auto llama = HfTokenizer::load(hf_golden("tokenizers/llama3.json"));
  EXPECT_EQ(llama->start_id(), llama->find("<|begin_of_text|>"));  // the BOS of its template
  const auto gpt2 = HfTokenizer::load(hf_golden("tokenizers/gpt2.json"));
  EXPECT_EQ(gpt2->start_id(), gpt2->find("<|endoftext|>"));
  EXPECT_GE(gpt2->start_id(), 0);
  // A directory holding a tokenizer.json loads the same.
  EXPECT_EQ(HfTokenizer::load(hf_golden("gpt2"))->encode("the theme"), gpt2->encode("the theme"));
}

TEST(HfTokenizer, NfcNormalizerIsChecked) {
  const auto qwen = HfTokenizer::load(hf_golden("tokenizers/qwen2.json"));
  EXPECT_EQ(qwen->decode(qwen->encode("caf\xC3\xA9")), "caf\xC3\xA9");  // precomposed é: NFC
  // e + U+0301 (combining acute) normalizes to é: loom cannot tell without normalizing.
  std::string m = user_error([&] { qwen->encode("cafe\xCC\x81"); });
  EXPECT_NE(m.find("may not be in Unicode NFC"), std::string::npos) << m;
  EXPECT_NE(m.find("U+0301"), std::string::npos) << m;
  // U+0340 never occurs in NFC.
  m = user_error([&] { qwen->encode("a\xCD\x80"); });
  EXPECT_NE(m.find("is not in Unicode NFC"), std::string::npos) << m;
  // Without the normalizer the same text is fine.
  const auto gpt2 = HfTokenizer::load(hf_golden("tokenizers/gpt2.json"));
  EXPECT_EQ(gpt2->decode(gpt2->encode("cafe\xCC\x81")), "cafe\xCC\x81");
}

TEST(HfTokenizer, RefusesWhatItDoesNotImplement) {
  const nlohmann::json good = golden_json("tokenizers/gpt2.json");
  auto refused = [&](auto&& edit, const std::string& needle) {
    nlohmann::json j = good;
    edit(j);
    const std::string m = user_error([&] { HfTokenizer(j, "tok.json"); });
    EXPECT_NE(m.find(needle), std::string::npos) << m;
  };
  refused([](nlohmann::json& j) { j["model"]["type"] = "WordPiece"; }, "\"model.type\" is WordPiece");
  refused([](nlohmann::json& j) { j["model"]["unk_token"] = "<nope>"; }, "\"model.unk_token\" is '<nope>'");
  refused([](nlohmann::json& j) { j["pre_tokenizer"]["add_prefix_space"] = true; }, "add_prefix_space");
  refused([](nlohmann::json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, "is Whitespace");
  refused(
      [](nlohmann::json& j) {
        j["pre_tokenizer"] = {{"type", "Metaspace"}, {"prepend_scheme", "twice"}};
      },
      "prepend_scheme\" is 'twice'");
  refused([](nlohmann::json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }, "\"normalizer\" is Lowercase");
  refused(
      [](nlohmann::json& j) {
        j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", "_"}};
      },
      "is not {\"String\": ...}");
  refused([](nlohmann::json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "\"decoder\" is WordPiece");
  refused([](nlohmann::json& j) { j["added_tokens"][0]["single_word"] = true; }, "single_word = true");
  refused([](nlohmann::json& j) { j["model"]["vocab"].erase("a"); }, "no token with id");
  refused(
      [](nlohmann::json& j) {
        j["pre_tokenizer"] = {{"type", "Sequence"},
                              {"pretokenizers",
                               {{{"type", "Split"}, {"pattern", {{"Regex", "\\d+"}}}, {"behavior", "Isolated"}},
                                {{"type", "ByteLevel"}, {"use_regex", false}}}}};
      },
      "uses the escape \\d");
  refused(
      [](nlohmann::json& j) {
        j["pre_tokenizer"] = {{"type", "Sequence"},
                              {"pretokenizers", {{{"type", "ByteLevel"}, {"use_regex", true}}, {{"type", "Digits"}}}}};
      },
      "after the ByteLevel step");
  const std::string m = user_error([] { HfTokenizer::load("/nonexistent/tokenizer.json"); });
  EXPECT_NE(m.find("/nonexistent/tokenizer.json"), std::string::npos) << m;
}

TEST(HfTokenizer, PrepareWritesTheLibrarysIds) {
  TempDir d;
  const std::string text = read_file(LOOM_SOURCE_DIR "/data/tinyshakespeare.txt").substr(0, 20000);
  write_file(d.path("in.txt"), text);
  const PreparedDataset r =
      prepare_dataset(TokenizerKind::hf, d.path("in.txt"), d.path("out"), 0.1, hf_golden("tokenizers/llama3.json"));
  EXPECT_EQ(r.format, "uint16");
  const TokenMeta meta = read_token_meta(d.path("out"));
  EXPECT_EQ(meta.tokenizer["kind"], "hf");
  const auto tok = Tokenizer::from_json(meta.tokenizer, meta.path);
  const std::vector<int32_t> want = tok->encode(text.substr(0, 18000));
  const TokenFile train = TokenFile::open_split(d.path("out"), "train");
  ASSERT_EQ(train.size(), static_cast<int64_t>(want.size()));
  for (int64_t i = 0; i < train.size(); ++i) ASSERT_EQ(train[i], want[static_cast<size_t>(i)]) << i;
}

TEST(HfTokenizer, LargeVocabularyGivesUint32Files) {
  // The gpt2 fixture with 70000 added tokens: ids above 65535 need uint32 token files.
  nlohmann::json j = golden_json("tokenizers/gpt2.json");
  int64_t next = static_cast<int64_t>(j["model"]["vocab"].size());  // its one added token is in the vocab
  for (int k = 0; k < 70000; ++k)
    j["added_tokens"].push_back({{"id", next++}, {"content", "<|x" + std::to_string(k) + "|>"}, {"special", true}});
  TempDir d;
  write_file(d.path("tokenizer.json"), j.dump());
  const std::string text = "First Citizen:<|x69999|> Before we proceed<|x3|> any further, hear me speak.\n";
  write_file(d.path("in.txt"), text);
  const PreparedDataset r = prepare_dataset(TokenizerKind::hf, d.path("in.txt"), d.path("out"), 0.3, d.path());
  EXPECT_EQ(r.format, "uint32");
  EXPECT_EQ(r.vocab_size, next);
  const TokenFile train = TokenFile::open_split(d.path("out"), "train");
  const HfTokenizer tok(j, "tokenizer.json");
  const std::vector<int32_t> want = tok.encode(text.substr(0, static_cast<size_t>(0.7 * double(text.size()))));
  ASSERT_EQ(train.size(), static_cast<int64_t>(want.size()));
  bool wide = false;
  for (int64_t i = 0; i < train.size(); ++i) {
    EXPECT_EQ(train[i], want[static_cast<size_t>(i)]) << i;
    wide |= train[i] > 65535;
  }
  EXPECT_TRUE(wide);
  EXPECT_EQ(read_token_meta(d.path("out")).token_bytes, 4);
}

}  // namespace
}  // namespace loom
