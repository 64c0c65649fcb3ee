// colossal: one binary for training, finetuning and running large models. Every failure the user can
// cause ends here as one "error: ..." line and a non-zero exit.
#include <c10/util/Exception.h>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <unistd.h>

#include "apps/colossal/commands.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/weight_streams.h"
#include "src/core/device.h"
#include "src/core/error.h"
#include "src/dist/launcher.h"
#include "src/memory/huge_pages.h"

namespace {

// The one line a failure prints. In a job of several ranks it says which rank and node ended, and it
// is also left where the launcher reads it (launcher.h), so the launcher's own line can quote it.
int fail(const std::string& message) {
  std::string line = message;
  const char* rank = std::getenv("RANK");
  const char* world = std::getenv("WORLD_SIZE");
  if (rank && world && std::string(world) != "1" && line.rfind("rank ", 0) != 0)
    line = "rank " + std::string(rank) + " (node " + colossal::host_name() + "): " + line;
  std::fprintf(stderr, "error: %s\n", line.c_str());
  colossal::dist::write_failure_report(line);
  return 1;
}

}  // namespace

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
  colossal::app::add_profile_command(app);
  colossal::app::add_quantize_command(app);
  colossal::app::add_serve_command(app);
  try {
    colossal::kernels::active_isa();       // a bad COLOSSAL_CPU_ISA fails here, before any work
    colossal::kernels::weight_streams();   // and a bad COLOSSAL_WEIGHT_STREAMS
    colossal::memory::huge_pages_wanted(false);   // and a bad COLOSSAL_HUGE_PAGES
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {   // includes --help and --version (CLI::Success)
    return app.exit(e);
  } catch (const colossal::Error& e) {
    return fail(e.what());
  } catch (const c10::Error& e) {
    return fail(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  // Every command's objects are gone by here (files closed, checkpoints renamed into place, the kernel
  // cache written); what exit() would still run is the libraries' static destructors, LibTorch's
  // thousands of operator registrations among them, and running them faults their code in from the
  // shared objects: the process's resident memory rose by ~95 MB of file pages in its last tens of
  // milliseconds, past everything it had held while working (`colossal infer` of the int8 124M
  // checkpoint: peak RSS 570-590 MB, 502 MB ending here; int4 517 -> 455). AddressSanitizer's leak
  // check runs at exit, so those builds return.
  std::fflush(nullptr);
#if defined(__SANITIZE_ADDRESS__)
  return colossal::app::exit_code();
#else
  std::_Exit(colossal::app::exit_code());
#endif
}
