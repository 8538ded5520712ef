#include "data/token_data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "data/hf_tokenizer.h"
#include "data/tokenizer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kMaxVocab = INT32_MAX;    // ids are int32 inside loom

std::string errno_text(int e) {
  std::string s = "(";
  s += std::strerror(e);
  s += ")";
  return s;
}

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

// Reads the whole input text; a missing, unreadable or empty file is a UserError naming it.
std::string read_input_text(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw UserError(path, "is a directory, not a text file", "give the path of the text file to tokenize");
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::string msg = "cannot be opened ";
    msg += errno_text(errno);
    throw UserError(path, msg, "check the path of the input text");
  }
  std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  if (f.bad()) throw UserError(path, "could not be read to the end", "check the file and the disk");
  if (text.empty()) throw UserError(path, "is empty: there is no text to tokenize", "give a non-empty UTF-8 text file");
  return text;
}

// Writes `bytes` to `path` so that `path` is either untouched or complete: "<path>.tmp" is
// written, fsync'ed and renamed over it, then the directory is fsync'ed (best effort).
void write_file_atomic(const std::string& path, const void* bytes, size_t size) {
  const std::string tmp = path + ".tmp";
  const std::string fix = "check the free space and permissions of the output directory";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::string msg = "cannot create '";
    msg += tmp;
    msg += "' ";
    msg += errno_text(errno);
    throw UserError(path, msg, fix);
  }
  auto fail = [&](const char* what, int e) {
    ::close(fd);
    ::unlink(tmp.c_str());
    std::string msg = what;
    msg += " '";
    msg += tmp;
    msg += "' failed ";
    msg += errno_text(e);
    throw UserError(path, msg, fix);
  };
  const auto* p = static_cast<const char*>(bytes);
  for (size_t done = 0; done < size;) {
    const ssize_t w = ::write(fd, p + done, size - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("writing", errno);
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) fail("fsync of", errno);
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    std::string msg = "closing '";
    msg += tmp;
    msg += "' failed ";
    msg += errno_text(e);
    throw UserError(path, msg, fix);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    std::string msg = "renaming '";
    msg += tmp;
    msg += "' over it failed ";
    msg += errno_text(e);
    throw UserError(path, msg, fix);
  }
  const std::string dir = fs::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

// `width` bytes per token (2: uint16, 4: uint32), little-endian whatever the host.
void write_tokens(const std::string& path, const std::vector<int32_t>& ids, int width) {
  std::vector<unsigned char> bytes(ids.size() * static_cast<size_t>(width));
  for (size_t i = 0; i < ids.size(); ++i)
    for (int b = 0; b < width; ++b)
      bytes[i * static_cast<size_t>(width) + static_cast<size_t>(b)] =
          static_cast<unsigned char>((static_cast<uint32_t>(ids[i]) >> (8 * b)) & 0xFF);
  write_file_atomic(path, bytes.data(), bytes.size());
}

const char* format_name(int width) { return width == 2 ? "uint16" : "uint32"; }

std::string json_text(const nlohmann::json& j) {
  // Paths need not be UTF-8; replace what is not rather than fail after the tokens are written.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

// ---- prepare --------------------------------------------------------------------------------

PreparedDataset prepare_dataset(TokenizerKind kind, const std::string& input_path, const std::string& out_dir,
                                double val_fraction, const std::string& vocab) {
  if (!(val_fraction > 0.0 && val_fraction < 1.0)) {
    std::string msg = "is ";
    msg += std::to_string(val_fraction);
    msg += "; it must be in (0, 1)";
    throw UserError("--val-fraction", msg, "give the share of the text kept for validation, e.g. 0.1 (nanoGPT's)");
  }
  if (kind == TokenizerKind::gpt2 && vocab.empty())
    throw UserError("--vocab", "gpt2 needs GPT-2's vocabulary files",
                    "pass --vocab DIR, where DIR holds encoder.json and vocab.bpe (openai/gpt-2, models/124M)");
  if (kind == TokenizerKind::hf && vocab.empty())
    throw UserError("--tokenizer", "hf needs a Hugging Face tokenizer.json",
                    "give it: loom prepare hf TOKENIZER_JSON INPUT OUTDIR (or --tokenizer DIR holding tokenizer.json)");

  // Load the vocabulary before reading a possibly large text, so its errors come first.
  std::unique_ptr<Tokenizer> tok;
  if (kind == TokenizerKind::gpt2) tok = Gpt2Tokenizer::load_dir(vocab);
  if (kind == TokenizerKind::hf) tok = HfTokenizer::load(vocab);

  const std::string text = read_input_text(input_path);
  const int64_t n = utf8_length(text, input_path);
  if (kind == TokenizerKind::char_) tok = std::make_unique<CharTokenizer>(CharTokenizer::fit(text, input_path));
  // uint16 token files while the ids fit (nanoGPT's), uint32 beyond (Llama 3's 128,256 tokens).
  const int width = tok->vocab_size() > kMaxUint16Vocab ? 4 : 2;

  // nanoGPT: train_data = data[:int(n*0.9)], val_data = data[int(n*0.9):] (on characters).
  const auto n_train_chars = static_cast<int64_t>(static_cast<double>(n) * (1.0 - val_fraction));
  const size_t cut = utf8_offset(text, n_train_chars);
  const std::string_view all(text);
  const std::vector<int32_t> train = tok->encode(all.substr(0, cut));
  const std::vector<int32_t> val = tok->encode(all.substr(cut));
  if (train.empty() || val.empty()) {
    std::string msg = "is too short to split: its ";
    msg += std::to_string(n);
    msg += " characters give ";
    msg += std::to_string(train.size());
    msg += " train and ";
    msg += std::to_string(val.size());
    msg += " val tokens with --val-fraction ";
    msg += std::to_string(val_fraction);
    throw UserError(input_path, msg, "use a longer text or another --val-fraction so both parts are non-empty");
  }

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec || !fs::is_directory(out_dir)) {
    std::string msg = "cannot be created as a directory (";
    msg += ec ? ec.message() : std::string("a file of that name exists");
    msg += ")";
    throw UserError(out_dir, msg, "choose another output directory");
  }
  PreparedDataset r;
  r.kind = kind;
  r.characters = n;
  r.vocab_size = tok->vocab_size();
  r.format = format_name(width);
  r.train_tokens = static_cast<int64_t>(train.size());
  r.val_tokens = static_cast<int64_t>(val.size());
  r.train_path = join(out_dir, "train.bin");
  r.val_path = join(out_dir, "val.bin");
  r.meta_path = join(out_dir, "meta.json");

  // meta.json goes first and comes back last: it is the mark of a complete data directory.
  if (::unlink(r.meta_path.c_str()) != 0 && errno != ENOENT) {
    std::string msg = "the old file cannot be removed ";
    msg += errno_text(errno);
    throw UserError(r.meta_path, msg, "check the permissions of the output directory");
  }
  write_tokens(r.train_path, train, width);
  write_tokens(r.val_path, val, width);

  // Top-level keys in a fixed, readable order, the (possibly large) tokenizer last.
  std::string meta = "{\n  \"format\": \"";
  meta += r.format;
  meta += "\",\n  \"vocab_size\": ";
  meta += std::to_string(r.vocab_size);
  meta += ",\n  \"train_tokens\": ";
  meta += std::to_string(r.train_tokens);
  meta += ",\n  \"val_tokens\": ";
  meta += std::to_string(r.val_tokens);
  meta += ",\n  \"source\": ";
  meta += json_text(fs::absolute(input_path, ec).lexically_normal().string());
  meta += ",\n  \"tokenizer\": ";
  meta += json_text(tok->to_json());
  meta += "\n}\n";
  write_file_atomic(r.meta_path, meta.data(), meta.size());
  return r;
}

TokenMeta read_token_meta(const std::string& data_dir) {
  TokenMeta m;
  m.path = join(data_dir, "meta.json");
  const std::string fix = "prepare the data directory again: loom prepare char|gpt2|hf INPUT DIR";
  std::ifstream f(m.path, std::ios::binary);
  if (!f) {
    std::string msg = "cannot be opened ";
    msg += errno_text(errno);
    throw UserError(m.path, msg, fix);
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    std::string msg = "is not valid JSON (";
    msg += e.what();
    msg += ")";
    throw UserError(m.path, msg, fix);
  }
  if (!j.is_object()) throw UserError(m.path, "is not a JSON object", fix);
  auto integer = [&](const char* key, int64_t lo, int64_t hi) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < lo || it->get<int64_t>() > hi) {
      std::string msg = "\"";
      msg += key;
      msg += "\" is missing or not an integer in [";
      msg += std::to_string(lo);
      msg += ", ";
      msg += std::to_string(hi);
      msg += "]";
      throw UserError(m.path, msg, fix);
    }
    return it->get<int64_t>();
  };
  auto fmt = j.find("format");
  if (fmt == j.end() || (*fmt != "uint16" && *fmt != "uint32"))
    throw UserError(m.path, "\"format\" is missing or not \"uint16\" or \"uint32\" (the token formats loom reads)",
                    fix);
  m.token_bytes = *fmt == "uint16" ? 2 : 4;
  m.vocab_size = integer("vocab_size", 1, m.token_bytes == 2 ? kMaxUint16Vocab : kMaxVocab);
  m.train_tokens = integer("train_tokens", 0, INT64_MAX / 2);
  m.val_tokens = integer("val_tokens", 0, INT64_MAX / 2);
  if (auto it = j.find("source"); it != j.end() && it->is_string()) m.source = it->get<std::string>();
  m.chat = j.contains("chat");
  auto tok = j.find("tokenizer");
  if (tok == j.end() || !tok->is_object()) throw UserError(m.path, "\"tokenizer\" is missing or not an object", fix);
  m.tokenizer = std::move(*tok);
  return m;
}

// ---- TokenFile ------------------------------------------------------------------------------

TokenFile::TokenFile(const std::string& path, int64_t vocab_size, int64_t expected_tokens, int token_bytes)
    : path_(path), vocab_size_(vocab_size), width_(token_bytes) {
  LOOM_ASSERT(token_bytes == 2 || token_bytes == 4, "TokenFile: tokens are 2 or 4 bytes");
  LOOM_ASSERT(vocab_size > 0 && vocab_size <= (token_bytes == 2 ? kMaxUint16Vocab : kMaxVocab),
              "TokenFile: vocab_size must fit the token width");
  const std::string fix = "prepare the data directory again: loom prepare char|gpt2|hf INPUT DIR";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    std::string msg = "cannot be opened ";
    msg += errno_text(errno);
    throw UserError(path, msg, fix);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UserError(path, "is not a regular file", fix);
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    throw UserError(path, "is empty: a token file needs at least one token", fix);
  }
  const auto w = static_cast<size_t>(width_);
  if (size % w != 0) {
    ::close(fd);
    std::string msg = "has ";
    msg += std::to_string(size);
    msg += " bytes, not a multiple of ";
    msg += std::to_string(w);
    msg += ": it is not a file of ";
    msg += format_name(width_);
    msg += " tokens (truncated or not a token file)";
    throw UserError(path, msg, fix);
  }
  if (expected_tokens >= 0 && static_cast<int64_t>(size / w) != expected_tokens) {
    ::close(fd);
    std::string msg = "has ";
    msg += std::to_string(size / w);
    msg += " tokens but meta.json says ";
    msg += std::to_string(expected_tokens);
    msg += " (the directory was changed after `loom prepare`)";
    throw UserError(path, msg, fix);
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file open
  if (p == MAP_FAILED) {
    std::string msg = "cannot be memory-mapped ";
    msg += errno_text(map_errno);
    throw UserError(path, msg, "check the file and the available address space");
  }
  data_ = static_cast<const unsigned char*>(p);
  bytes_ = size;

  // One pass over the whole file now, so a bad id is reported here with its place, not as an
  // out-of-range embedding lookup hours into training.
  const int64_t n = this->size();
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = (*this)[i];
    if (t >= vocab_size_) {
      unmap();
      std::string msg = "token ";
      msg += std::to_string(i);
      msg += " (byte offset ";
      msg += std::to_string(static_cast<int64_t>(w) * i);
      msg += ") is id ";
      msg += std::to_string(t);
      msg += ", outside the vocabulary of ";
      msg += std::to_string(vocab_size_);
      msg += " tokens";
      throw UserError(path, msg, fix);
    }
  }
}

TokenFile TokenFile::open_split(const std::string& data_dir, const std::string& split) {
  if (split != "train" && split != "val") {
    std::string msg = "unknown split '";
    msg += split;
    msg += "'";
    throw UserError(data_dir, msg, "use 'train' or 'val'");
  }
  const TokenMeta meta = read_token_meta(data_dir);
  return TokenFile(join(data_dir, split + ".bin"), meta.vocab_size,
                   split == "train" ? meta.train_tokens : meta.val_tokens, meta.token_bytes);
}

void TokenFile::unmap() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), bytes_);
  data_ = nullptr;
  bytes_ = 0;
}

TokenFile::~TokenFile() { unmap(); }

TokenFile::TokenFile(TokenFile&& o) noexcept
    : path_(std::move(o.path_)),
      data_(std::exchange(o.data_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      vocab_size_(o.vocab_size_),
      width_(o.width_) {}

TokenFile& TokenFile::operator=(TokenFile&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    vocab_size_ = o.vocab_size_;
    width_ = o.width_;
  }
  return *this;
}

// ---- TokenBatcher ---------------------------------------------------------------------------

TokenBatcher::TokenBatcher(const TokenFile& file, int64_t batch_size, int64_t seq_len, BatchMode mode, uint64_t seed,
                           const uint8_t* mask)
    : file_(&file), mask_(mask), batch_size_(batch_size), seq_len_(seq_len), mode_(mode), seed_(seed) {
  LOOM_ASSERT(batch_size > 0 && seq_len > 0, "TokenBatcher: batch_size and seq_len must be positive");
  if (file.size() < seq_len + 1) {
    std::string msg = "has ";
    msg += std::to_string(file.size());
    msg += " tokens, fewer than the seq_len + 1 = ";
    msg += std::to_string(seq_len + 1);
    msg += " one window of inputs and labels needs";
    throw UserError(file.path(), msg, "use a shorter sequence length or more text");
  }
}

void TokenBatcher::fill_row(Batch& b, int64_t row, int64_t start) const {
  LOOM_ASSERT(start >= 0 && start + seq_len_ + 1 <= file_->size(), "TokenBatcher: window out of bounds");
  auto* inputs = reinterpret_cast<int32_t*>(b.inputs.data()) + row * seq_len_;
  int32_t* labels = b.labels.data() + row * seq_len_;
  const TokenFile& f = *file_;
  for (int64_t t = 0; t < seq_len_; ++t) {
    inputs[t] = f[start + t];
    labels[t] = !mask_ || mask_[start + t + 1] ? f[start + t + 1] : kIgnoreLabel;
  }
}

Batch TokenBatcher::train_batch(uint64_t step) const {
  LOOM_ASSERT(mode_ == BatchMode::train, "TokenBatcher::train_batch on a val batcher");
  Batch b = token_batch(batch_size_, seq_len_, false);
  // A child stream per step: batch k never depends on how many words batches < k consumed.
  HostRng rng = HostRng(named_key(seed_, "data/train")).split(step);
  const auto starts = static_cast<uint64_t>(file_->size() - seq_len_);  // [0, n - T - 1]
  for (int64_t r = 0; r < batch_size_; ++r) fill_row(b, r, static_cast<int64_t>(rng.next_below(starts)));
  return b;
}

Batch TokenBatcher::val_batch() {
  LOOM_ASSERT(mode_ == BatchMode::val, "TokenBatcher::val_batch on a train batcher");
  Batch b = token_batch(batch_size_, seq_len_, false);
  for (int64_t r = 0; r < batch_size_; ++r) {
    fill_row(b, r, position_);
    position_ += seq_len_;
    if (position_ + seq_len_ + 1 > file_->size()) position_ = 0;
  }
  return b;
}

void TokenBatcher::set_position(int64_t p) {
  const int64_t last = file_->size() - seq_len_ - 1;
  if (p < 0 || p > last) {
    std::string msg = "position ";
    msg += std::to_string(p);
    msg += " is not a window start in this file (0..";
    msg += std::to_string(last);
    msg += " for seq_len ";
    msg += std::to_string(seq_len_);
    msg += ")";
    throw UserError(file_->path(), msg, "resume with the data and seq_len the checkpoint was made with");
  }
  position_ = p;
}

}  // namespace loom
