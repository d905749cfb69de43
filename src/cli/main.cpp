// `nereus`: the command-line front end.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "commands.hpp"
#include "nereus/base/error.hpp"
#include "nereus/base/log.hpp"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv, argv + argc);
  CLI::App app{"Nereus: adaptive parallelism for LLM post-training"};
  app.require_subcommand(1);
  app.fallthrough();  // --log-level also after the subcommand
  app.add_option("--log-level", "error | warn | info | debug | trace (default warn, or $NEREUS_LOG); info shows the controller's decisions")
      ->each([](const std::string& v) { nereus::refusing_input([&] { nereus::set_log_level(nereus::parse_log_level(v)); }); });
  nereus::cli::add_plan_command(app);
  nereus::cli::add_model_command(app);
  nereus::cli::add_presets_command(app);
  nereus::cli::add_search_command(app);
  nereus::cli::add_simulate_command(app);
  nereus::cli::add_cluster_command(app);
  nereus::cli::add_bench_command(app, args);
  try {
    nereus::init_logging("nereus", -1, nereus::LogLevel::warn);
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // the command printed its own error
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const nereus::InputError& e) {  // refused before anything ran
    std::fprintf(stderr, "nereus: error: %s\n", e.what());
    return 2;
  } catch (const nereus::Error& e) {
    std::fprintf(stderr, "nereus: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nereus: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
