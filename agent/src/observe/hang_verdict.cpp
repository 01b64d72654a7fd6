#include "observe/hang_verdict.hpp"

#include <algorithm>
#include <cmath>
#include <map>

namespace ddprun::agent {
namespace {

bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// The collective named by a native frame of the main thread, or "".
std::string native_collective(const std::vector<StackFrame>& frames) {
  for (const auto& f : frames) {
    const std::string& fn = f.function;
    if (has(fn, "Reducer::")) return "DDP's all-reduce";
    if (has(fn, "cudaDeviceSynchronize") || has(fn, "cudaStreamSynchronize") || has(fn, "synchronize_device")) {
      return "a CUDA synchronize";
    }
    if (has(fn, "ProcessGroupNCCL") || has(fn, "nccl")) return "an NCCL collective";
    if (has(fn, "ProcessGroupGloo") || has(fn, "gloo::")) return "a gloo collective";
    if (has(fn, "Work::wait") || has(fn, "Work::synchronize")) return "a collective's wait";
  }
  if (in_collective(frames)) {  // a native program's own collective (a function named for it)
    for (const auto& f : frames) {
      if (in_collective({f})) return f.function;
    }
  }
  return "";
}

std::string where(const RankView& r, std::size_t depth = 1) {
  auto frames = !r.python.empty() ? r.python : r.native;
  if (frames.size() > depth) frames.resize(depth);
  if (!frames.empty()) return describe_frames(frames, depth);
  return "(no stack" + (r.python_note.empty() ? std::string() : ": " + r.python_note) + ")";
}

std::string who(const RankView& r) {
  return "rank " + std::to_string(r.rank) + " (host " + r.host + ", pid " + std::to_string(r.pid) + ")";
}

// "wait for it in DDP's all-reduce" / "wait for them (rank 0 in X, rank 2 in Y)".
std::string waiting_text(const std::vector<const RankView*>& waiting, std::size_t blamed) {
  if (waiting.empty()) return "";
  std::map<std::string, std::vector<int>> by;
  for (const auto* r : waiting) by[collective_of(*r)].push_back(r->rank);
  std::vector<int> all;
  for (const auto* r : waiting) all.push_back(r->rank);
  std::string out = "; " + std::string(all.size() == 1 ? "rank " : "ranks ") + rank_list(all) +
                    (all.size() == 1 ? " waits" : " wait") + (blamed == 1 ? " for it" : " for them");
  if (by.size() == 1) return out + " in " + by.begin()->first;
  std::string parts;
  for (const auto& [c, ranks] : by) parts += (parts.empty() ? "" : ", ") + rank_list(ranks) + " in " + c;
  return out + " (" + parts + ")";
}

std::string state_words(char s) {
  switch (s) {
    case 'R': return "running";
    case 'S': return "sleeping";
    case 'D': return "uninterruptible (D)";
    case 'T': return "stopped (T)";
    case 't': return "traced (t)";
    case 'Z': return "exited (zombie)";
    default: return "state unknown";
  }
}

// Running or sleeping as the busy window measured it, when it did: one /proc sample catches a
// rank that sleeps between short wake-ups running now and then, and ranks waiting alike would
// then read as two groups. Stopped, uninterruptible and exited are the sample's.
char seen_state(const RankView& r) {
  if ((r.state == 'R' || r.state == 'S') && r.cpu >= 0) return r.cpu >= 0.5 ? 'R' : 'S';
  return r.state;
}

}  // namespace

const char* to_string(HangKind k) {
  switch (k) {
    case HangKind::stopped: return "stopped";
    case HangKind::uninterruptible: return "uninterruptible";
    case HangKind::stuck: return "stuck";
    case HangKind::spinning: return "spinning";
    case HangKind::mismatch: return "mismatch";
    case HangKind::undecided: return "undecided";
  }
  return "undecided";
}

std::string rank_list(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string collective_of(const RankView& r) {
  for (const auto& f : r.python) {
    if (f.file == "distributed_c10d.py") return "torch.distributed." + f.function;
    if (f.function == "synchronize" && (f.file == "__init__.py" || f.file == "cuda.py")) return "a CUDA synchronize";
  }
  std::string native = native_collective(r.native);
  if (!native.empty()) return native;
  // Asleep in autograd's backward(): under DDP it waits for the gradient all-reduce, though its
  // native main thread may be read in the autograd engine's wait, or not at all (a busy machine).
  if (!r.python.empty() && r.python.front().function == "backward" &&
      (r.python.front().file == "__init__.py" || r.python.front().file == "_tensor.py") && r.state == 'S' &&
      r.cpu >= 0 && r.cpu < 0.3) {
    return "DDP's all-reduce";
  }
  if (r.native.empty() && in_collective(r.python)) {  // no native stack: the Python names say it
    for (const auto& f : r.python) {
      if (in_collective({f})) return f.function;
    }
  }
  return "";
}

HangVerdict decide_hang(const std::vector<RankView>& given) {
  std::vector<const RankView*> ranks;
  for (const auto& r : given) ranks.push_back(&r);
  std::sort(ranks.begin(), ranks.end(), [](auto* a, auto* b) { return a->rank < b->rank; });
  HangVerdict v;
  auto pick = [&](auto pred) {
    std::vector<const RankView*> out;
    for (const auto* r : ranks) {
      if (pred(*r)) out.push_back(r);
    }
    return out;
  };
  auto others_than = [&](const std::vector<const RankView*>& blamed) {
    return pick([&](const RankView& r) {
      return std::find(blamed.begin(), blamed.end(), &r) == blamed.end() && !collective_of(r).empty();
    });
  };
  auto blame = [&](HangKind kind, const std::vector<const RankView*>& blamed, auto say) {
    v.kind = kind;
    for (const auto* r : blamed) {
      v.blamed.push_back(r->rank);
      v.text += (v.text.empty() ? "" : "; ") + say(*r);
    }
    v.text += waiting_text(others_than(blamed), blamed.size());
  };

  if (auto stopped = pick([](const RankView& r) { return r.state == 'T' || r.state == 't'; }); !stopped.empty()) {
    blame(HangKind::stopped, stopped, [](const RankView& r) {
      return who(r) + (r.state == 't' ? " is stopped by a debugger (state t, traced)" : " is stopped (SIGSTOP: state T)");
    });
    return v;
  }
  // In D and outside every collective (a rank caught in D while it waits in one, on a page fault
  // say, holds nobody up).
  if (auto d = pick([](const RankView& r) { return r.state == 'D' && collective_of(r).empty(); }); !d.empty()) {
    blame(HangKind::uninterruptible, d, [](const RankView& r) {
      return who(r) + "'s process is in uninterruptible sleep (D: waiting in the kernel, often on I/O or a driver)" +
             (r.native.empty() ? "" : " in " + describe_frames(r.native, 1));
    });
    return v;
  }
  auto read = [](const RankView& r) { return !r.python.empty() || !r.native.empty(); };
  auto outside = pick([&](const RankView& r) { return read(r) && collective_of(r).empty(); });
  auto inside = pick([&](const RankView& r) { return read(r) && !collective_of(r).empty(); });
  if (!outside.empty() && !inside.empty()) {
    const bool spinning = std::all_of(outside.begin(), outside.end(), [](auto* r) { return r->cpu >= 0.5; });
    blame(spinning ? HangKind::spinning : HangKind::stuck, outside, [](const RankView& r) {
      if (r.cpu >= 0.5) {
        return who(r) + " is spinning (busy " + std::to_string(static_cast<int>(std::lround(r.cpu * 100))) +
               "% of the time) outside any collective in " + where(r);
      }
      return who(r) + " is stuck outside any collective in " + where(r);
    });
    return v;
  }
  std::map<std::string, std::vector<const RankView*>> by;
  for (const auto* r : inside) by[collective_of(*r)].push_back(r);
  // Every rank read waits in one collective beside ranks that answered no stack signal, and whose
  // native main thread could not be read either: those hold it up, most likely in the kernel where
  // the signal does not reach their main thread (one long write to a slow file system, which the
  // signal turns into uninterruptible sleep; a driver call). Not "a rank that is not here". (A rank
  // never signalled, one read with --stack_dump_timeout=0 say, proves nothing.)
  auto unanswered = [&](const RankView& r) { return !read(r) && r.python_note.rfind(kStackSignalUnanswered, 0) == 0; };
  if (auto unread = pick(unanswered); by.size() == 1 && !unread.empty()) {
    blame(HangKind::stuck, unread, [](const RankView& r) {
      return who(r) + " could not be read " + where(r) + ", " + state_words(seen_state(r)) +
             " before ddprun signalled it: held in the kernel, most likely (a slow or stuck file system, a driver)";
    });
    return v;
  }
  if (by.size() > 1) {
    // The largest group (ties: the lowest rank's) is where the job is; the others went astray.
    auto main = std::max_element(by.begin(), by.end(), [](const auto& a, const auto& b) {
      return a.second.size() < b.second.size() ||
             (a.second.size() == b.second.size() && a.second.front()->rank > b.second.front()->rank);
    });
    v.kind = HangKind::mismatch;
    v.text = "ranks wait in different collectives:";
    for (const auto& [c, rs] : by) {
      std::vector<int> list;
      for (const auto* r : rs) list.push_back(r->rank);
      if (c != main->first) v.blamed.insert(v.blamed.end(), list.begin(), list.end());
      v.text += " " + (list.size() == 1 ? who(*rs.front()) : "ranks " + rank_list(list)) + " in " + c + " (" +
                where(*rs.front(), 2) + ");";
    }
    v.text.pop_back();
    std::sort(v.blamed.begin(), v.blamed.end());
    return v;
  }
  v.kind = HangKind::undecided;
  if (!inside.empty() && outside.empty()) {
    std::vector<int> list;
    for (const auto* r : inside) list.push_back(r->rank);
    v.text = "no rank here is to blame: " + std::string(list.size() == 1 ? "rank " : "ranks ") + rank_list(list) +
             (list.size() == 1 ? " waits" : " wait") + " in " + by.begin()->first +
             " for a rank that is not here (on another node), or the collective itself is stuck";
  } else if (!outside.empty()) {
    v.text = "no rank waits in a collective:";
    for (const auto* r : outside) v.text += " " + who(*r) + " in " + where(*r) + ";";
    v.text.pop_back();
  } else {
    v.text = "no stack could be read";
  }
  return v;
}

std::string format_hang_report(const HangVerdict& verdict, const std::vector<RankView>& ranks, const std::string& host,
                               const std::string& why, const std::vector<std::string>& files,
                               std::chrono::milliseconds stop_in, int silent_rank, bool node_only) {
  std::string out = "\n==================== ddprun: hang on " + host + " ====================\n";
  if (node_only) {
    out += "this node's ranks: " + verdict.text + " (the job's verdict, from every node, follows)\n";
  } else {
    out += (verdict.blamed.empty() ? "" : "verdict: ") + verdict.text + "\n";
  }
  out += "found: rank " + std::to_string(silent_rank) + ": " + why + "\n";
  std::string where;
  if (!files.empty()) {
    where = " (full dumps: " + files.front() + (files.size() > 1 ? " and the other ranks' stack.txt)" : ")");
  }
  out += "each rank, innermost first" + where + ":\n";
  // Ranks with the same state and stacks on one line (a node of 8 ranks waiting alike reads as one).
  std::vector<const RankView*> sorted;
  for (const auto& r : ranks) sorted.push_back(&r);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->rank < b->rank; });
  std::vector<std::pair<std::string, std::vector<const RankView*>>> groups;
  for (const auto* r : sorted) {
    std::string body;
    if (!r->python.empty()) {
      body = describe_frames(r->python, 4) + "\n";
      if (!r->native.empty()) body += "      native: " + describe_frames(r->native, 2) + "\n";
    } else if (!r->native.empty()) {
      body = describe_frames(r->native, 4) + "\n";
    } else {
      body = "(no stack" + (r->python_note.empty() ? "" : ": " + r->python_note) + ")\n";
    }
    std::string key = state_words(seen_state(*r)) + "\n" + body;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == key; });
    if (it == groups.end()) {
      groups.push_back({key, {r}});
    } else {
      it->second.push_back(r);
    }
  }
  for (const auto& [key, members] : groups) {
    const RankView& r = *members.front();
    std::vector<int> list;
    for (const auto* m : members) list.push_back(m->rank);
    std::string head = std::string(list.size() == 1 ? "  rank " : "  ranks ") + rank_list(list) + " [" +
                       state_words(seen_state(r));
    if (list.size() == 1 && r.cpu >= 0) head += ", busy " + std::to_string(static_cast<int>(std::lround(r.cpu * 100))) + "%";
    out += head + "]: " + key.substr(key.find('\n') + 1);
  }
  if (stop_in.count() > 0) {
    char buf[200];
    std::snprintf(buf, sizeof(buf),
                  "the workers still run: ddprun stops them in %.0f s (--hang_stop) unless rank %d makes progress\n",
                  std::chrono::duration<double>(stop_in).count(), silent_rank);
    out += buf;
  } else {
    out += "ddprun stops the workers now\n";
  }
  out += std::string(60, '=') + "\n";
  return out;
}

}  // namespace ddprun::agent
