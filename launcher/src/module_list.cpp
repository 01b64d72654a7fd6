#include <cctype>
#include <string>

#include "options.hpp"

namespace ddprun::launcher {

// "numpy, mypkg.models" -> the same, checked: comma-separated Python module names (dotted
// identifiers), so that a warm spare is never asked to import anything else.
std::string parse_module_list(const std::string& flag, const std::string& v) {
  std::size_t start = 0;
  while (start <= v.size()) {
    std::size_t end = v.find(',', start);
    if (end == std::string::npos) end = v.size();
    std::string name = v.substr(start, end - start);
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    bool ok = !name.empty() || v.empty();
    for (std::size_t i = 0; ok && i < name.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(name[i]);
      const bool part_start = i == 0 || name[i - 1] == '.';
      ok = c == '_' || std::isalpha(c) || (!part_start && (std::isdigit(c) || c == '.'));
      if (c == '.' && (i + 1 == name.size())) ok = false;
    }
    if (!ok) usage("--" + flag + "='" + v + "': '" + name + "' is not a Python module name (expected NAME[,NAME...], e.g. numpy,mypkg.models)");
    start = end + 1;
  }
  return v;
}

}  // namespace ddprun::launcher
