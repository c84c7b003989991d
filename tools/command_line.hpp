// The command line of every program in this repository (the launcher, the examples, the
// benchmarks), parsed by CLI11 compiled once: CLI11 2.1 is header-only, and each program that
// called App::parse compiled its parser again (4 s of CPU per program at -O3, 12 s under ASan).
#pragma once

#include <CLI/CLI.hpp>

#include <optional>

namespace pscoro::tools {

/// Parses `argv` into `app`, as CLI11_PARSE does. Returns the exit code when the program is to
/// stop now: 0 after --help (printed), non-zero for a bad command line (its message printed).
/// `if (const auto stop = pscoro::tools::parse_command_line(app, argc, argv)) return *stop;`
std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv);

}  // namespace pscoro::tools
