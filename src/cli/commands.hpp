#pragma once
// Sub-commands of the `nereus` front end. Each registers its options and a callback
// that throws nereus::Error on bad input.
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace nereus::cli {

void add_plan_command(CLI::App& app);
void add_model_command(CLI::App& app);
void add_presets_command(CLI::App& app);
void add_search_command(CLI::App& app);
void add_simulate_command(CLI::App& app);
void add_cluster_command(CLI::App& app);
/// `argv` is the whole command line (workers are started with it).
void add_bench_command(CLI::App& app, const std::vector<std::string>& argv);

}  // namespace nereus::cli
