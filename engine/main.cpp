// main.cpp — the `ddp` command. The only place that exits.
//   ddp run CONFIG [--set section.key=value]...
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>

#include "config.h"
#include "launcher.h"

int main(int argc, char** argv) {
  CLI::App app{"ddp: data-parallel training with plugin strategies and transports"};
  app.set_version_flag("--version", "ddp 0.1.0 (plugin ABI 1.0)");
  app.require_subcommand(1);
  std::string config_path;
  std::vector<std::string> overrides;
  CLI::App* run = app.add_subcommand("run", "train as the TOML file says (starts run.world_size ranks)");
  run->add_option("config", config_path, "the run's TOML file")->required();
  run->add_option("--set", overrides, "override a key: section.key=value (TOML value; repeatable)")
      ->take_all();
  CLI11_PARSE(app, argc, argv);

  try {
    ddp::Config config = ddp::load_config(config_path, overrides);
    if (std::getenv("RANK")) return ddp::run_as_rank(config);
    return ddp::launch_local(config, config_path, overrides);
  } catch (const std::exception& e) {
    std::cerr << "ddp: error: " << e.what() << std::endl;
    return 1;
  }
}
