// `loom memory [CONFIG] [overrides] [--json] [--sweep key=v1,v2 ...] [--budget 24GiB]
// [--no-inplace] [--html FILE] [--ranks N] [--fit]`: the plan's device memory
// (report/memory_report.h), for one configuration or for every combination of the swept values;
// with --ranks, one rank's of N; with --fit, model.remat = auto's choices from the no-remat plan
// down to the smallest that fits (train/fit.h), and with --budget also the choice for it. With
// model.remat = auto the plan is that of the choice for --budget, else train.memory_budget, else
// the memory available, and the choice is printed above it (`remat_auto` in --json). The --html
// page draws the frontier too with --fit or model.remat = auto, and then its plan is the chosen
// point's.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/registry.h"
#include "cli/command.h"
#include "core/clock.h"
#include "core/error.h"
#include "report/ceiling.h"
#include "report/memory_html.h"
#include "report/memory_report.h"

namespace loom::cli {

namespace {

struct MemoryArgs {
  ConfigArgs config;
  bool json = false;
  std::vector<std::string> sweeps;
  std::string budget;
  bool no_inplace = false;
  std::string html;
  int ranks = 1;
  bool fit = false;
};

// `c` with model.remat = auto resolved for `budget` (0: train.memory_budget or what is available),
// and the choice when it was.
std::pair<Config, std::optional<FitChoice>> resolve_auto(const Config& c, int64_t budget, int ranks) {
  if (!c.model.remat.has(RematRegion::auto_)) return {c, std::nullopt};
  const char* key = budget > 0 ? "--budget" : "train.memory_budget";
  if (budget == 0) budget = fit_budget(c, make_backend(c.device)->memory_available(), ranks);
  if (budget < 0)
    throw UserError("train.memory_budget", "model.remat = auto needs a budget and this backend reports none",
                    "set train.memory_budget or --budget, e.g. 20GiB");
  Fitter f(c, ranks);
  const FitChoice choice = f.fit(budget, key);
  return {f.apply(choice), choice};
}

// The frontier of `c` (Fitter::frontier) with the choice for `budget` (--budget; 0: with
// model.remat = auto train.memory_budget or what is available, else none), and `c` with that choice
// applied (`c` itself without one).
struct Frontier {
  FitFrontier fit;
  Config planned;
};
Frontier fit_frontier(const Config& c, int64_t budget, int ranks) {
  Fitter f(c, ranks);
  Frontier r{.fit = {.points = f.frontier(), .ceiling_flops = 0, .chosen = std::nullopt}, .planned = c};
  const std::unique_ptr<Backend> be = make_backend(c.device);
  r.fit.ceiling_flops = matmul_ceiling_flops(*be, c.model.dtype, stderr);
  const char* key = budget > 0 ? "--budget" : "train.memory_budget";
  if (budget == 0 && c.model.remat.has(RematRegion::auto_)) budget = fit_budget(c, be->memory_available(), ranks);
  if (budget > 0) {
    Fitter::FitPoint chosen{.budget = budget, .choice = {}, .seconds = 0, .plans = f.plans_made()};
    const auto t0 = std::chrono::steady_clock::now();
    chosen.choice = f.fit(chosen.budget, key);
    chosen.seconds = seconds_since(t0);
    chosen.plans = f.plans_made() - chosen.plans;  // after the frontier's: the plans it could not reuse
    r.planned = f.apply(chosen.choice);
    r.fit.chosen = std::move(chosen);
  }
  return r;
}

void print_fit(const Frontier& r, bool json, int ranks) {
  const FitFrontier& fr = r.fit;
  if (json) {
    nlohmann::json rows = fit_frontier_json(fr.points, fr.ceiling_flops);
    for (auto& row : rows) row["chosen"] = false;
    if (fr.chosen) {
      nlohmann::json row = fit_frontier_json({*fr.chosen}, fr.ceiling_flops)[0];
      row["chosen"] = true;
      rows.push_back(std::move(row));
    }
    fmt::print("{}\n", rows.dump(2));
    return;
  }
  fmt::print(
      "model.remat = auto, least recomputed FLOPs per budget{}; step time = all FLOPs at the {} matmul "
      "ceiling ({:.0f} GFLOP/s)\n",
      ranks > 1 ? fmt::format(" (one rank of {})", ranks) : "", dtype_name(r.planned.model.dtype),
      fr.ceiling_flops / 1e9);
  fmt::print("{}", format_fit_frontier(fr.points, fr.ceiling_flops));
  if (fr.chosen)
    fmt::print("\nbudget {}: {}, planned {}, recompute +{:.1f}% FLOPs{}\n", format_bytes(fr.chosen->budget),
               describe_choice(fr.chosen->choice), format_bytes(fr.chosen->choice.total_bytes),
               100 * fr.chosen->choice.recompute_flops / fr.chosen->choice.step_flops,
               fr.chosen->choice.proven_least ? "" : " (not proven least)");
}

void print_one(const Config& config, bool json, int64_t budget, PlanOptions popts, int ranks) {
  const auto [c, choice] = resolve_auto(config, budget, ranks);
  const MemoryReport r = memory_report(c, 15, popts, ranks);
  if (json) {
    nlohmann::json j = memory_report_json(r);
    if (budget) j["fits_budget"] = r.total_bytes <= budget;
    if (choice) j["remat_auto"] = fit_choice_json(*choice);
    fmt::print("{}\n", j.dump(2));
  } else {
    if (choice)
      fmt::print("model.remat = auto: {}, recompute +{:.1f}% FLOPs{}\n\n", describe_choice(*choice),
                 100 * choice->recompute_flops / choice->step_flops, choice->proven_least ? "" : " (not proven least)");
    fmt::print("{}", format_memory_report(r));
    if (budget)
      fmt::print("\nbudget {}: {}\n", format_bytes(budget), r.total_bytes <= budget ? "fits" : "does NOT fit");
    if (ranks > 1) fmt::print("\n{}", format_shard_modes(c, ranks, popts));
  }
}

// --sweep key=v1,v2 (repeatable): every combination, one row each. Values may themselves contain
// commas (model.remat=MLP,Attn): they are written with '+' instead.
void print_sweep(const MemoryArgs& a, int64_t budget, PlanOptions popts) {
  std::vector<std::pair<std::string, std::vector<std::string>>> axes;
  for (const std::string& s : a.sweeps) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == s.size())
      throw UserError("--sweep " + s, "expected key=v1,v2,...", "e.g. --sweep model.remat=none,MLP,Block");
    std::vector<std::string> vals;
    for (size_t lo = eq + 1; lo <= s.size();) {
      size_t hi = s.find(',', lo);
      if (hi == std::string::npos) hi = s.size();
      vals.push_back(s.substr(lo, hi - lo));
      lo = hi + 1;
    }
    axes.emplace_back(s.substr(0, eq), vals);
  }
  std::vector<size_t> idx(axes.size(), 0);
  nlohmann::json rows = nlohmann::json::array();
  std::string header;
  for (const auto& [k, v] : axes) header += fmt::format("{:<26} ", k);
  if (!a.json)
    fmt::print("{}{:>11} {:>11} {:>11} {:>11} {:>9}{}\n", header, "total", "activations", "params+grad", "optimizer",
               "plan ms", budget ? "  fits " + format_bytes(budget) : "");
  while (true) {
    std::vector<std::string> ov;
    std::string cols;
    nlohmann::json row;
    for (size_t i = 0; i < axes.size(); ++i) {
      std::string v = axes[i].second[idx[i]];
      std::replace(v.begin(), v.end(), '+', ',');
      ov.push_back(axes[i].first + "=" + v);
      cols += fmt::format("{:<26} ", v);
      row[axes[i].first] = v;
    }
    const Config row_config = a.config.load(ov);
    std::optional<MemoryReport> r;
    std::string refused;  // model.remat = auto with no choice that fits: this row's answer, not the sweep's end
    try {
      r = memory_report(resolve_auto(row_config, budget, a.ranks).first, 15, popts, a.ranks);
    } catch (const UserError& e) {
      if (!row_config.model.remat.has(RematRegion::auto_)) throw;
      refused = e.what();
    }
    if (a.json) {
      if (r) {
        row["report"] = memory_report_json(*r);
      } else {
        row["error"] = refused;
      }
      if (budget) row["fits_budget"] = r && r->total_bytes <= budget;
      rows.push_back(row);
    } else if (r) {
      fmt::print("{}{:>11} {:>11} {:>11} {:>11} {:>9.1f}{}\n", cols, format_bytes(r->total_bytes),
                 format_bytes(r->activations_bytes), format_bytes(r->params_bytes + r->grads_bytes),
                 format_bytes(r->optimizer_bytes), r->plan_ms,
                 budget ? (r->total_bytes <= budget ? "  yes" : "  NO") : "");
    } else {
      fmt::print("{}{:>11} (no remat choice fits: {}){}\n", cols, "-", refused, budget ? "  NO" : "");
    }
    size_t i = 0;
    while (i < axes.size() && ++idx[i] == axes[i].second.size()) idx[i++] = 0;
    if (i == axes.size()) break;
  }
  if (a.json) fmt::print("{}\n", rows.dump(2));
}

}  // namespace

CommandBody add_memory_command(CLI::App& sub) {
  auto a = std::make_shared<MemoryArgs>();
  a->config.add(sub, /*required=*/false, "section.key=value overrides, e.g. model.remat=none");
  sub.add_flag("--json", a->json, "print the report as JSON");
  sub.add_option("--sweep", a->sweeps,
                 "key=v1,v2,... : one row per combination (repeatable); write commas inside a value as '+', "
                 "e.g. model.remat=none,MLP+Attn,Block");
  sub.add_option("--budget", a->budget, "device memory to fit in, e.g. 24GiB: marks which rows fit")
      ->check([](const std::string& s) { return s.empty() ? std::string("is empty: give a size, e.g. 24GiB") : ""; });
  sub.add_flag("--no-inplace", a->no_inplace, "plan without in-place buffer reuse (to see what it saves)");
  sub.add_option("--html", a->html, "also write the memory viewer (one self-contained HTML page) to FILE")
      ->transform(home_path());
  sub.add_flag("--fit", a->fit,
               "model.remat = auto's least-recompute choice (layers, minibatches and, with model.head_chunk=auto, "
               "the head) at budgets from the no-remat plan down to the smallest that fits, with the recompute "
               "share and predicted step time; with --budget also the choice for it; with --html drawn on the page");
  sub.add_option("--ranks", a->ranks,
                 "plan one rank of N (mpirun -np N): its share of the batch and state; with threads = auto, "
                 "this machine's cores shared among the N ranks")
      ->check([](const std::string& s) {
        const bool whole = !s.empty() && s.size() < 8 && s.find_first_not_of("0123456789") == std::string::npos;
        return whole && std::stoi(s) >= 1 ? std::string() : "must be a whole number of ranks >= 1, e.g. --ranks 2";
      });
  return [a] {
    const int64_t budget = a->budget.empty() ? 0 : parse_bytes(a->budget, "--budget");
    if (a->fit && !a->sweeps.empty())
      throw UserError("--fit", "does not combine with --sweep",
                      "run --fit once per configuration, choosing it with overrides (e.g. model.num_layers=12)");
    if (a->fit && a->no_inplace)
      throw UserError("--fit", "plans with in-place reuse, as training does, so it does not combine with --no-inplace",
                      "drop --no-inplace");
    // --fit plans model.remat = auto's choices whatever the configuration's remat, so it is
    // checked as auto (model.head_chunk = auto needs it).
    Config c = a->fit ? a->config.load({"model.remat=auto"}) : a->config.load();
    // Under mpirun each rank runs on its share of the cores (Open MPI binds each to its own when
    // there are enough), so a rank of N plans the threads it will have.
    if (a->ranks > 1 && c.threads == 0) c.threads = std::max(1, resolve_threads(0) / a->ranks);
    if (a->fit || (!a->html.empty() && c.model.remat.has(RematRegion::auto_))) {
      const Frontier r = fit_frontier(c, budget, a->ranks);
      if (!a->html.empty()) write_memory_html(r.planned, a->html, &r.fit);
      if (a->fit) {
        print_fit(r, a->json, a->ranks);
        return 0;
      }
    } else if (!a->html.empty()) {
      write_memory_html(c, a->html);
    }
    const PlanOptions popts{.inplace = !a->no_inplace, .reuse = true, .grad_release = {}};
    if (a->sweeps.empty())
      print_one(c, a->json, budget, popts, a->ranks);
    else
      print_sweep(*a, budget, popts);
    return 0;
  };
}

}  // namespace loom::cli
