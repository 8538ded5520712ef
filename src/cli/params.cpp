// `loom params CONFIG [overrides]`: the parameter table of the configured model; nothing runs.
#include <fmt/format.h>

#include <memory>

#include "cli/command.h"
#include "nn/models.h"
#include "report/params.h"

namespace loom::cli {

CommandBody add_params_command(CLI::App& sub) {
  auto args = std::make_shared<ConfigArgs>();
  args->add(sub, /*required=*/true, "section.key=value overrides");
  return [args] {
    const Config c = args->load();
    const nn::ModelGraph m = nn::build_model(c.model, model_input(c, c.data.batch_size), /*train=*/false);
    fmt::print("{}", nn::summarize(m));
    return 0;
  };
}

}  // namespace loom::cli
