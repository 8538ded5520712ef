#include "run/choices.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "backend/registry.h"
#include "core/error.h"
#include "train/model_source.h"

namespace loom {

namespace {

// Code points of UTF-8 text (bytes that do not start one are continuation bytes).
int64_t code_points(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// log softmax(logits)[id], in double.
double log_prob(std::span<const float> logits, int32_t id) {
  double mx = -std::numeric_limits<double>::infinity();
  for (float x : logits) mx = std::max(mx, static_cast<double>(x));
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - mx);
  return static_cast<double>(logits[static_cast<size_t>(id)]) - mx - std::log(sum);
}

// The index of the largest value, the first of equal ones.
size_t first_max(const std::vector<double>& v) {
  size_t best = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[best]) best = i;
  return best;
}

}  // namespace

std::vector<ChoiceQuestion> read_choices(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UserError(path, "cannot be opened", "give a JSON Lines file of {\"context\", \"choices\", \"label\"}");
  std::vector<ChoiceQuestion> out;
  std::string text;
  for (int64_t line = 1; std::getline(f, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line);
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_object()) throw UserError(where, "is not a JSON object", "write one question object per line");
    const auto bad = [&](const std::string& field, const std::string& what) {
      return UserError(where, field + " " + what,
                       R"(write {"context": "...", "choices": ["...", "..."], "label": index of the right one})");
    };
    ChoiceQuestion q{.context = {}, .choices = {}, .label = 0, .line = line};
    if (!j.contains("context") || !j["context"].is_string()) throw bad("context", "is missing or not a string");
    q.context = j["context"].get<std::string>();
    if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].size() < 2)
      throw bad("choices", "is missing or not a list of two or more strings");
    for (size_t i = 0; i < j["choices"].size(); ++i) {
      const nlohmann::json& c = j["choices"][i];
      if (!c.is_string() || c.get<std::string>().empty())
        throw bad("choices[" + std::to_string(i) + "]", "is not a non-empty string");
      q.choices.push_back(c.get<std::string>());
    }
    if (!j.contains("label") || !j["label"].is_number_integer() || j["label"].get<int64_t>() < 0 ||
        j["label"].get<int64_t>() >= static_cast<int64_t>(q.choices.size()))
      throw bad("label", "is missing or not the index of one of the " + std::to_string(q.choices.size()) + " choices");
    q.label = j["label"].get<int64_t>();
    out.push_back(std::move(q));
  }
  if (out.empty()) throw UserError(path, "holds no questions", "write one question object per line");
  return out;
}

double continuation_loglikelihood(Sampler& s, std::span<const int32_t> ctx, std::span<const int32_t> cont) {
  std::vector<int32_t> seen(ctx.begin(), ctx.end());
  double ll = 0;
  for (int32_t id : cont) {
    ll += log_prob(s.next_logits(seen), id);
    seen.push_back(id);
  }
  return ll;
}

ChoiceResult score_question(Sampler& s, const Tokenizer& tok, const ChoiceQuestion& q, const std::string& where) {
  // lm-eval's _encode_pair: the context's trailing white space belongs to the continuation, whose
  // tokens are those of context + continuation after as many as the context alone has.
  const size_t keep = q.context.find_last_not_of(" \t\n\r\f\v") + 1;  // npos + 1 = 0: all white space
  const std::string context = q.context.substr(0, keep), space = q.context.substr(keep);
  const std::vector<int32_t> ctx = tok.encode(context);
  if (ctx.empty()) throw UserError(where, "context encodes to no tokens", "give each question a context");
  ChoiceResult r;
  std::vector<double> normalised;
  for (size_t i = 0; i < q.choices.size(); ++i) {
    const std::vector<int32_t> whole = tok.encode(context + space + q.choices[i]);
    if (whole.size() <= ctx.size())
      throw UserError(where, "choices[" + std::to_string(i) + "] adds no token to the context",
                      "check the question's context and choices");
    // The last token is predicted from all before it: more than max_len of them slide the window.
    r.cut = r.cut || static_cast<int64_t>(whole.size()) - 1 > s.max_len();
    const double ll = continuation_loglikelihood(s, ctx, std::span<const int32_t>(whole).subspan(ctx.size()));
    r.loglikelihoods.push_back(ll);
    normalised.push_back(ll / static_cast<double>(code_points(q.choices[i])));
  }
  r.correct = static_cast<int64_t>(first_max(r.loglikelihoods)) == q.label;
  r.correct_norm = static_cast<int64_t>(first_max(normalised)) == q.label;
  return r;
}

int run_choices(const std::string& source, const std::string& path, bool json, std::FILE* out) {
  const std::vector<ChoiceQuestion> questions = read_choices(path);
  const ModelSource src(source);
  const std::unique_ptr<Tokenizer> tok = src.tokenizer();
  if (!tok)
    throw UserError(source, "has no tokenizer (tokenizer.json)",
                    "evaluate a run trained on token data, or a Hugging Face directory with its tokenizer.json");
  const std::unique_ptr<Backend> be = make_backend(Device::cpu);
  set_num_threads(static_cast<int>(src.config().threads));
  Sampler s(src.config(), *be);
  src.load_params(s.executor());
  int64_t acc = 0, acc_norm = 0, cut = 0;
  for (const ChoiceQuestion& q : questions) {
    const ChoiceResult r = score_question(s, *tok, q, path + ":" + std::to_string(q.line));
    acc += r.correct;
    acc_norm += r.correct_norm;
    cut += r.cut;
  }
  const auto n = static_cast<double>(questions.size());
  if (json)
    fmt::print(out, "{}\n",
               nlohmann::json({{"source", source},
                               {"choices", path},
                               {"questions", questions.size()},
                               {"acc", static_cast<double>(acc) / n},
                               {"acc_norm", static_cast<double>(acc_norm) / n},
                               {"cut_contexts", cut},
                               {"max_len", s.max_len()}})
                   .dump(2));
  else
    fmt::print(out, "loom eval: {} on {}: acc {:.4f}  acc_norm {:.4f}  ({} questions)\n", source, path,
               static_cast<double>(acc) / n, static_cast<double>(acc_norm) / n, questions.size());
  if (cut > 0 && !json)
    fmt::print(out,
               "loom eval: note: {} question(s) longer than the model's {} positions were scored on their last {} "
               "tokens (a sliding window)\n",
               cut, s.max_len(), s.max_len());
  return 0;
}

}  // namespace loom
