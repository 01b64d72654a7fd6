// A worker for the launcher's end-to-end tests, run directly (an ELF binary, not Python).
// It performs its arguments in order:
//   env                    print the launcher-provided variables as KEY=VALUE
//   exit:N                 exit with N
//   exit_if_rank:R:N       exit with N when RANK == R
//   fail_before_attempt:K:N  on RANK 1, exit with N while TORCHELASTIC_RESTART_COUNT < K
//   signal:NAME            raise SEGV, KILL, ABRT or TERM
//   trap:NAME              on that signal (INT, TERM, USR1) print "got NAME" and exit 0
//   ready                  print "ready"
//   block                  wait for signals forever
//   block_if_attempt:K     wait for signals forever when TORCHELASTIC_RESTART_COUNT == K
//   block_if_world:N       wait for signals forever when WORLD_SIZE == N
//   grandchild             fork a process that blocks; print "grandchild PID"
//   pid                    print "pid PID"
//   heartbeat:N:MS         touch DDPRUN_HEARTBEAT_FILE N times, MS apart
//   sleep:MS               sleep MS milliseconds (a slow start, before the first heartbeat)
//   flood:LINES:LEN        print LINES lines of LEN characters, as fast as possible
//   longline:LEN           print one line of LEN characters
//   errorfile              write a PyTorch-style error JSON to TORCHELASTIC_ERROR_FILE
//   store_set:KEY          set KEY in the store at MASTER_ADDR:MASTER_PORT
//   store_absent:KEY       exit 9 if KEY exists in that store
//   stderr:TEXT            print TEXT to stderr
//   arg                    print the remaining arguments, then stop

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "ddprun/rendezvous/tcp_store.hpp"

namespace {

std::string env(const char* k) {
  const char* v = std::getenv(k);
  return v ? v : "";
}

int sig_number(const std::string& n) {
  if (n == "SEGV") return SIGSEGV;
  if (n == "KILL") return SIGKILL;
  if (n == "ABRT") return SIGABRT;
  if (n == "TERM") return SIGTERM;
  if (n == "INT") return SIGINT;
  if (n == "USR1") return SIGUSR1;
  return 0;
}

char g_trap_msg[64];
void on_trap(int) {
  ssize_t ignored = write(1, g_trap_msg, std::strlen(g_trap_msg));
  (void)ignored;
  _exit(0);
}

ddprun::rendezvous::TcpStore connect_store() {
  ddprun::rendezvous::TcpStoreOptions o;
  o.host = env("MASTER_ADDR");
  o.port = static_cast<std::uint16_t>(std::stoi(env("MASTER_PORT")));
  o.timeout = std::chrono::seconds(10);
  return ddprun::rendezvous::TcpStore(o);
}

std::string after(const std::string& a, std::size_t n) { return a.substr(n); }

}  // namespace

// A worker stuck in a collective that never completes: what a stack dump must name. Outside the
// anonymous namespace and not inlined, so the symbol is there as written.
extern "C" __attribute__((noinline)) void ddprun_test_stuck_in_all_reduce() {
  std::fflush(stdout);
  for (;;) ::pause();
}

__attribute__((noinline)) void ddprun_test_train_step() {
  ddprun_test_stuck_in_all_reduce();
  asm volatile("");  // not a tail call: train_step stays on the stack
}

namespace {

// What an action says: go on with the next argument, or exit with this code.
constexpr int kGoOn = -1;

[[noreturn]] void block_forever() {
  std::fflush(stdout);
  for (;;) ::pause();
}

// "A:B" after a prefix, as two integers.
std::pair<int, int> two(const std::string& rest) {
  auto colon = rest.find(':');
  return {std::atoi(rest.substr(0, colon).c_str()), std::atoi(rest.substr(colon + 1).c_str())};
}

void print_env() {
  for (const char* k : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                        "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                        "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                        "TORCHELASTIC_SIGNALS_TO_HANDLE", "PYTHONPATH", "OMP_NUM_THREADS", "DDPRUN_HEARTBEAT_FILE",
                        "DDPRUN_TEST_INHERITED"}) {
    std::printf("%s=%s\n", k, env(k).c_str());
  }
}

void flood(const std::string& rest) {
  auto [lines, len] = two(rest);
  std::string rank = env("RANK");
  std::setvbuf(stdout, nullptr, _IOFBF, 1 << 16);  // big writes that split lines anywhere
  for (int k = 0; k < lines; ++k) {
    std::string body(static_cast<std::size_t>(len), static_cast<char>('a' + std::atoi(rank.c_str()) % 26));
    std::printf("r%s l%d %s end\n", rank.c_str(), k, body.c_str());
  }
  std::fflush(stdout);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
}

void heartbeat(const std::string& rest) {
  auto [n, ms] = two(rest);
  for (int k = 0; k < n; ++k) {
    ::utimensat(AT_FDCWD, env("DDPRUN_HEARTBEAT_FILE").c_str(), nullptr, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));  // the work between two beats
  }
}

// Exits and signals: exit, exit_if_rank, fail_before_attempt, signal, trap.
int exits(const std::string& a) {
  if (a.rfind("exit:", 0) == 0) return std::atoi(after(a, 5).c_str());
  if (a.rfind("exit_if_rank:", 0) == 0) {
    auto rest = after(a, 13);
    auto colon = rest.find(':');
    return env("RANK") == rest.substr(0, colon) ? std::atoi(rest.substr(colon + 1).c_str()) : kGoOn;
  }
  if (a.rfind("fail_before_attempt:", 0) == 0) {
    auto [before, code] = two(after(a, 20));
    return env("RANK") == "1" && std::atoi(env("TORCHELASTIC_RESTART_COUNT").c_str()) < before ? code : kGoOn;
  }
  if (a.rfind("signal:", 0) == 0) {
    std::fflush(stdout);
    ::raise(sig_number(after(a, 7)));
  } else if (a.rfind("trap:", 0) == 0) {
    std::string name = after(a, 5);
    std::snprintf(g_trap_msg, sizeof(g_trap_msg), "got %s\n", name.c_str());
    ::signal(sig_number(name), on_trap);
  }
  return kGoOn;
}

// Waiting: ready, stuck, block, block_if_attempt, block_if_world, sleep, heartbeat.
void waits(const std::string& a) {
  if (a == "ready") std::printf("ready\n");
  if (a == "stuck") ddprun_test_train_step();
  if (a == "block") block_forever();
  if (a.rfind("block_if_attempt:", 0) == 0 && env("TORCHELASTIC_RESTART_COUNT") == after(a, 17)) block_forever();
  if (a.rfind("block_if_world:", 0) == 0 && env("WORLD_SIZE") == after(a, 15)) {
    std::printf("ready\n");
    block_forever();
  }
  if (a.rfind("sleep:", 0) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(after(a, 6).c_str())));
  if (a.rfind("heartbeat:", 0) == 0) heartbeat(after(a, 10));
}

// Output, files and the store: env, grandchild, pid, flood, longline, errorfile, store_set,
// store_absent, stderr.
int effects(const std::string& a) {
  if (a == "env") print_env();
  if (a == "grandchild") {
    pid_t p = ::fork();
    if (p == 0) block_forever();
    std::printf("grandchild %d\n", p);
  }
  if (a == "pid") std::printf("pid %d\n", ::getpid());
  if (a.rfind("flood:", 0) == 0) flood(after(a, 6));
  if (a.rfind("longline:", 0) == 0) std::printf("%s\n", std::string(std::atoi(after(a, 9).c_str()), 'x').c_str());
  if (a == "errorfile") {
    std::ofstream(env("TORCHELASTIC_ERROR_FILE"))
        << R"({"message": {"message": "ValueError: loss is NaN at step 7", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"train.py\", line 12, in step\nValueError: loss is NaN at step 7\n", "timestamp": "1"}}})";
  }
  if (a.rfind("store_set:", 0) == 0) connect_store().set(after(a, 10), "1");
  if (a.rfind("store_absent:", 0) == 0 && connect_store().check({after(a, 13)})) {
    std::printf("key %s is left over from an earlier attempt\n", after(a, 13).c_str());
    return 9;
  }
  if (a.rfind("stderr:", 0) == 0) std::fprintf(stderr, "%s\n", after(a, 7).c_str());
  return kGoOn;
}

bool known(const std::string& a) {
  static const char* kExact[] = {"env", "ready", "stuck", "block", "grandchild", "pid", "errorfile", "arg"};
  static const char* kPrefixed[] = {"exit:", "exit_if_rank:", "fail_before_attempt:", "signal:", "trap:",
                                    "block_if_attempt:", "block_if_world:", "heartbeat:", "sleep:", "flood:",
                                    "longline:", "store_set:", "store_absent:", "stderr:"};
  for (const char* e : kExact) {
    if (a == e) return true;
  }
  for (const char* p : kPrefixed) {
    if (a.rfind(p, 0) == 0) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (!known(a)) {
      std::fprintf(stderr, "test_worker: unknown action %s\n", a.c_str());
      return 99;
    }
    if (a == "arg") {
      for (int k = i + 1; k < argc; ++k) std::printf("arg %s\n", argv[k]);
      break;
    }
    if (int code = exits(a); code != kGoOn) return code;
    waits(a);
    if (int code = effects(a); code != kGoOn) return code;
  }
  return 0;
}
