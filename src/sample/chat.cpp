#include "sample/chat.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <utility>

#include "core/error.h"
#include "data/end_of_turn.h"

namespace loom {

namespace fs = std::filesystem;
using jinja::Json;

namespace {

// Reads `path` as JSON; null when it does not exist or is not valid JSON (an optional file).
Json optional_json(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Json(nullptr);
  return Json::parse(f, nullptr, false);
}

}  // namespace

size_t StopString::held(const std::string& text) const {
  if (stop_.empty()) return 0;
  for (size_t n = std::min(text.size(), stop_.size() - 1); n > 0; --n)
    if (text.compare(text.size() - n, n, stop_, 0, n) == 0) return n;
  return 0;
}

size_t StopString::find(const std::string& text) const {
  return stop_.empty() ? std::string::npos : text.find(stop_);
}

int run_chat(const SampleOptions& o, const std::string& dir, const Tokenizer& tok, Sampler& s) {
  std::error_code ec;
  if (o.template_path.empty() && !fs::exists(fs::path(dir) / "tokenizer_config.json", ec) &&
      !fs::exists(fs::path(dir) / "chat_template.jinja", ec))
    throw UserError(o.checkpoint, "has no chat template (no tokenizer_config.json in " + dir + ")",
                    "train on data prepared by `loom prepare chat` (its template travels with the checkpoints), or "
                    "give the template with --template FILE");
  const ChatTemplate t = load_chat_template(dir, o.template_path);
  const std::vector<int32_t> stop = end_of_turn_ids(t, optional_json(fs::path(dir) / "generation_config.json"), tok);
  const StopString stop_text(end_of_turn_text(t, tok));
  Json messages = Json::array();
  if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  const bool interactive = o.chat == "-";
  const bool prompt_user = interactive && ::isatty(::fileno(o.in)) && ::isatty(::fileno(stderr));
  const auto write = [&](const std::string& text) {
    std::fwrite(text.data(), 1, text.size(), o.out);
    std::fflush(o.out);
  };
  // The next user message: o.chat once, or the next non-empty line of o.in.
  auto next_message = [&, done = false](std::string& message) mutable {
    if (!interactive) {
      message = o.chat;
      return !std::exchange(done, true);
    }
    for (;;) {
      if (prompt_user) std::fputs("> ", stderr);
      message.clear();
      int ch;
      while ((ch = std::fgetc(o.in)) != EOF && ch != '\n') message += static_cast<char>(ch);
      if (!message.empty() && message.back() == '\r') message.pop_back();
      if (!message.empty()) return true;
      if (ch == EOF) return false;
    }
  };
  std::string message;
  for (uint64_t turn = 0; next_message(message); ++turn) {
    messages.push_back({{"role", "user"}, {"content", message}});
    const std::string rendered = render_messages(t, messages, Json(nullptr), true);
    std::vector<int32_t> context;
    try {
      context = tok.encode(rendered);
    } catch (const UserError& e) {
      throw UserError(interactive ? std::string("the message on stdin") : std::string("--chat"), e.what(), e.hint());
    }
    if (context.empty())
      throw UserError(t.source, "renders the conversation as no text", "give a chat template with --template FILE");
    DecodeStream stream(tok, context);
    std::string reply;
    size_t written = 0;  // reply[0, written) is out; the rest may be the start of the stop text
    bool stopped = false;
    generate(
        s, context, o.tokens, o.sampling, o.seed + turn, tok.vocab_size(),
        [&](int32_t id) {
          reply += stream.push(id);
          if (const size_t at = stop_text.find(reply); at != std::string::npos) {
            reply.resize(at);
            stopped = true;
            return false;
          }
          const size_t ready = reply.size() - stop_text.held(reply);
          if (ready > written) write(reply.substr(written, ready - written));
          written = std::max(written, ready);
          return true;
        },
        stop);
    if (!stopped) reply += stream.flush();
    write(reply.substr(std::min(written, reply.size())) + "\n");
    messages.push_back({{"role", "assistant"}, {"content", reply}});
  }
  return 0;
}

}  // namespace loom
