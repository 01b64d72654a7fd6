#pragma once
// ddprun's own command line, read against the option table (option_table.hpp): torchrun's spellings
// (--name=value, --name value, -r3, -r 3, --name-with-hyphens), the training program from the first
// argument that is not an option (or after --), and the --help text. Read by Boost.Program_options,
// as ddprun-store's command line is; the table is the one description of both the parser and
// --help, the man page, the bash completion and the PET_ variables.

#include <map>
#include <set>
#include <string>
#include <vector>

namespace ddprun::launcher {

struct ParsedArgs {
  std::map<std::string, std::string> values;  // value options given, by the table's name
  std::set<std::string> flags;                // switches and actions given (help, version)
  std::vector<std::string> program;           // the training program and its arguments
};

// Throws UsageError (usage()) for an unknown option, a value missing or given to a switch, and an
// option given twice.
ParsedArgs parse_arguments(const std::vector<std::string>& args);

// The options part of --help: each group of the table, each option with its value and default,
// descriptions wrapped in a column.
std::string options_help();

}  // namespace ddprun::launcher
