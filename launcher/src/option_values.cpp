#include <cctype>
#include <cmath>
#include <limits>
#include <string>

#include "ddprun/common/error.hpp"
#include "ddprun/common/net.hpp"
#include "ddprun/common/text.hpp"
#include "option_table.hpp"

// The parsers of one kind of value that option_table.cpp's table, cli.cpp and rdzv_flags.cpp share.
namespace ddprun::launcher {

std::string shorten(const std::string& v) { return v.size() <= 64 ? v : v.substr(0, 60) + "..."; }

std::chrono::milliseconds parse_seconds(const std::string& flag, const std::string& v, bool allow_zero) {
  auto d = parse_double(v);
  if (!d || *d < 0 || (!allow_zero && *d == 0)) {
    usage("--" + flag + " must be a " + std::string(allow_zero ? "non-negative" : "positive") +
          " number of seconds (got '" + shorten(v) + "')");
  }
  if (*d > 1e7) usage("--" + flag + " must be at most 10000000 seconds, about 115 days (got '" + shorten(v) + "')");
  const auto ms = static_cast<long long>(*d * 1000.0 + 0.5);
  if (*d > 0 && ms == 0) {  // (rounded to 0, it would mean "off" or "at once")
    usage("--" + flag + " is under a millisecond (got '" + v + "'): give 0.001 or more" + (allow_zero ? ", or 0" : ""));
  }
  return std::chrono::milliseconds(ms);
}

int parse_count(const std::string& flag, const std::string& v, bool allow_zero) {
  auto n = parse_int(v, allow_zero ? 0 : 1, 1'000'000);
  if (!n && parse_int(v, 1'000'001, std::numeric_limits<long long>::max())) {
    usage("--" + flag + " must be at most 1000000 (got '" + shorten(v) + "')");
  }
  if (!n) usage("--" + flag + " must be " + (allow_zero ? "a non-negative" : "a positive") + " integer (got '" + shorten(v) + "')");
  return static_cast<int>(*n);
}

long long parse_size(const std::string& flag, const std::string& v) {
  std::string number = v, unit;
  while (!number.empty() && std::isalpha(static_cast<unsigned char>(number.back()))) {
    unit.insert(unit.begin(), static_cast<char>(std::toupper(static_cast<unsigned char>(number.back()))));
    number.pop_back();
  }
  if (unit.size() > 1 && (unit.substr(1) == "B" || unit.substr(1) == "IB")) unit = unit.substr(0, 1);
  if (unit == "B") unit.clear();
  const std::string units = "KMGT";
  const auto at = unit.empty() ? std::string::npos : units.find(unit);
  auto d = parse_double(number);
  if (!d || *d < 0 || (unit.size() > 1 || (!unit.empty() && at == std::string::npos))) {
    usage("--" + flag + " must be a size such as 4G, 512M or 1073741824 (bytes), or 0 (got '" + shorten(v) + "')");
  }
  double bytes = *d;
  if (at != std::string::npos) {
    for (std::size_t i = 0; i <= at; ++i) bytes *= 1024;
  }
  if (bytes > 9.0e18) usage("--" + flag + " is too large (got '" + shorten(v) + "')");
  if (bytes != std::floor(bytes) && (at == std::string::npos || bytes < 1)) {
    usage("--" + flag + " must be a whole number of bytes (got '" + shorten(v) + "'; a fraction takes a unit: 0.5G)");
  }
  return static_cast<long long>(bytes);
}

// "host", "host:port", "[v6]:port", "[v6]".
std::pair<std::string, std::uint16_t> parse_endpoint(const std::string& v, std::uint16_t default_port) {
  auto bad = [&](const std::string& why) {
    usage("--rdzv_endpoint='" + shorten(v) + "' is malformed: " + why + " (expected HOST[:PORT], e.g. node0:29400 or [::1]:29400)");
  };
  if (v.empty()) bad("empty");
  if (v.find(',') != std::string::npos) bad("a list; the c10d and static rendezvous take one endpoint (etcd takes a list)");
  std::string host, port;
  bool has_port = false;
  if (v[0] == '[') {
    auto close = v.find(']');
    if (close == std::string::npos) bad("missing ']'");
    host = v.substr(1, close - 1);
    std::string rest = v.substr(close + 1);
    if (!rest.empty() && rest[0] != ':') bad("unexpected text after ']'");
    has_port = !rest.empty();
    if (has_port) port = rest.substr(1);
  } else {
    auto colon = v.rfind(':');
    if (colon != std::string::npos && v.find(':') != colon) bad("IPv6 addresses need brackets");
    host = colon == std::string::npos ? v : v.substr(0, colon);
    has_port = colon != std::string::npos;
    if (has_port) port = v.substr(colon + 1);
  }
  if (has_port && port.empty()) bad("empty port");
  if (host.empty()) bad("empty host");
  if (auto why = host_name_problem(host); !why.empty()) bad(why);
  if (!has_port) return {host, default_port};
  auto n = parse_int(port, 0, 65535);
  if (!n) bad("port must be 0-65535");
  return {host, static_cast<std::uint16_t>(*n)};
}

// "numpy, mypkg.models" -> the same, checked: comma-separated Python module names (dotted
// identifiers), so that a warm spare is never asked to import anything else.
std::string parse_module_list(const std::string& flag, const std::string& v) {
  if (v.empty()) return v;
  for (const auto& part : split(v, ',')) {
    const std::string name = trim(part);
    bool ok = !name.empty();
    for (std::size_t i = 0; ok && i < name.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(name[i]);
      const bool part_start = i == 0 || name[i - 1] == '.';
      ok = c == '_' || std::isalpha(c) || (!part_start && (std::isdigit(c) || c == '.'));
      if (c == '.' && i + 1 == name.size()) ok = false;
    }
    if (!ok) usage("--" + flag + "='" + v + "': '" + name + "' is not a Python module name (expected NAME[,NAME...], e.g. numpy,mypkg.models)");
  }
  return v;
}

}  // namespace ddprun::launcher
