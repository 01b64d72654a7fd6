// Store benchmark: the same C++ load generator (store_bench_load.hpp) against ddprun-store and
// against PyTorch 1.13's own TCPStore server, in one run, printing the ratio; then the same
// throughput point while one client misbehaves (store_bench_abuse.hpp). With --baseline, also
// this build's ddprun-store against another one, interleaved (what a change costs).
//
// ddprun-store runs as shipped: access control on (same_user: every connection's owner is
// looked up); a barrier row without it shows that cost.
// Usage: store_bench [--duration S] [--conns 1,64,1024] [--barrier 1000,10000] [--rounds R]
//                    [--abuse_conns N] [--store PATH] [--python "CMD..."] [--baseline PATH]
//                    [--only baseline] [--barrier_limit S] [--open_row 0|1]
// --python is the command that runs bench/torch_store_server.py (split at spaces). The generator
// speaks 1.13's numbering, which a 2.x server refuses: bench/torch_barrier.py measures 2.x's
// barrier with PyTorch's own clients.
// Barrier clients connect from ports and loopback addresses of their own (127.0.0.2 up, 20,000 each).

#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fmt/core.h>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "store_bench_abuse.hpp"
#include "store_bench_load.hpp"
#include "store_bench_server.hpp"

namespace {

using namespace store_bench;

struct Options {
  double duration = 2.0;
  std::vector<int> conns = {1, 64, 1024};
  std::vector<int> barriers = {1000, 10000};
  int rounds = 1;
  int abuse_conns = 64;
  std::string store = DDPRUN_STORE_BIN;
  std::string torch_py = DDPRUN_TORCH_STORE_PY;
  std::string python = "/usr/bin/python3";
  double barrier_limit = 300;  // seconds before a barrier is given up, reported as such
  bool open_row = true;        // the barrier again with access control off
  std::string baseline;     // another ddprun-store to compare this one with
  bool only_baseline = false;
};

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    auto comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    if (comma > pos) v.push_back(std::stoi(s.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  return v;
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
    std::string v = argv[++i];
    if (a == "--duration") o.duration = std::stod(v);
    else if (a == "--conns") o.conns = parse_list(v);
    else if (a == "--barrier") o.barriers = parse_list(v);
    else if (a == "--rounds") o.rounds = std::stoi(v);
    else if (a == "--abuse_conns") o.abuse_conns = std::stoi(v);
    else if (a == "--store") o.store = v;
    else if (a == "--python") o.python = v;
    else if (a == "--baseline") o.baseline = v;
    else if (a == "--only" && v == "baseline") o.only_baseline = true;
    else if (a == "--barrier_limit") o.barrier_limit = std::stod(v);
    else if (a == "--open_row") o.open_row = v != "0";
    else throw std::invalid_argument("unknown option " + a);
  }
  return o;
}

std::vector<std::string> split_spaces(const std::string& s) {
  std::vector<std::string> v;
  std::size_t pos = 0;
  while ((pos = s.find_first_not_of(' ', pos)) != std::string::npos) {
    auto end = s.find(' ', pos);
    v.push_back(s.substr(pos, end - pos));
    pos = end;
  }
  return v;
}

int most_clients(const Options& o) {
  int n = o.abuse_conns;
  for (int c : o.conns) n = std::max(n, c);
  for (int c : o.barriers) n = std::max(n, c);
  return n;
}

Server ddprun_store(const Options& o, const std::string& bin, const std::string& name,
                    std::vector<std::string> extra = {}) {
  // The default --max_connections (65,536) is a guard a bigger job raises, as here.
  std::vector<std::string> argv = {bin, "--host", "127.0.0.1", "--port", "0", "--log_level", "warn",
                                   "--max_connections", std::to_string(std::max(65536, most_clients(o) + 1024))};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return Server::spawn(name, argv);
}

std::string pair(double a, double b) { return fmt::format("{:.0f}/{:.0f}", a, b); }

void report_throughput(const Options& o, Server& ours, Server& theirs, int& run) {
  fmt::print("Store throughput: SET/GET/ADD mix, one request in flight per connection, {:.1f} s per point\n",
             o.duration);
  fmt::print("{:>6} | {:>13} | {:>13} | {:>6} | {:>23} | {:>23} | {:>17}\n", "conns", "ddprun ops/s", "torch ops/s",
             "ratio", "SET+GET p50/p99 us", "ADD p50/p99 us", "server CPU us/op");
  fmt::print("{:>6} | {:>13} | {:>13} | {:>6} | {:>23} | {:>23} | {:>17}\n", "", "", "", "", "ddprun / torch",
             "ddprun / torch", "ddprun / torch");
  for (int n : o.conns) {
    for (int r = 0; r < o.rounds; ++r) {
      auto a = throughput(ours, n, o.duration, ++run);
      auto b = throughput(theirs, n, o.duration, ++run);
      fmt::print("{:>6} | {:>13.0f} | {:>13.0f} | {:>5.2f}x | {:>23} | {:>23} | {:>17}\n", n, a.ops_per_s,
                 b.ops_per_s, a.ops_per_s / b.ops_per_s,
                 pair(a.setget.p50, a.setget.p99) + " / " + pair(b.setget.p50, b.setget.p99),
                 pair(a.add.p50, a.add.p99) + " / " + pair(b.add.p50, b.add.p99),
                 fmt::format("{:.2f} / {:.2f}", a.server_us_per_op, b.server_us_per_op));
      std::fflush(stdout);
    }
  }
}

// Barriers against two servers, in turn; prints a row per barrier.
template <typename Row>
void barriers(const Options& o, Server& a, Server& b, int& run, Row&& row) {
  for (int n : o.barriers) {
    for (int r = 0; r < o.rounds; ++r) {
      auto x = barrier(a.port, n, ++run, o.barrier_limit);
      a.wait_idle();
      auto y = barrier(b.port, n, ++run, o.barrier_limit);
      b.wait_idle();
      row(n, x, y);
      std::fflush(stdout);
    }
  }
}

void report_barriers(const Options& o, Server& ours, Server& theirs, int& run) {
  fmt::print("\nBarrier: N clients connect, ADD, the last SETs, all WAIT (time from first connect to last release)\n");
  fmt::print("{:>6} | {:>16} | {:>16} | {:>6}\n", "N", "ddprun s", "torch s", "ratio");
  barriers(o, ours, theirs, run, [](int n, const BarrierResult& a, const BarrierResult& b) {
    auto text = [](const BarrierResult& r) {
      return r.error.empty() ? fmt::format("{:.3f} (conn {:.3f})", r.total_s, r.connect_s) : "failed: " + r.error;
    };
    auto ratio = a.error.empty() && b.error.empty() ? fmt::format("{:>5.1f}x", b.total_s / a.total_s) : "-";
    fmt::print("{:>6} | {:>16} | {:>16} | {:>6}\n", n, text(a), text(b), ratio);
  });
  if (!o.open_row) return;
  fmt::print("\nBarrier with access control off (--same_user false): the cost of the per-connection owner lookup\n");
  fmt::print("{:>6} | {:>16} | {:>16} | {:>6}\n", "N", "same_user on s", "off s", "ratio");
  Server open = ddprun_store(o, o.store, "ddprun-store (no access control)", {"--same_user", "false"});
  barriers(o, ours, open, run, [](int n, const BarrierResult& a, const BarrierResult& b) {
    fmt::print("{:>6} | {:>16.3f} | {:>16.3f} | {:>5.2f}x\n", n, a.total_s, b.total_s, a.total_s / b.total_s);
  });
  open.stop();
}

// One throughput point of `server` while `mode` abuses it; "stalled" when it stops answering.
std::string abused_point(const Options& o, Server& server, Abuse mode, int& run, double& ops) {
  Abuser abuser(mode, server.port);
  if (mode != Abuse::kNone) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // abuse under way
  try {
    ops = throughput(server, o.abuse_conns, o.duration, ++run).ops_per_s;
    return fmt::format("{:.0f}", ops);
  } catch (const std::runtime_error&) {
    ops = 0;
    return "stalled";
  }
}

void report_abuse(const Options& o, Server& ours, Server& theirs, int& run) {
  fmt::print("\nUnder abuse: {} well-behaved connections (as above) while one client misbehaves; ops/s and the\n"
             "ratio to the undisturbed figure of the same server, measured just before; peak server RSS\n",
             o.abuse_conns);
  fmt::print("{:>12} | {:>12} | {:>7} | {:>9} | {:>12} | {:>7} | {:>9}\n", "abuse", "ddprun ops/s", "vs none",
             "peak RSS", "torch ops/s", "vs none", "peak RSS");
  double base_ours = 0, base_theirs = 0;
  for (Abuse mode : {Abuse::kNone, Abuse::kAmplifier, Abuse::kSlowReader}) {
    for (int r = 0; r < o.rounds; ++r) {
      double a = 0, b = 0;
      auto ours_text = abused_point(o, ours, mode, run, a);
      if (mode == Abuse::kNone) base_ours = a;
      std::string theirs_text = "n/a", theirs_ratio, theirs_rss;
      if (mode != Abuse::kAmplifier) {  // 1.13's server has no MULTI_GET
        theirs_text = abused_point(o, theirs, mode, run, b);
        if (mode == Abuse::kNone) base_theirs = b;
        theirs_ratio = fmt::format("{:.2f}x", base_theirs > 0 ? b / base_theirs : 0);
        theirs_rss = fmt::format("{:.0f} MiB", theirs.peak_rss_mib());
      }
      fmt::print("{:>12} | {:>12} | {:>6.2f}x | {:>9} | {:>12} | {:>7} | {:>9}\n", abuse_name(mode), ours_text,
                 base_ours > 0 ? a / base_ours : 0, fmt::format("{:.0f} MiB", ours.peak_rss_mib()), theirs_text,
                 theirs_ratio, theirs_rss);
      std::fflush(stdout);
    }
  }
}

// This build's store against --baseline, points interleaved (baseline, this, baseline, ...).
void report_baseline(const Options& o, int& run) {
  Server before = ddprun_store(o, o.baseline, "ddprun-store (baseline)");
  Server after = ddprun_store(o, o.store, "ddprun-store (this build)");
  fmt::print("\nThis build vs the baseline ({}), interleaved, {:.1f} s per point\n", o.baseline, o.duration);
  fmt::print("{:>6} | {:>15} | {:>15} | {:>6} | {:>21}\n", "conns", "baseline ops/s", "this ops/s", "ratio",
             "server CPU us/op b/t");
  for (int n : o.conns) {
    for (int r = 0; r < o.rounds; ++r) {
      auto b = throughput(before, n, o.duration, ++run);
      auto a = throughput(after, n, o.duration, ++run);
      fmt::print("{:>6} | {:>15.0f} | {:>15.0f} | {:>5.2f}x | {:>21}\n", n, b.ops_per_s, a.ops_per_s,
                 a.ops_per_s / b.ops_per_s, fmt::format("{:.2f} / {:.2f}", b.server_us_per_op, a.server_us_per_op));
      std::fflush(stdout);
    }
  }
  fmt::print("{:>6} | {:>15} | {:>15} | {:>6}\n", "N", "baseline s", "this s", "ratio");
  barriers(o, before, after, run, [](int n, const BarrierResult& b, const BarrierResult& a) {
    fmt::print("{:>6} | {:>15.3f} | {:>15.3f} | {:>5.2f}x\n", n, b.total_s, a.total_s, b.total_s / a.total_s);
  });
  before.stop();
  after.stop();
}

void run(const Options& o) {
  int run = 0;
  if (!o.only_baseline) {
    Server ours = ddprun_store(o, o.store, "ddprun-store");
    auto torch_argv = split_spaces(o.python);
    torch_argv.push_back(o.torch_py);
    Server theirs = Server::spawn("torch TCPStore", torch_argv);
    fmt::print("torch's server: {}\n", theirs.banner);
    report_throughput(o, ours, theirs, run);
    report_barriers(o, ours, theirs, run);
    if (o.abuse_conns > 0) report_abuse(o, ours, theirs, run);
    ours.stop();
    theirs.stop();
  }
  if (!o.baseline.empty()) report_baseline(o, run);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse_options(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr,
               "store_bench: {}\nusage: store_bench [--duration S] [--conns 1,64,1024] [--barrier 1000,10000] "
               "[--rounds R] [--abuse_conns N (0: skip)] [--store PATH] [--python \"CMD...\"] [--baseline PATH] "
               "[--only baseline] [--barrier_limit S] [--open_row 0|1]\n",
               e.what());
    return 2;
  }
  pin_to_cpu(0);
  // Each client and the server's end of it hold a descriptor; as root, raise the hard limit too.
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  auto need = static_cast<rlim_t>(most_clients(o)) + 512;
  if (lim.rlim_max < need) {
    rlimit raised{need, need};
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < need) {
    fmt::print(stderr, "store_bench: {} clients need {} descriptors, the limit is {} (run as root, or raise ulimit -Hn)\n",
               most_clients(o), need, lim.rlim_cur);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  try {
    run(o);
  } catch (const std::exception& e) {
    fmt::print(stderr, "store_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
