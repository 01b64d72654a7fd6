#include "ddprun/common/text.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace ddprun {

std::optional<long long> parse_int(std::string_view s) noexcept {
  if (s.empty()) return std::nullopt;
  long long v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<long long> parse_int(std::string_view s, long long lo, long long hi) noexcept {
  auto v = parse_int(s);
  if (!v || *v < lo || *v > hi) return std::nullopt;
  return v;
}

std::optional<double> parse_double(std::string_view s) noexcept {
  if (s.empty()) return std::nullopt;
  for (char c : s) {  // decimal only: strtod would take hex ("0x10", "0x1p3"), "inf", "nan", spaces
    if (!std::isdigit(static_cast<unsigned char>(c)) && c != '.' && c != 'e' && c != 'E' && c != '+' && c != '-') {
      return std::nullopt;
    }
  }
  std::string copy(s);
  char* end = nullptr;
  double v = std::strtod(copy.c_str(), &end);
  if (end != copy.c_str() + copy.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::string escape_for_log(std::string_view bytes, std::size_t max_bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  auto shown = bytes.substr(0, max_bytes);
  std::string out;
  out.reserve(shown.size() + 16);
  for (char ch : shown) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c >= 0x7f) {
          out += "\\x";
          out += kHex[c >> 4];
          out += kHex[c & 0xf];
        } else {
          out += ch;
        }
    }
  }
  if (shown.size() < bytes.size()) out += "... (" + std::to_string(bytes.size()) + " bytes)";
  return out;
}

std::string duration_text(std::chrono::milliseconds d) {
  auto ms = d.count();
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  if (ms > -1000 && ms < 1000) return std::to_string(ms) + " ms";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", static_cast<double>(ms) / 1000.0);
  return buf;
}

std::string format_address(const std::string& host, std::uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  std::size_t start = 0;
  for (;;) {
    auto pos = s.find(sep, start);
    out.emplace_back(s.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) return out;
    start = pos + 1;
  }
}

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  return std::string(s);
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// A quote opens a value where no letter or digit comes before it, and closes one where none
// comes after it: the apostrophe of "node's" does neither.
std::string shorten_quoted(const std::string& message, std::size_t max) {
  const auto word = [&](std::size_t i) { return std::isalnum(static_cast<unsigned char>(message[i])) != 0; };
  const auto quote = [&](std::size_t from, bool opening) {
    for (auto i = message.find('\'', from); i != std::string::npos; i = message.find('\'', i + 1)) {
      if (opening ? i == 0 || !word(i - 1) : i + 1 == message.size() || !word(i + 1)) return i;
    }
    return std::string::npos;
  };
  std::string out;
  std::size_t at = 0;
  for (;;) {
    const auto open = quote(at, true);
    const auto close = open == std::string::npos ? open : quote(open + 1, false);
    if (close == std::string::npos) break;
    const auto len = close - open - 1;
    out.append(message, at, open + 1 - at);
    out += len <= max ? message.substr(open + 1, len)
                      : message.substr(open + 1, 60) + "... (" + std::to_string(len) + " bytes)";
    out += '\'';
    at = close + 1;
  }
  out.append(message, at, std::string::npos);
  constexpr std::size_t kMost = 4096;
  if (out.size() > kMost) out = out.substr(0, kMost - 96) + "... (the message cut: " + std::to_string(out.size()) + " bytes)";
  return out;
}

}  // namespace ddprun
