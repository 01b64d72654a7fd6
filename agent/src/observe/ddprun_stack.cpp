// ddprun-stack PID: every thread's native stack of a running process, read from outside with
// elfutils' libdw (ptrace), printed as `eu-stack -m -s` does, so parse_native_stack reads both:
//   PID 4242 - process
//   TID 4242:
//   #0  0x00007f12a0e8a1d4 __GI___clock_nanosleep - /usr/lib/x86_64-linux-gnu/libc.so.6
//       ./time/../sysdeps/unix/sysv/linux/clock_nanosleep.c:48:5
// The agent runs it for a hung native worker (README: Hangs) when it sits
// beside ddprun; a program of its own, so that ddprun itself needs no libdw, and so that the
// agent can bound it (killed after --stack_dump_timeout) and survive whatever it meets.
// The main thread comes first. Exits 0 with at least one frame, 1 otherwise (the reason on stdout).
//
// Each thread is seized and interrupted (PTRACE_SEIZE, PTRACE_INTERRUPT), not attached with
// PTRACE_ATTACH as libdw would: that sends a SIGSTOP, which a thread in uninterruptible sleep (D:
// a driver call, a network file system) takes only when it wakes, so a reader killed meanwhile
// (the agent kills it at --stack_dump_timeout) left the whole process stopped for good. A seized
// thread's interrupt dies with its reader. A thread that has not stopped within kStopWait is
// named, not read.
#include <cxxabi.h>
#include <dirent.h>
#include <elf.h>
#include <elfutils/libdwfl.h>
#include <sys/ptrace.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kMaxFrames = 256;  // per thread, as eu-stack
constexpr auto kStopWait = std::chrono::milliseconds(1000);

char* g_debuginfo_path = nullptr;
const Dwfl_Callbacks kCallbacks = {
    dwfl_linux_proc_find_elf,
    dwfl_standard_find_debuginfo,
    nullptr,  // section_address: not needed for a live process
    &g_debuginfo_path,
};

struct Reading {
  Dwfl* dwfl = nullptr;
  std::map<pid_t, int> stopped;  // the threads seized and stopped: the signal to give back at the detach
  std::map<pid_t, std::string> threads;  // by TID: the main thread (TID == PID) sorts first below
  std::string* current = nullptr;
  int depth = 0;
  int frames = 0;
};

std::string demangle(const char* name) {
  if (!name) return "";
  if (std::strncmp(name, "_Z", 2) != 0) return name;
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && d ? d : name;
  std::free(d);
  return out;
}

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

int on_frame(Dwfl_Frame* frame, void* arg) {
  auto& r = *static_cast<Reading*>(arg);
  Dwarf_Addr pc = 0;
  bool activation = false;
  if (!dwfl_frame_pc(frame, &pc, &activation)) return DWARF_CB_ABORT;
  // A return address points after the call: look the caller's line up one byte before it.
  Dwarf_Addr at = activation ? pc : pc - 1;
  Dwfl_Module* mod = dwfl_addrmodule(r.dwfl, at);
  const char* module = mod ? dwfl_module_info(mod, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr) : nullptr;
  std::string symbol = mod ? demangle(dwfl_module_addrname(mod, at)) : "";
  *r.current += format("#%-2d 0x%016llx %s - %s\n", r.depth, static_cast<unsigned long long>(pc), symbol.c_str(),
                       module ? module : "??");
  if (Dwfl_Line* line = mod ? dwfl_module_getsrc(mod, at) : nullptr) {
    int lineno = 0, column = 0;
    if (const char* file = dwfl_lineinfo(line, nullptr, &lineno, &column, nullptr, nullptr)) {
      *r.current += format("    %s:%d:%d\n", file, lineno, column);
    }
  }
  ++r.frames;
  return ++r.depth < kMaxFrames ? DWARF_CB_OK : DWARF_CB_ABORT;
}

// A thread's state letter in /proc ('?' where it is gone).
char thread_state(pid_t pid, pid_t tid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : '?';
}

// Seizes and interrupts every thread of `pid`, and waits for them to stop, kStopWait at most in
// all: `r.stopped`. The main thread's failure to be seized (not allowed to trace it) is returned.
int stop_threads(pid_t pid, Reading& r) {
  std::vector<pid_t> seized;
  DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/task").c_str());
  if (!d) return errno;
  while (dirent* e = ::readdir(d)) {
    const pid_t tid = static_cast<pid_t>(std::atoi(e->d_name));
    if (tid <= 0) continue;
    if (::ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) != 0) {
      if (tid == pid) {
        const int err = errno;
        ::closedir(d);
        return err;
      }
      continue;  // gone since, or not ours
    }
    ::ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr);
    seized.push_back(tid);
  }
  ::closedir(d);
  const auto until = std::chrono::steady_clock::now() + kStopWait;
  std::size_t done = 0;
  for (;;) {
    for (auto& tid : seized) {
      int status = 0;
      if (tid == 0 || ::waitpid(tid, &status, __WALL | WNOHANG) != tid) continue;
      if (WIFSTOPPED(status)) {  // the interrupt, or a signal's delivery: that signal is given back
        const bool interrupt = WSTOPSIG(status) == SIGTRAP && (status >> 16) == PTRACE_EVENT_STOP;
        r.stopped[tid] = interrupt ? 0 : WSTOPSIG(status);  // (a SIGSTOP too: the job-control stop is kept)
      }
      tid = 0;  // stopped, or gone
      ++done;
    }
    if (done == seized.size() || std::chrono::steady_clock::now() >= until) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int on_thread(Dwfl_Thread* thread, void* arg) {
  auto& r = *static_cast<Reading*>(arg);
  pid_t tid = dwfl_thread_tid(thread);
  r.current = &r.threads[tid];
  *r.current = format("TID %d:\n", tid);
  r.depth = 0;
  if (!r.stopped.count(tid)) {  // seized, but not stopped in time (or started since): not waited on
    const char state = thread_state(dwfl_pid(r.dwfl), tid);
    *r.current += format("(not read: it did not stop within %lld ms%s)\n", static_cast<long long>(kStopWait.count()),
                         state == 'D' ? ": in uninterruptible sleep (D)" : "");
    return DWARF_CB_OK;
  }
  // A thread that cannot be unwound further keeps what was read: not an error for the others.
  if (dwfl_thread_getframes(thread, on_frame, &r) != 0 && r.depth == 0) {
    unsigned char regs[4096];
    iovec io{regs, sizeof(regs)};
    if (::ptrace(PTRACE_GETREGSET, tid, NT_PRSTATUS, &io) != 0) {
      // Its registers are gone: only SIGKILL ends a stopped thread, so the process is ending. No
      // next thread either (libdw, which found no registers, would take it for this one: abort()).
      *r.current += "(not read: the process ended while it was read)\n";
      return DWARF_CB_ABORT;
    }
    *r.current += format("(no frames: %s)\n", dwfl_errmsg(-1));
  }
  return DWARF_CB_OK;
}

int read_stacks(pid_t pid) {
  Reading r;
  r.dwfl = dwfl_begin(&kCallbacks);
  if (!r.dwfl) {
    std::printf("ddprun-stack: libdw: %s\n", dwfl_errmsg(-1));
    return 1;
  }
  int err = dwfl_linux_proc_report(r.dwfl, pid);
  if (err != 0 || dwfl_report_end(r.dwfl, nullptr, nullptr) != 0) {
    std::printf("ddprun-stack: cannot read the modules of pid %d: %s\n", pid,
                err > 0 ? std::strerror(err) : dwfl_errmsg(-1));
    dwfl_end(r.dwfl);
    return 1;
  }
  err = stop_threads(pid, r);
  if (err == 0) err = dwfl_linux_proc_attach(r.dwfl, pid, true);  // (stopped here: libdw attaches to none)
  if (err != 0) {
    std::printf("ddprun-stack: cannot attach to pid %d: %s (ptrace: are you allowed to trace it?)\n", pid,
                err > 0 ? std::strerror(err) : dwfl_errmsg(-1));
    dwfl_end(r.dwfl);
    return 1;
  }
  dwfl_getthreads(r.dwfl, on_thread, &r);
  dwfl_end(r.dwfl);
  for (const auto& [tid, signal] : r.stopped) ::ptrace(PTRACE_DETACH, tid, nullptr, signal);  // the threads run on
  // (those seized but not stopped are let go as this process ends, their interrupt with it)
  std::string out = format("PID %d - process\n", pid);
  if (r.threads.count(pid)) out += r.threads[pid];
  for (const auto& [tid, text] : r.threads) {
    if (tid != pid) out += text;
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return r.frames > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  char* end = nullptr;
  errno = 0;
  long pid = argc == 2 ? std::strtol(argv[1], &end, 10) : 0;
  const bool help = argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0);
  if (help || argc != 2 || pid <= 0 || pid > 0x7fffffff || errno != 0 || *end != '\0') {
    std::fprintf(help ? stdout : stderr,
                 "usage: ddprun-stack PID\nprints every thread's stack of process PID (as eu-stack -m -s), "
                 "read with libdw through ptrace\n");
    return help ? 0 : 2;
  }
  return read_stacks(static_cast<pid_t>(pid));
}
