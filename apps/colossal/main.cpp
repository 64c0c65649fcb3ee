// colossal: one binary for training, finetuning and running large models. Every failure the user can
// cause ends here as one "error: ..." line and a non-zero exit.
#include <c10/util/Exception.h>
#include <cstdio>
#include <exception>

#include "apps/colossal/commands.h"
#include "kernels/cpu/isa.h"
#include "src/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"colossal: train, finetune and run large models (GPT family) from TOML recipes"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "colossal 0.1.0");
  // A bad flag ends like every other bad input: one "error:" line (CLI11's default adds a second).
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "error: " + std::string(e.what()) + " (see --help)\n";
  });
  colossal::app::add_train_commands(app);
  colossal::app::add_infer_command(app);
  colossal::app::add_data_commands(app);
  try {
    colossal::kernels::active_isa();   // a bad COLOSSAL_CPU_ISA fails here, before any work
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {   // includes --help and --version (CLI::Success)
    return app.exit(e);
  } catch (const colossal::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return colossal::app::exit_code();
}
