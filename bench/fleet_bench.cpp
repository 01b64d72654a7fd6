// fleet_bench: K lightweight nodes in one process, each a real c10d Rendezvous
// (make_rendezvous: the round rules, ThreadedRendezvous, StoreBackend) against a real
// `ddprun-store --count_requests` this bench starts. Nodes run no workers: a node is its
// rendezvous and a listener that does what the agent does with the events.
//
//   fleet_bench --store build/rendezvous/ddprun-store [--nodes 256,1024,4096] [--steady_s 5]
//               [--one_round_keep_alive_s 60] [--keep_alive_s 5] [--check_requests]
//
// For each K, two stores and runs. One round: meet round 0, end it (success, acknowledged), with
// --one_round_keep_alive_s (60 s: no keep-alive but the first falls in the round, whose cost is
// then the round's own). Then, at keep_alive_interval --keep_alive_s (5 s, the default; the
// liveness TTL is 3 intervals), with MIN = K-1: (1) meet: all K join round 0 -> all ready;
// (2) steady state: keep-alives only for --steady_s; (3) restart: one node reports a worker
// failure (end_round, as the agent does) and every node joins round 1 on the round's end -> all
// ready; (4) a node crashes (its rendezvous destroyed) -> its ring neighbour finds it silent for a
// TTL and ends the round -> the K-1 others met in round 2; (5) end: every node reports success,
// reads the end and acknowledges it. Each phase prints its wall time, the store process's CPU
// (every thread's run time, /proc/PID/task/*/schedstat, and utime+stime of /proc/PID/stat) and
// the store's requests per node (its SIGUSR1 tally, diffed), keep-alive ADDs apart. Then the fit
// of the store's CPU for one round (meet + end) against K.
//
// Each node has 3 threads (the coordinator, the end watch, the keep-alive ring) and 3
// connections: 3K threads (small stacks, set here) and 3K descriptors on each side. With
// --check_requests it exits 1 unless one round costs 27 + 8/K requests per node (keep-alives
// aside but the first; docs/rounds-protocol.md, "Cost per round"), and, over the K given, the
// bytes a node sends and receives in it differ by less than kBytesSpread (O(1) bytes per node:
// a member that read the member list, h bytes x K, would add 8-17 bytes per node of K).
//
// --etcd PATH (etcd's binary): the same phases against a 3-member etcd cluster on loopback, each
// node the real etcd rendezvous (its lease, renewed by a keeper thread; lease_ttl --lease_ttl, 5 s
// by default, and --one_round_keep_alive_s in the one-round run; the crashed node's lease expires
// after it). The CPU is the 3 members' summed; the
// requests, watch events ("waits woken") and bytes come from their /metrics, and each K prints
// the requests of one round by kind (gRPC method).
//
// --procs P: the K nodes of each one-round run in P processes (forked, K/P
// nodes each, told by pipes when to join and when to end) rather than one: an etcd node keeps a
// connection per member for each of its clients, and K = 1,024 in one process passes this
// machine's hard limit of 20,000 open files. The phases are timed by this process, from its word
// to the last process's answer.
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/rounds/rendezvous.hpp"
#include "fleet_bench_etcd.hpp"
#include "fleet_bench_store.hpp"

using namespace ddprun::rounds;
using namespace fleet;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// How far apart the bytes per node of one round may be between any two K (--check_requests):
// the numbers in a node's assignment grow a digit or two; a list of K entries per node would
// add ~1.5 kB from K = 64 to K = 256.
constexpr double kBytesSpread = 64;

// The bytes per node of one round (sent, received) over the K run: false (and says so) when they
// spread by kBytesSpread or more.
bool bytes_flat(const std::vector<std::pair<int, std::pair<double, double>>>& per_k) {
  bool ok = true;
  for (int side = 0; side < 2; ++side) {
    double lo = 1e300, hi = 0;
    for (const auto& [k, b] : per_k) {
      const double v = side == 0 ? b.first : b.second;
      lo = std::min(lo, v), hi = std::max(hi, v);
    }
    if (hi - lo >= kBytesSpread) {
      std::fprintf(stderr, "one round: bytes %s per node range from %.0f to %.0f over K = %d..%d; want O(1), within %.0f\n",
                   side == 0 ? "sent" : "received", lo, hi, per_k.front().first, per_k.back().first, kBytesSpread);
      ok = false;
    }
  }
  return ok;
}

// The agent's loop: results posted by the rendezvous threads run here, in order.
struct Loop {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> q;
  bool stop = false;
  std::thread t{[this] { run(); }};
  void post(std::function<void()> f) {
    std::lock_guard<std::mutex> lk(mu);
    q.push_back(std::move(f));
    cv.notify_one();
  }
  void run() {
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      cv.wait(lk, [&] { return stop || !q.empty(); });
      if (q.empty()) return;
      auto f = std::move(q.front());
      q.pop_front();
      lk.unlock();
      f();
      lk.lock();
    }
  }
  ~Loop() {
    { std::lock_guard<std::mutex> lk(mu); stop = true; cv.notify_one(); }
    t.join();
  }
};

// What happened to the fleet, counted on the loop thread; the main thread waits on it.
struct Fleet {
  std::mutex mu;
  std::condition_variable cv;
  std::map<int, int> ready, over, failed_over;  // by round
  std::map<int, Clock::time_point> first_over;  // when the first node learnt of the round's end
  int finished = 0, failed = 0;
  Clock::time_point last;  // of the last event counted
  std::string first_error;
  void count(const std::function<void()>& f) {
    std::lock_guard<std::mutex> lk(mu);
    f();
    last = Clock::now();
    cv.notify_all();
  }
  // Waits until pred() or a failure; returns the time of the event that made pred() true.
  Clock::time_point until(const std::function<bool()>& pred, std::chrono::seconds limit, const char* what) {
    std::unique_lock<std::mutex> lk(mu);
    if (!cv.wait_for(lk, limit, [&] { return pred() || failed > 0; }) || failed > 0) {
      std::fprintf(stderr, "fleet_bench: %s: %s\n", what, failed ? first_error.c_str() : "timed out");
      for (auto& [r, n] : ready) std::fprintf(stderr, "  round %d: %d ready, %d over, %d over on a failure or loss\n", r, n, over[r], failed_over[r]);
      std::exit(1);
    }
    return last;
  }
};

struct Node : Rendezvous::Listener {
  Fleet* fleet = nullptr;
  std::unique_ptr<Rendezvous> rdv;
  // What the agent keeps of its round for the next (RoundInfo::nodes: K records on group rank 0,
  // none on the others).
  int restart_count = 0;
  Streak streak;
  void on_round_ready(const RoundInfo& i) override {
    restart_count = i.restart_count;
    streak = i.streak;
    fleet->count([&] { ++fleet->ready[i.round]; });
  }
  void on_rendezvous_failed(const RendezvousFailure& f) override {
    fleet->count([&] {
      if (!fleet->failed++) fleet->first_error = f.message;
    });
  }
  void on_round_over(const RoundOutcome& o) override {
    const bool failure = o.end && o.end->kind == RoundEnd::Kind::failure;
    const bool lost = o.end && o.end->kind == RoundEnd::Kind::node_lost;
    fleet->count([&] {
      ++(failure || lost ? fleet->failed_over : fleet->over)[o.round];
      fleet->first_over.emplace(o.round, Clock::now());
    });
    // As the agent does: a failed round is followed by the next, with the restart count + 1; a
    // round that lost a node, by the next without it, with the same count.
    if (failure) rdv->join(o.round + 1, restart_count + 1, streak.after(*o.end->failure));
    if (lost) rdv->join(o.round + 1, restart_count, streak);
  }
  void on_finished() override {
    fleet->count([&] { ++fleet->finished; });
  }
};

struct Phase {
  double wall_s = 0;
  Cpu cpu;
  Tally t;
};

struct Result {
  int k = 0;
  Phase meet, steady, restart, lost, end;
  double detect_s = 0;  // lost: from the crash to the first node's learning of the round's end
  Tally all;  // from before the first join to the store's exit
};

// One store, K nodes. full (MIN = K-1): meet round 0, keep-alives only for steady_s, a failure
// -> round 1 met, a node's crash (its rendezvous destroyed: its keep-alives stop, its connections
// close) -> round 2 met without it, its end. Else one round: meet round 0 and its end (the cost of a round, as
// docs/rounds-protocol.md counts it).
// With `etcd_bin` (--etcd), a 3-member etcd cluster in place of the store: the nodes' backend is
// etcd, lease_ttl --lease_ttl (5 s, the default); its CPU and tally are the 3 members'
// (fleet_bench_etcd.hpp).
std::chrono::seconds lease_ttl{5};
std::string etcd_data = "/tmp";
int procs = 1;  // --procs

// A process holding some of the nodes (--procs): its pipes, our ends.
struct Part {
  pid_t pid = -1;
  int to = -1, from = -1;
};

using MakeNodes = std::function<std::vector<std::unique_ptr<Node>>(int, int, Fleet&, Loop&)>;

// In a part: its nodes, made here with a loop of its own (the parent's thread is not in a forked
// child), then the parent's words: 'j' join round 0 (answered 'm' when all are ready), 'e' report
// success, wait for the end and acknowledge it (answered 'd' when all finished), 'q' shut down
// (answered 'q'). A failure answers 'x'.
[[noreturn]] void run_part(int lo, int hi, int in, int out, const MakeNodes& make) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // gone with the bench, whatever ends it
  if (getppid() == 1) _exit(1);
  const auto limit = std::chrono::seconds(600);
  Loop loop;
  Fleet fleet;
  auto nodes = make(lo, hi, fleet, loop);
  const int n = hi - lo;
  auto answer = [&](char c) {
    if (write(out, &c, 1) != 1) _exit(3);
  };
  for (char c; read(in, &c, 1) == 1;) {
    std::unique_lock<std::mutex> lk(fleet.mu);
    auto wait = [&](const std::function<bool()>& pred) {
      if (!fleet.cv.wait_for(lk, limit, [&] { return pred() || fleet.failed > 0; }) || fleet.failed > 0) {
        std::fprintf(stderr, "fleet_bench part %d-%d: %s\n", lo, hi, fleet.failed ? fleet.first_error.c_str() : "timed out");
        answer('x');
        _exit(1);
      }
    };
    if (c == 'j') {
      lk.unlock();
      for (auto& node : nodes) node->rdv->join(0, -1);
      lk.lock();
      wait([&] { return fleet.ready[0] == n; });
      answer('m');
    } else if (c == 'e') {
      lk.unlock();
      for (auto& node : nodes) node->rdv->report_success(0);
      lk.lock();
      wait([&] { return fleet.over[0] == n; });
      lk.unlock();
      for (auto& node : nodes) node->rdv->finish(0, Rendezvous::Ack::yes);
      lk.lock();
      wait([&] { return fleet.finished == n; });
      answer('d');
    } else if (c == 'q') {
      lk.unlock();
      for (auto& node : nodes) node->rdv->shutdown();
      nodes.clear();
      answer('q');
      _exit(0);  // (nothing of the parent's to tear down here)
    }
  }
  _exit(2);
}

// Forks `count` parts, K/count nodes each (the last one the rest).
std::vector<Part> start_parts(int k, int count, const MakeNodes& make) {
  std::vector<Part> parts;
  for (int p = 0; p < count; ++p) {
    const int lo = k * p / count, hi = k * (p + 1) / count;
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) throw std::runtime_error("pipe failed");
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      close(down[1]), close(up[0]);
      for (const auto& other : parts) close(other.to), close(other.from);
      run_part(lo, hi, down[0], up[1], make);
    }
    close(down[0]), close(up[1]);
    parts.push_back({pid, down[1], up[0]});
  }
  return parts;
}

// Says `word` to every part and waits for each to answer `done` (all watched at once: the first
// that fails is named); returns when the last did. A failure or the limit ends the bench (its
// parts die with it).
Clock::time_point tell_parts(const std::vector<Part>& parts, char word, char done, std::chrono::seconds limit, const char* what) {
  for (const auto& part : parts) {
    if (write(part.to, &word, 1) != 1) throw std::runtime_error("a part is gone");
  }
  std::vector<bool> answered(parts.size(), false);
  const auto until = Clock::now() + limit;
  for (std::size_t left = parts.size(); left > 0;) {
    std::vector<pollfd> fds;
    for (std::size_t i = 0; i < parts.size(); ++i) fds.push_back({answered[i] ? -1 : parts[i].from, POLLIN, 0});
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (wait <= 0 || poll(fds.data(), fds.size(), static_cast<int>(wait)) <= 0) {
      std::fprintf(stderr, "fleet_bench: %s: %zu of %zu parts did not answer within %lld s\n", what, left, parts.size(),
                   static_cast<long long>(limit.count()));
      std::exit(1);
    }
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (answered[i] || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char c = 0;
      if (read(parts[i].from, &c, 1) != 1 || c != done) {
        std::fprintf(stderr, "fleet_bench: %s: part %d (pid %d) answered '%c'\n", what, static_cast<int>(i),
                     static_cast<int>(parts[i].pid), c ? c : '-');
        std::exit(1);
      }
      answered[i] = true;
      --left;
    }
  }
  return Clock::now();
}

Result run_fleet(const std::string& store_bin, const std::string& etcd_bin, int k, double steady_s, Loop& loop, bool full,
                 std::chrono::milliseconds keep_alive, std::map<std::string, double>* by_kind = nullptr) {
  const bool on_etcd = !etcd_bin.empty();
  Store store;
  Etcd etcd;
  if (on_etcd) {
    etcd = start_etcd(etcd_bin, etcd_data);
  } else {
    store = start_store(store_bin);
  }
  auto tally = [&](int signal, std::map<std::string, double>* kinds = nullptr) {
    return on_etcd ? etcd_tally(etcd, kinds) : read_tally(store, signal);
  };
  auto cpu = [&] { return on_etcd ? etcd_cpu(etcd) : cpu_of(store.pid); };
  auto options_of = [&](int i) {
    RendezvousOptions o;
    o.backend = on_etcd ? BackendKind::etcd : BackendKind::c10d;
    o.run_id = "fleet" + std::to_string(k);
    o.min_nodes = o.max_nodes = k;
    if (full && k > 1) o.min_nodes = k - 1;
    // Every (source, destination) pair of addresses has ~28k ephemeral ports: a destination of
    // its own per 8,192 connections (127.0.0.1, .2, ...).
    o.endpoint_host = "127.0.0." + std::to_string(1 + (3 * i) / 8192);
    if (!on_etcd) o.endpoint_port = static_cast<std::uint16_t>(std::stoi(store.port));
    o.host_role = HostRole::never;
    o.local_addr = "127.0.0.1";
    o.join_timeout = 300s;
    o.read_timeout = 300s;
    o.keep_alive_interval = keep_alive;
    if (on_etcd) {
      o.etcd_endpoints = etcd.endpoints;
      // One round: the lease renewed as rarely as the store's ring (--one_round_keep_alive_s),
      // so that the round's cost is the round's own.
      o.lease_ttl = full ? lease_ttl : std::chrono::duration_cast<std::chrono::seconds>(keep_alive);
    }
    return o;
  };
  auto make_nodes = [&](int lo, int hi, Fleet& fleet, Loop& loop) {
    std::vector<std::unique_ptr<Node>> made;
    for (int i = lo; i < hi; ++i) {
      auto n = std::make_unique<Node>();
      n->fleet = &fleet;
      n->rdv = make_rendezvous(options_of(i), [&loop](std::function<void()> f) { loop.post(std::move(f)); }, nullptr);
      n->rdv->set_listener(*n);
      made.push_back(std::move(n));
    }
    return made;
  };
  Fleet fleet;
  std::vector<std::unique_ptr<Node>> nodes;
  std::vector<Part> parts;
  if (procs > 1 && !full) {
    parts = start_parts(k, procs, [&](int lo, int hi, Fleet& f, Loop& l) { return make_nodes(lo, hi, f, l); });
  } else {
    nodes = make_nodes(0, k, fleet, loop);
  }
  auto phase = [&](Phase& p, const std::function<Clock::time_point()>& body) {
    const Tally t0 = tally(SIGUSR1);
    const Cpu c0 = cpu();
    const auto start = Clock::now();
    const auto done = body();
    p.wall_s = secs(done - start);
    p.cpu = cpu() - c0;
    p.t = tally(SIGUSR1) - t0;
  };
  Result r;
  r.k = k;
  std::map<std::string, double> kinds_before;
  const Tally before = tally(SIGUSR1, &kinds_before);
  // Time limits: generous, scaled with K (a failure says which phase).
  const auto limit = std::chrono::seconds(60 + k / 20);
  phase(r.meet, [&] {
    if (!parts.empty()) return tell_parts(parts, 'j', 'm', limit, "meet");
    for (auto& n : nodes) n->rdv->join(0, -1);
    return fleet.until([&] { return fleet.ready[0] == k; }, limit, "meet");
  });
  int last = 0;
  if (full) {
    phase(r.steady, [&] {
      std::this_thread::sleep_for(std::chrono::duration<double>(steady_s));
      return Clock::now();
    });
    phase(r.restart, [&] {
      FailureRecord f;
      f.rank = k / 2;
      f.host = "node" + std::to_string(k / 2);
      f.reason = "exit code 1";
      f.time = std::chrono::system_clock::now();
      nodes[k / 2]->rdv->end_round(0, RoundEnd::of_failure(f), k);
      return fleet.until([&] { return fleet.ready[1] == k; }, limit, "restart");
    });
    phase(r.lost, [&] {
      const auto crash = Clock::now();
      nodes[k / 3].reset();
      const auto met = fleet.until([&] { return fleet.ready[2] == k - 1; }, limit + 60s, "node lost");
      r.detect_s = secs(fleet.first_over[1] - crash);
      return met;
    });
    nodes.erase(nodes.begin() + k / 3);
    last = 2;
  }
  phase(r.end, [&] {
    if (!parts.empty()) return tell_parts(parts, 'e', 'd', limit, "end");
    for (auto& n : nodes) n->rdv->report_success(last);
    const int n = static_cast<int>(nodes.size());
    fleet.until([&] { return fleet.over[last] == n; }, limit, "end");
    for (auto& n : nodes) n->rdv->finish(last, Rendezvous::Ack::yes);
    return fleet.until([&] { return fleet.finished == n; }, limit, "acknowledge");
  });
  for (auto& n : nodes) n->rdv->shutdown();
  nodes.clear();
  tell_parts(parts, 'q', 'q', limit, "shutdown");
  for (auto& part : parts) {
    waitpid(part.pid, nullptr, 0);
    close(part.to), close(part.from);
  }
  if (by_kind) by_kind->clear();
  r.all = tally(SIGTERM, by_kind) - before;  // every node's connections closed
  if (by_kind) {
    for (auto& [kind, n] : *by_kind) n -= kinds_before[kind];
  }
  if (on_etcd) {
    stop_etcd(etcd);
  } else {
    fclose(store.out);
    waitpid(store.pid, nullptr, 0);
  }
  return r;
}

void print_phase(const char* name, int k, const Phase& p, bool per_second) {
  const double per = per_second ? k * p.wall_s : k;
  std::printf("| %d | %s | %.3f | %.3f | %.2f (%.2f) | %.3f | %.3f | %.0f / %.0f | %.2f |\n", k, name, p.wall_s,
              p.cpu.run_s, p.cpu.ticks_s, p.cpu.user_s, p.t.requests / per, p.t.alive / per, p.t.bytes_in / per, p.t.bytes_out / per,
              p.t.woken / per);
}

}  // namespace

int main(int argc, char** argv) {
  std::string store_bin, etcd_bin, ks_text = "256,1024,4096";
  double steady_s = 5, one_round_keep_alive_s = 60, keep_alive_s = 5;
  bool check = false, one_round_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--store") store_bin = next();
    else if (a == "--etcd") etcd_bin = next();
    else if (a == "--lease_ttl") lease_ttl = std::chrono::seconds(std::stoi(next()));
    else if (a == "--etcd_data") etcd_data = next();  // where the members keep their data (/tmp)
    else if (a == "--nodes") ks_text = next();
    else if (a == "--steady_s") steady_s = std::stod(next());
    else if (a == "--one_round_keep_alive_s") one_round_keep_alive_s = std::stod(next());
    else if (a == "--keep_alive_s") keep_alive_s = std::stod(next());
    else if (a == "--check_requests") check = true;
    else if (a == "--one_round") one_round_only = true;  // the one-round run of each K, nothing else
    else if (a == "--procs") procs = std::stoi(next());
    else {
      std::fprintf(stderr, "usage: fleet_bench [--store PATH | --etcd PATH [--lease_ttl 5] [--etcd_data /tmp]] [--one_round] [--nodes 256,1024,4096] [--steady_s 5] [--one_round_keep_alive_s 60] [--keep_alive_s 5] "
                           "[--check_requests] [--procs P]\n");
      return 2;
    }
  }
  if (store_bin.empty()) store_bin = DDPRUN_STORE_BIN;
  std::vector<int> ks;
  for (std::stringstream in(ks_text); in.good();) {
    std::string w;
    std::getline(in, w, ',');
    ks.push_back(std::stoi(w));
  }
  spdlog::set_level(std::getenv("FLEET_LOG") ? spdlog::level::from_str(std::getenv("FLEET_LOG")) : spdlog::level::err);
  signal(SIGPIPE, SIG_IGN);
  // 3 descriptors and 3 threads a node, on each side (the store inherits the limit).
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  rlimit want{1 << 20, 1 << 20};
  if (setrlimit(RLIMIT_NOFILE, &want) != 0) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  getrlimit(RLIMIT_NOFILE, &nofile);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  pthread_setattr_default_np(&attr);
  std::printf("open files limit %llu; thread stacks 256 KiB\n\n", static_cast<unsigned long long>(nofile.rlim_cur));
  std::printf("| K | phase | wall s | store CPU s (schedstat) | store CPU s, utime+stime (utime) | requests per node | "
              "of which keep-alive ADDs | bytes in / out per node | waits woken per node |\n|---|---|---|---|---|---|---|---|---|\n");
  std::vector<Result> rounds;
  std::vector<std::pair<int, std::pair<double, double>>> bytes;  // one round, per node: K, (sent, received)
  Loop loop;
  bool bad = false;
  for (int k : ks) {
    std::map<std::string, double> kinds;
    auto one = run_fleet(store_bin, etcd_bin, k, steady_s, loop, false,
                         std::chrono::milliseconds(static_cast<long>(one_round_keep_alive_s * 1000)), &kinds);
    print_phase("one round: meet (round 0)", k, one.meet, false);
    print_phase("one round: end (success, acknowledged)", k, one.end, false);
    std::fflush(stdout);
    if (!kinds.empty()) {
      std::printf("| %d | one round, requests per node by kind: ", k);
      for (const auto& [kind, n] : kinds) {
        if (n > 0) std::printf("%s %.2f; ", kind.c_str(), n / k);
      }
      std::printf("|\n");
    }
    if (one_round_only) {
      rounds.push_back(one);
      continue;
    }
    auto r = run_fleet(store_bin, etcd_bin, k, steady_s, loop, true, std::chrono::milliseconds(static_cast<long>(keep_alive_s * 1000)));
    print_phase("meet (round 0)", k, r.meet, false);
    print_phase("steady state, per node per s", k, r.steady, true);
    print_phase("restart (a failure -> round 1 met)", k, r.restart, false);
    print_phase("a node crashed -> round 2 met without it", k, r.lost, false);
    print_phase("end of round 2", k - 1, r.end, false);
    std::fflush(stdout);
    // The first keep-alive is the round's; later ones come with time, not with the round.
    const double per_node = (one.all.requests - one.all.alive) / k + 1;
    if (etcd_bin.empty() && std::abs(per_node - (27 + 8.0 / k)) > 1e-6) {
      std::fprintf(stderr, "K=%d: one round: %.4f requests per node (keep-alives aside but the first); want 27 + 8/K = %.4f\n",
                   k, per_node, 27 + 8.0 / k);
      bad = true;
    }
    bytes.push_back({k, {one.all.bytes_in / k, one.all.bytes_out / k}});
    one.restart = r.restart;
    one.steady = r.steady;
    one.lost = r.lost;
    one.detect_s = r.detect_s;
    rounds.push_back(one);
  }
  std::printf("\n| K | one round (meet, end): wall s | store CPU s | requests per node, whole store life (keep-alives aside but the first) | "
              "bytes in / out per node | restart: wall s | store CPU s | steady state: store CPU %% | "
              "a node crashed -> met without it: wall s (of which its loss found) | store CPU s |\n"
              "|---|---|---|---|---|---|---|---|---|---|\n");
  auto round_cpu = [](const Result& r) { return r.meet.cpu.run_s + r.end.cpu.run_s; };
  for (const auto& r : rounds) {
    std::printf("| %d | %.3f | %.3f | %.3f | %.0f / %.0f | %.3f | %.3f | %.2f | %.3f (%.3f) | %.3f |\n", r.k,
                r.meet.wall_s + r.end.wall_s,
                round_cpu(r), (r.all.requests - r.all.alive) / r.k + 1, r.all.bytes_in / r.k, r.all.bytes_out / r.k,
                r.restart.wall_s, r.restart.cpu.run_s, 100 * r.steady.cpu.run_s / r.steady.wall_s, r.lost.wall_s,
                r.detect_s, r.lost.cpu.run_s);
  }
  if (rounds.size() >= 2) {
    // Least squares: the store's CPU for one round = a x K + c.
    double n = rounds.size(), sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const auto& r : rounds) {
      double x = r.k, y = round_cpu(r);
      sx += x, sy += y, sxx += x * x, sxy += x * y;
    }
    const double a = (n * sxy - sx * sy) / (n * sxx - sx * sx), c = (sy - a * sx) / n;
    std::printf("\nstore CPU per round (meet, end; least squares): %.4f ms x K + %.1f ms\n", a * 1e3, c * 1e3);
    for (std::size_t i = 0; i + 1 < rounds.size(); ++i) {
      std::printf("CPU(K=%d) / CPU(K=%d) = %.2f (nodes x %.0f)\n", rounds[i + 1].k, rounds[i].k,
                  round_cpu(rounds[i + 1]) / round_cpu(rounds[i]), static_cast<double>(rounds[i + 1].k) / rounds[i].k);
    }
  }
  if (check && !bytes_flat(bytes)) bad = true;
  return check && bad ? 1 : 0;
}
