#include "fleet_bench_store.hpp"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace fleet {

Store start_store(const std::string& bin) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe");
  Store s;
  s.pid = fork();
  if (s.pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    execl(bin.c_str(), bin.c_str(), "--port", "0", "--host", "", "--allow", "127.0.0.0/8", "--count_requests",
          "--log_level", "warn", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  s.out = fdopen(fds[0], "r");
  char line[256];
  if (!std::fgets(line, sizeof line, s.out)) throw std::runtime_error("ddprun-store did not start");
  std::string l(line);
  s.port = l.substr(l.rfind(':') + 1);
  s.port.erase(s.port.find_last_not_of("\n ") + 1);
  return s;
}

Tally read_tally(Store& s, int signal) {
  kill(s.pid, signal);
  Tally t;
  char line[512];
  while (std::fgets(line, sizeof line, s.out)) {
    std::istringstream in(line);
    std::string op, key;
    in >> op;
    if (op == "waits_woken") {
      in >> t.woken;
      return t;
    }
    if (op == "op" || op == "total") continue;
    std::vector<std::string> f;
    for (std::string w; in >> w;) f.push_back(w);
    if (f.size() == 4) key = f[0], f.erase(f.begin());  // a request without a key (PING) has 3
    double n = std::stod(f[0]);
    t.requests += n, t.bytes_in += std::stod(f[1]), t.bytes_out += std::stod(f[2]);
    if (op == "ADD" && key.find("/alive/") != std::string::npos) t.alive += n;
  }
  throw std::runtime_error("ddprun-store ended before its tally");
}

Cpu cpu_of(pid_t pid) {
  Cpu c;
  std::string dir = "/proc/" + std::to_string(pid) + "/task";
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream f(dir + "/" + e->d_name + "/schedstat");
      double ns = 0;
      if (f >> ns) c.run_s += ns / 1e9;
    }
    closedir(d);
  }
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(f)), {});
  std::istringstream rest(all.substr(all.rfind(')') + 2));
  std::vector<std::string> fields;
  for (std::string w; rest >> w;) fields.push_back(w);  // fields[0] is field 3 (state)
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  c.user_s = std::stod(fields[11]) / tick;
  c.ticks_s = c.user_s + std::stod(fields[12]) / tick;
  return c;
}

}  // namespace fleet
