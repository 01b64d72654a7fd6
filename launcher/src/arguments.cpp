#include "arguments.hpp"

#include <algorithm>

#include "options.hpp"

namespace ddprun::launcher {
namespace {

const OptionSpec* find_long(const std::string& name) {
  for (const auto& o : option_table()) {
    if (name == o.name) return &o;
  }
  return nullptr;
}

const OptionSpec* find_short(char c) {
  for (const auto& o : option_table()) {
    if (o.short_name[0] == c && o.short_name[1] == '\0') return &o;
  }
  return nullptr;
}

bool takes_value(const OptionSpec& o) { return o.kind == OptionKind::value; }

void record(ParsedArgs& out, const OptionSpec& o, const std::string* value) {
  const std::string name = o.name;
  if (out.values.count(name) || out.flags.count(name)) usage("option '--" + name + "' cannot be specified more than once");
  if (value) {
    out.values[name] = *value;
  } else {
    out.flags.insert(name);
  }
}

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

// Short options, as argparse and getopt read them: switches may share a word (-mt3: -m, then -t 3);
// a value option takes the rest of the word, or the next argument. Returns the last index used.
std::size_t short_options(const std::vector<std::string>& args, std::size_t i, ParsedArgs& out) {
  const std::string& a = args[i];
  for (std::size_t k = 1; k < a.size(); ++k) {
    const OptionSpec* o = find_short(a[k]);
    if (!o) usage(k == 1 ? "unknown option '" + a + "'" : "unrecognised option '" + a + "'");
    if (!takes_value(*o)) {
      record(out, *o, nullptr);
      continue;
    }
    std::string value = a.substr(k + 1);
    if (value.empty()) {
      if (i + 1 >= args.size()) usage("option '" + a + "' needs a value");
      value = args[++i];
    }
    record(out, *o, &value);
    break;
  }
  return i;
}

}  // namespace

ParsedArgs parse_arguments(const std::vector<std::string>& args) {
  ParsedArgs out;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string a = normalize_option(args[i]);
    if (a == "--") {
      out.program.assign(args.begin() + static_cast<long>(i) + 1, args.end());
      break;
    }
    if (a.size() < 2 || a[0] != '-') {
      out.program.assign(args.begin() + static_cast<long>(i), args.end());
      break;
    }
    if (a.rfind("--", 0) != 0) {
      i = short_options(args, i, out);
      continue;
    }
    const auto eq = a.find('=');
    const OptionSpec* o = find_long(a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2));
    if (!o) usage("unknown option '" + args[i] + "'");
    if (!takes_value(*o)) {
      if (eq != std::string::npos) usage("option '--" + std::string(o->name) + "' does not take any arguments");
      record(out, *o, nullptr);
      continue;
    }
    std::string value;
    if (eq != std::string::npos) {
      value = a.substr(eq + 1);
    } else {
      if (i + 1 >= args.size()) usage("option '" + args[i] + "' needs a value");
      value = args[++i];
    }
    record(out, *o, &value);
  }
  return out;
}

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
