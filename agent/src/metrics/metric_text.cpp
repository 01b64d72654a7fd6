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
  families_.push_back(Family{name, help, type, {}, {}, {}});
}

void MetricText::declare_histogram(const std::string& name, const std::string& help, std::vector<double> bounds) {
  std::lock_guard<std::mutex> lk(mu_);
  families_.push_back(Family{name, help, Type::histogram, {}, std::move(bounds), {}});
}

void MetricText::observe(const std::string& name, const Labels& labels, double value) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& f = family(name);
  auto& h = f.hists[labels];
  h.counts.resize(f.bounds.size());
  for (std::size_t i = 0; i < f.bounds.size(); ++i) {
    if (value <= f.bounds[i]) ++h.counts[i];
  }
  h.sum += value;
  ++h.count;
}

namespace {
std::string label_text(const MetricText::Labels& labels, const std::string& le = "") {
  std::string out;
  bool first = true;
  for (const auto& [k, v] : labels) {
    out += (first ? "" : ",") + k + "=\"" + escaped(v) + "\"";
    first = false;
  }
  if (!le.empty()) out += (first ? "" : ",") + std::string("le=\"") + le + "\"";
  return out.empty() ? out : "{" + out + "}";
}
}  // namespace

void MetricText::write_histogram(const Family& f, std::string& out) {
  for (const auto& [labels, h] : f.hists) {
    for (std::size_t i = 0; i < f.bounds.size(); ++i) {
      out += f.name + "_bucket" + label_text(labels, number(f.bounds[i])) + " " + std::to_string(h.counts[i]) + "\n";
    }
    out += f.name + "_bucket" + label_text(labels, "+Inf") + " " + std::to_string(h.count) + "\n";
    out += f.name + "_sum" + label_text(labels) + " " + number(h.sum) + "\n";
    out += f.name + "_count" + label_text(labels) + " " + std::to_string(h.count) + "\n";
  }
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
    out += "# TYPE " + f.name +
           (f.type == Type::counter ? " counter\n" : f.type == Type::histogram ? " histogram\n" : " gauge\n");
    if (f.type == Type::histogram) {
      write_histogram(f, out);
      continue;
    }
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
