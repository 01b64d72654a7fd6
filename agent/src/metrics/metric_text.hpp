#pragma once
// Metrics in Prometheus' text exposition format (version 0.0.4): families of gauges and counters,
// each value under its labels. What the agent shows (metrics.hpp) needs no more than this, and
// writing it here saves every launch the loading of a C++ metrics library.
// Thread-safe: one mutex; the loop sets values, the HTTP server's thread writes the text.

#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace ddprun::agent {

class MetricText {
 public:
  using Labels = std::map<std::string, std::string>;  // written in key order
  enum class Type { gauge, counter, histogram };

  // Declares a family; families are written in the order declared, each with its HELP and TYPE
  // lines (also while it has no value).
  void declare(const std::string& name, const std::string& help, Type type = Type::gauge);
  // A histogram family with these upper bounds (ascending; +Inf is added).
  void declare_histogram(const std::string& name, const std::string& help, std::vector<double> bounds);
  // One sample of a histogram family under `labels`.
  void observe(const std::string& name, const Labels& labels, double value);
  // Sets (creating) the value of a declared family under `labels`.
  void set(const std::string& name, const Labels& labels, double value);
  void set(const std::string& name, double value) { set(name, Labels{}, value); }
  // The value, or 0 when there is none.
  double get(const std::string& name, const Labels& labels = {}) const;
  void remove(const std::string& name, const Labels& labels);
  // Every family, as Prometheus reads it.
  std::string text() const;

 private:
  struct Family {
    std::string name, help;
    Type type = Type::gauge;
    std::map<Labels, double> values;
    std::vector<double> bounds;  // histogram: upper bounds
    struct Hist {
      std::vector<unsigned long long> counts;  // cumulative, per bound
      double sum = 0;
      unsigned long long count = 0;
    };
    std::map<Labels, Hist> hists;
  };
  static void write_histogram(const Family& f, std::string& out);
  Family& family(const std::string& name);  // a declared one; mu_ held

  mutable std::mutex mu_;
  std::vector<Family> families_;
};

}  // namespace ddprun::agent
