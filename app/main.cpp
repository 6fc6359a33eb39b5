// `strata`: one program, one subcommand per job. Each subcommand's callback sets the exit code.
// The runtime's commands come from runtime/cli, `strata bench ...` from bench/.
#include <strata/strata.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "bench_commands.h"
#include "cli/commands.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"Strata: fine-tune models larger than GPU memory and host RAM"};
  app.set_version_flag("--version", std::string("strata ") + strata_version());
  app.require_subcommand(1);

  strata::cli::add_doctor_command(app);
  strata::cli::add_plan_command(app);

  CLI::App* bench =
      app.add_subcommand("bench", "Benchmarks that run their competitor side by side");
  bench->require_subcommand(1);
  strata::bench::add_io_command(*bench);
  strata::bench::add_pool_command(*bench);
  strata::bench::add_pinned_map_command(*bench);
  strata::bench::add_adam_command(*bench);
  strata::bench::add_optimizer_command(*bench);
  strata::bench::add_copy_command(*bench);
  strata::bench::add_finetune_command(*bench);

  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    return app.exit(e);  // a command's own exit status: its callback throws it (plan's 3, ...)
  } catch (const CLI::ParseError& e) {
    // Help and version exit 0. Every other refusal of the parser (an unknown flag, a value that
    // is not a number or is out of its range) is bad input, which exits 2 with the reason on
    // stderr as every command's own checks do (docs/planner.md, "Exit status"), not with
    // CLI11's own codes (104-109).
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A command's own failures are exit codes; what escapes is a bug or the host out of memory.
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata: unexpected error: %s\n", e.what());
    return 70;  // EX_SOFTWARE
  } catch (...) {
    std::fprintf(stderr, "strata: unexpected error\n");
    return 70;
  }
}
