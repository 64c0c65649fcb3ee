// Subcommand registration: each cmd_*.cpp adds its subcommands to the app; their callbacks parse
// nothing themselves beyond flags, load the recipe and call one engine entry point.
#pragma once
#include <CLI/CLI.hpp>

namespace colossal::app {

void add_train_commands(CLI::App& app);   // train, finetune
void add_infer_command(CLI::App& app);    // infer
void add_data_commands(CLI::App& app);    // data tokenizer | prepare | prepare-recipe
void add_profile_command(CLI::App& app);  // profile
void add_quantize_command(CLI::App& app); // quantize
void add_serve_command(CLI::App& app);    // serve

// The exit code a subcommand asks for (callbacks cannot return one through CLI11).
void set_exit_code(int code);
int exit_code();

}  // namespace colossal::app
