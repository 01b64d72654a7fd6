#include "metrics/metric_text.hpp"

#include <charconv>
#include <cmath>

#include "ddprun/common/error.hpp"

namespace ddprun::agent {
namespace {

// A label value with \, " and newline escaped, as the format asks.
std::string escaped(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// Shortest text that reads back as the same double; integers without a decimal point.
std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v < 0 ? "-Inf" : "+Inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

}  // namespace

void MetricText::declare(const std::string& name, const std::string& help, Type type) {
  std::lock_guard<std::mutex> lk(mu_);
  families_.push_back(Family{name, help, type, {}});
}

MetricText::Family& MetricText::family(const std::string& name) {
  for (auto& f : families_) {
    if (f.name == name) return f;
  }
  throw Error("metrics: no family '" + name + "' declared");
}

void MetricText::set(const std::string& name, const Labels& labels, double value) {
  std::lock_guard<std::mutex> lk(mu_);
  family(name).values[labels] = value;
}

double MetricText::get(const std::string& name, const Labels& labels) const {
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& f : families_) {
    if (f.name != name) continue;
    auto it = f.values.find(labels);
    return it == f.values.end() ? 0 : it->second;
  }
  return 0;
}

void MetricText::remove(const std::string& name, const Labels& labels) {
  std::lock_guard<std::mutex> lk(mu_);
  family(name).values.erase(labels);
}

std::string MetricText::text() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::string out;
  for (const auto& f : families_) {
    out += "# HELP " + f.name + " " + f.help + "\n";
    out += "# TYPE " + f.name + (f.type == Type::counter ? " counter\n" : " gauge\n");
    for (const auto& [labels, value] : f.values) {
      out += f.name;
      if (!labels.empty()) {
        out += '{';
        bool first = true;
        for (const auto& [k, v] : labels) {
          out += (first ? "" : ",") + k + "=\"" + escaped(v) + "\"";
          first = false;
        }
        out += '}';
      }
      out += " " + number(value) + "\n";
    }
  }
  return out;
}

}  // namespace ddprun::agent
