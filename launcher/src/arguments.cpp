#include "arguments.hpp"

#include <algorithm>

#include <boost/program_options.hpp>

#include "option_table.hpp"

namespace ddprun::launcher {
namespace {

namespace po = boost::program_options;

bool takes_value(const OptionSpec& o) { return o.kind == OptionKind::value; }

// The table's option named `name` ("--max_restarts", "max_restarts" or "r"), or nullptr.
const OptionSpec* find_option(std::string name) {
  name.erase(0, name.find_first_not_of('-'));
  for (const auto& o : option_table()) {
    if (name == o.name || (name.size() == 1 && name == o.short_name)) return &o;
  }
  return nullptr;
}

void record(ParsedArgs& out, const OptionSpec& o, const std::string* value) {
  const std::string name = o.name;
  if (out.values.count(name) || out.flags.count(name)) usage("option '--" + name + "' cannot be specified more than once");
  if (value) {
    out.values[name] = *value;
  } else {
    out.flags.insert(name);
  }
}

// The table as Boost.Program_options reads it: every option with its short name; a value
// option takes one string (checked by the table's parser later), a switch none.
const po::options_description& description() {
  static const po::options_description desc = [] {
    po::options_description d;
    for (const auto& o : option_table()) {
      const std::string names = *o.short_name ? std::string(o.name) + "," + o.short_name : std::string(o.name);
      if (takes_value(o)) {
        d.add_options()(names.c_str(), po::value<std::string>());
      } else {
        d.add_options()(names.c_str(), "");
      }
    }
    return d;
  }();
  return desc;
}

// torchrun's spellings and argparse's reading, as styles: --name=value and --name value, -r3 and
// -r 3, switches sharing a word (-mr3: -m, then -r 3); no abbreviations.
constexpr int kStyle = po::command_line_style::allow_long | po::command_line_style::long_allow_adjacent |
                       po::command_line_style::long_allow_next | po::command_line_style::allow_short |
                       po::command_line_style::allow_dash_for_short | po::command_line_style::short_allow_adjacent |
                       po::command_line_style::short_allow_next | po::command_line_style::allow_sticky;

// Runs before Boost's own readers on each word where an option may stand: --name-with-hyphens
// read as --name_with_hyphens; the first word that is not an option (or the words after --) is
// the training program, which takes every word left. `last`: the last option word as the user wrote it.
std::vector<po::option> program_and_spellings(std::vector<std::string>& args, std::string& last) {
  const std::string& a = args.front();
  if (a != "--" && a.size() >= 2 && a[0] == '-') {
    last = a;
    args.front() = normalize_option(a);
    // --name= gives the empty value, as argparse does (Boost refuses an empty adjacent value);
    // the table's parser then judges it.
    const std::string& n = args.front();
    if (n.size() > 3 && n.rfind("--", 0) == 0 && n.back() == '=') {
      if (const OptionSpec* o = find_option(n.substr(0, n.size() - 1)); o && takes_value(*o)) {
        po::option empty;
        empty.string_key = o->name;
        empty.value = {""};
        empty.original_tokens = {n};
        args.erase(args.begin());
        return {empty};
      }
    }
    return {};  // (changed in place: Boost's readers take it)
  }
  std::vector<po::option> program;
  for (auto it = args.begin() + (a == "--" ? 1 : 0); it != args.end(); ++it) {
    po::option word;
    word.value = {*it};
    word.original_tokens = {*it};
    program.push_back(word);
  }
  args.clear();
  return program;
}

// Boost's errors in the words ddprun has always used.
[[noreturn]] void explain(const po::error& e, const std::string& word) {
  if (dynamic_cast<const po::unknown_option*>(&e)) {
    const bool later_in_group = word.size() > 2 && word[0] == '-' && word[1] != '-';
    const bool first_known = later_in_group && word[1] != static_cast<const po::unknown_option&>(e).get_option_name().back();
    usage((first_known ? "unrecognised option '" : "unknown option '") + word + "'");
  }
  if (auto* syntax = dynamic_cast<const po::invalid_command_line_syntax*>(&e)) {
    std::string name = syntax->get_option_name();
    if (auto* o = find_option(name)) name = std::string("--") + o->name;
    if (syntax->kind() == po::invalid_syntax::extra_parameter) usage("option '" + name + "' does not take any arguments");
    if (syntax->kind() == po::invalid_syntax::missing_parameter) usage("option '" + name + "' needs a value");
  }
  usage(e.what());
}

}  // namespace

ParsedArgs parse_arguments(const std::vector<std::string>& args) {
  ParsedArgs out;
  std::string word;
  po::parsed_options parsed(nullptr);
  try {
    parsed = po::command_line_parser(args)
                 .options(description())
                 .style(kStyle)
                 .extra_style_parser([&word](std::vector<std::string>& rest) { return program_and_spellings(rest, word); })
                 .run();
  } catch (const po::error& e) {
    explain(e, word);
  }
  for (const auto& o : parsed.options) {
    if (o.string_key.empty()) {
      out.program.push_back(o.value.front());
      continue;
    }
    const OptionSpec& spec = *find_option(o.string_key);
    record(out, spec, takes_value(spec) ? &o.value.front() : nullptr);
  }
  return out;
}

namespace {

// Words of `text` in lines of at most `width` characters.
std::vector<std::string> wrap(const std::string& text, std::size_t width) {
  std::vector<std::string> lines;
  std::string line;
  std::size_t i = 0;
  while (i < text.size()) {
    std::size_t end = text.find(' ', i);
    if (end == std::string::npos) end = text.size();
    std::string word = text.substr(i, end - i);
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      lines.push_back(line);
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    i = end + 1;
  }
  if (!line.empty() || lines.empty()) lines.push_back(line);
  return lines;
}

}  // namespace

std::string options_help() {
  constexpr std::size_t kColumn = 40, kWidth = 39;
  std::vector<std::string> groups;
  for (const auto& o : option_table()) {
    if (std::find(groups.begin(), groups.end(), o.group) == groups.end()) groups.push_back(o.group);
  }
  std::string text = "ddprun options:\n";
  for (const auto& g : groups) {
    text += "\n" + g + ":\n";
    for (const auto& o : option_table()) {
      if (g != o.group) continue;
      std::string head = "  ";
      head += *o.short_name ? "-" + std::string(o.short_name) + " [ --" + o.name + " ]" : "--" + std::string(o.name);
      if (takes_value(o)) head += " arg";
      if (takes_value(o) && o.parse && *o.default_value) head += " (=" + std::string(o.default_value) + ")";
      auto lines = wrap(o.help, kWidth);
      if (head.size() + 1 > kColumn) {
        text += head + "\n";
        head.clear();
      }
      for (const auto& line : lines) {
        text += head + std::string(kColumn - head.size(), ' ') + line + "\n";
        head.clear();
      }
    }
  }
  return text;
}

}  // namespace ddprun::launcher
