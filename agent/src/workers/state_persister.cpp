#include "workers/state_persister.hpp"

#include <fcntl.h>
#include <sys/sendfile.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include "ddprun/common/error.hpp"
#include "ddprun/common/state_layout.hpp"
#include "ddprun/common/system.hpp"
#include "ddprun/common/thread.hpp"
#include "workers/state_areas.hpp"

namespace ddprun::agent {
namespace sl = ddprun::state_layout;
namespace {

struct PersistError : Error {
  PersistError(int err, const std::string& what) : Error(what), code(err) {}
  int code;
};

// A system call's failure: "WHAT: strerror" (or strerror alone).
[[noreturn]] void fail(int err, const std::string& what) {
  throw PersistError(err, what.empty() ? std::strerror(err) : what + ": " + std::strerror(err));
}
// A request refused, saying why.
[[noreturn]] void refuse(int err, const std::string& why) { throw PersistError(err, why); }

void pread_all(int fd, unsigned char* buf, std::size_t n, std::uint64_t at) {
  if (const int e = pread_full(fd, buf, n, at)) fail(e, "reading the state area");
}

void pwrite_all(int fd, const unsigned char* buf, std::size_t n, std::uint64_t at) {
  if (const int e = pwrite_full(fd, buf, n, at)) fail(e, "writing it");
}

struct Found {
  std::uint64_t offset = 0;  // of the slot holding the generation asked for; 0: none
  std::uint64_t newest = 0;  // the newest generation committed
  sl::SlotHeader head;
};

// The area's slot that holds `generation` committed, and the newest generation it holds.
Found find_slot(int fd, std::uint64_t area_bytes, std::uint64_t generation) {
  const std::size_t page = sl::page();
  std::vector<unsigned char> buf(page);
  pread_all(fd, buf.data(), page, 0);
  const auto head = sl::header(buf.data());
  Found found;
  if (!head.magic || head.version != sl::kVersion || head.slots != sl::kSlots ||
      head.slot_bytes != sl::area_slot_bytes(area_bytes)) {
    return found;  // nothing saved yet
  }
  for (int i = 0; i < static_cast<int>(sl::kSlots); ++i) {
    const std::uint64_t at = page + static_cast<std::uint64_t>(i) * head.slot_bytes;
    pread_all(fd, buf.data(), sl::kSlotHeaderBytes, at);
    const auto h = sl::slot_header(buf.data());
    if (!h.committed_within(head.slot_bytes)) continue;
    found.newest = std::max(found.newest, h.gen);
    if (h.gen == generation) {
      found.offset = at;
      found.head = h;
    }
  }
  return found;
}

// Copies the slot at `from` (its header page and `payload` bytes) into `out` after a header page.
void copy_slot(int area_fd, std::uint64_t from, std::uint64_t payload, int out) {
  const std::size_t page = sl::page();
  off_t in_at = static_cast<off_t>(from);
  std::uint64_t left = page + payload;
  if (::lseek(out, static_cast<off_t>(page), SEEK_SET) < 0) fail(errno, "writing it");
  while (left > 0) {
    const ssize_t n = ::sendfile(out, area_fd, &in_at, std::min<std::uint64_t>(left, 1ull << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(n < 0 ? errno : EIO, "writing it");
    left -= static_cast<std::uint64_t>(n);
  }
}

// The target's folder, and a hidden file beside the target that becomes it whole.
class Directory {
 public:
  explicit Directory(const std::string& path) {
    const auto slash = path.rfind('/');
    name_ = path.substr(slash + 1);
    if (path.empty() || path[0] != '/' || name_.empty() || name_ == "." || name_ == ".." ||
        path.find('\0') != std::string::npos) {
      refuse(EINVAL, "not the absolute path of a file");
    }
    fd_ = ::open(slash == 0 ? "/" : path.substr(0, slash).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ < 0) fail(errno, "opening its folder");
  }
  ~Directory() {
    if (out_ >= 0) ::close(out_);
    if (!hidden_.empty()) ::unlinkat(fd_, hidden_.c_str(), 0);
    ::close(fd_);
  }
  Directory(const Directory&) = delete;
  Directory& operator=(const Directory&) = delete;

  // A hidden file of a name no one else uses (another agent may write beside the same target).
  int create() {
    std::random_device random;
    for (int tries = 0; out_ < 0; ++tries) {
      hidden_ = fmt::format(".{}.ddprun-{:08x}.tmp", name_, random());
      out_ = ::openat(fd_, hidden_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (out_ < 0) {
        const int err = errno;
        hidden_.clear();
        if (err != EEXIST || tries == 4) fail(err, "creating a file in its folder");
      }
    }
    return out_;
  }
  // Flushes the hidden file and renames it over the target, then flushes the folder.
  void commit() {
    if (::fdatasync(out_) != 0) fail(errno, "flushing it");
    ::close(out_);
    out_ = -1;
    if (::renameat(fd_, hidden_.c_str(), fd_, name_.c_str()) != 0) fail(errno, "renaming it into place");
    hidden_.clear();
    if (::fsync(fd_) != 0) fail(errno, "flushing its folder");
  }

 private:
  int fd_ = -1, out_ = -1;
  std::string name_, hidden_;
};

// The slot of `generation` copied (sendfile: at memory speed, into the page cache) into a hidden
// file beside `path`, its step in `step`; null, with `not_yet` set, where it is not committed yet.
// `check(step)` runs before the copy, and may refuse it (throws).
std::unique_ptr<Directory> copy_slot_to(int area_fd, std::uint64_t area_bytes, std::uint64_t generation,
                                        const std::string& path, std::int64_t* step, bool* not_yet,
                                        const std::function<void(std::int64_t)>& check) {
  const std::size_t page = sl::page();
  const Found slot = find_slot(area_fd, area_bytes, generation);
  *not_yet = slot.offset == 0 && slot.newest < generation;
  if (*not_yet) return nullptr;
  if (slot.offset == 0) {
    refuse(ESTALE, fmt::format("the state asked for (generation {}) was overwritten before it was copied", generation));
  }
  check(slot.head.step);
  auto dir = std::make_unique<Directory>(path);
  const int out = dir->create();
  const std::uint64_t payload = slot.head.payload();
  const std::uint64_t slot_bytes = page + (payload + page - 1) / page * page;
  std::vector<unsigned char> head(page, 0);
  sl::write_header(head.data(), 1, slot_bytes, generation << 1);
  pwrite_all(out, head.data(), page, 0);
  copy_slot(area_fd, slot.offset, payload, out);
  if (::ftruncate(out, static_cast<off_t>(page + slot_bytes)) != 0) fail(errno, "writing it");  // whole pages
  // The request pinned the slot: no save writes it until `copied` says so, or a minute has gone
  // (a save clears the commit word first): a copy that is not that state is refused.
  pread_all(area_fd, head.data(), 8, slot.offset);
  if (sl::read_at<std::uint64_t>(head.data()) != generation) {
    refuse(ESTALE, "the state was overwritten while it was copied (the copy took over a minute)");
  }
  *step = slot.head.step;
  return dir;
}

}  // namespace

// A request taken: its slot copied into a hidden file, to be flushed and renamed; or its failure.
struct StatePersister::Copied {
  int local_rank = 0;
  std::uint64_t number = 0;
  std::string path;
  std::unique_ptr<Directory> dir;
  std::int64_t step = -1;
  int err = 0;        // its failure's errno (EIO where it has none); 0: copied
  std::string error;  // and what it was
};

StatePersister::StatePersister(const StateAreas& areas, std::chrono::milliseconds poll)
    : areas_(areas), poll_(poll), served_(static_cast<std::size_t>(areas.ranks()), 0) {}

bool StatePersister::asked() {
  if (started()) return true;
  for (int r = 0; r < areas_.ranks(); ++r) {
    unsigned char word[8];
    if (::pread(areas_.fd(r), word, 8, sl::kRequestAt) != 8) continue;
    const auto number = sl::read_at<std::uint64_t>(word);
    if (number != 0) {  // (odd: being written; the copier waits for it)
      start();
      return true;
    }
  }
  return false;
}

void StatePersister::start() {
  flusher_ = start_thread("the state persister's flushing thread", [this] { flush(); });
  try {
    copier_ = start_thread("the state persister's thread", [this] { run(); });
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = copied_all_ = true;
    }
    wake_.notify_all();
    flusher_.join();
    throw;
  }
}

StatePersister::~StatePersister() {
  try {
    asked();  // a request made just before the end, not yet seen: the copier's last pass serves it
  } catch (const std::exception& e) {
    spdlog::warn("ddprun: the workers' last persist requests are not served: {}", e.what());
  }
  if (!started()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  copier_.join();
  flusher_.join();
}

void StatePersister::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    const bool last = stop_;
    lock.unlock();
    serve(last);
    lock.lock();
    if (last) break;
    wake_.wait_for(lock, poll_, [this] { return stop_; });
  }
  copied_all_ = true;
  wake_.notify_all();
}

// Every rank's new request: its slot copied and let go (the saves wait for that), then handed to
// the flushing thread, which takes the disk's time. Its failure goes the same way, so that each
// rank's answers come in the order of its requests.
void StatePersister::serve(bool last) {
  for (int r = 0; r < areas_.ranks(); ++r) {
    const int fd = areas_.fd(r);
    std::vector<unsigned char> request(sl::kRequestPathAt - sl::kRequestAt + sl::kRequestPathBytes);
    unsigned char again[8];
    try {
      pread_all(fd, request.data(), 8, sl::kRequestAt);
      const auto number = sl::read_at<std::uint64_t>(request.data());
      if (number == served_[static_cast<std::size_t>(r)] || number % 2 == 1) continue;  // nothing new, or being written
      pread_all(fd, request.data(), request.size(), sl::kRequestAt);
      pread_all(fd, again, 8, sl::kRequestAt);
      if (sl::read_at<std::uint64_t>(again) != number || sl::read_at<std::uint64_t>(request.data()) != number) continue;
    } catch (const std::exception&) {
      continue;
    }
    Copied c;
    c.local_rank = r;
    c.number = sl::read_at<std::uint64_t>(request.data());
    const auto generation = sl::read_at<std::uint64_t>(request.data() + 8);
    const auto length = sl::read_at<std::uint32_t>(request.data() + 16);
    c.path.assign(reinterpret_cast<const char*>(request.data() + (sl::kRequestPathAt - sl::kRequestAt)),
                  std::min<std::size_t>(length, sl::kRequestPathBytes));
    try {
      if (length > sl::kRequestPathBytes) refuse(ENAMETOOLONG, "the path is too long");
      bool not_yet = false;
      c.dir = copy_slot_to(fd, areas_.bytes_per_rank(), generation, c.path, &c.step, &not_yet,
                           [&](std::int64_t step) { shared_path(r, c.path, step); });
      if (not_yet) {
        if (!last) continue;  // that save is still being copied: asked again at the next poll
        refuse(ECANCELED, "the save it asked for never completed (its worker ended mid-save)");
      }
    } catch (const std::exception& e) {
      c.dir.reset();
      c.err = dynamic_cast<const PersistError*>(&e) ? static_cast<const PersistError&>(e).code : EIO;
      c.error = e.what();
    }
    mark_copied(r, c.number);
    served_[static_cast<std::size_t>(r)] = c.number;
    {
      std::lock_guard<std::mutex> lock(mu_);
      copied_.push_back(std::move(c));
    }
    wake_.notify_all();
  }
}

void StatePersister::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [this] { return !copied_.empty() || copied_all_; });
    if (copied_.empty()) return;
    Copied c = std::move(copied_.front());
    copied_.pop_front();
    lock.unlock();
    if (c.dir) {
      try {
        c.dir->commit();
        spdlog::debug("ddprun: local rank {}'s state of step {} persisted to {}", c.local_rank, c.step, c.path);
      } catch (const std::exception& e) {
        c.err = dynamic_cast<const PersistError*>(&e) ? static_cast<const PersistError&>(e).code : EIO;
        c.error = e.what();
      }
      c.dir.reset();
    }
    answer(c);
    lock.lock();
  }
}

// Every rank persisting after the same step to one path (persist("/ckpt/latest.state") on each):
// the file would hold whichever came last, and every rank load that one's data position and
// random state. The first to ask writes it; the others are refused, saying what to do.
// The ranks of a step ask within moments of each other: a request is compared with those of the
// last minute only (a path's earlier writer, in an earlier round, may have been another local
// rank where the nodes' --nproc_per_node differ), and only they are kept.
void StatePersister::shared_path(int local_rank, const std::string& path, std::int64_t step) {
  const auto now = std::chrono::steady_clock::now();
  std::erase_if(writers_, [now](const auto& w) { return now - w.second.at > std::chrono::minutes(1); });
  auto [it, added] = writers_.try_emplace(path, Writer{local_rank, step, now});
  if (added || it->second.local_rank == local_rank || it->second.step != step) {
    it->second = Writer{local_rank, step, now};
    return;
  }
  refuse(EEXIST, fmt::format("local rank {} persisted its state of step {} to this path: every rank needs a file of "
                             "its own, e.g. f\"/ckpt/rank{{dist.get_rank()}}.state\"",
                             it->second.local_rank, step));
}

void StatePersister::mark_copied(int local_rank, std::uint64_t number) {
  unsigned char word[8];
  sl::write_at(word, number);
  try {
    pwrite_all(areas_.fd(local_rank), word, 8, sl::kCopiedAt);
  } catch (const std::exception&) {
  }
}

void StatePersister::answer(const Copied& c) {
  std::string message;
  if (c.err) {
    message = fmt::format("persisting to {}: {} (any earlier file there is kept)", c.path, c.error);
    spdlog::warn("ddprun: local rank {}: {}", c.local_rank, message);
  }
  message.resize(std::min(message.size(), sl::kReplyMessageBytes));
  std::vector<unsigned char> reply(24 + sl::kReplyMessageBytes, 0);
  sl::write_at(reply.data() + 8, c.err ? std::int64_t{-1} : c.step);
  sl::write_at(reply.data() + 16, static_cast<std::int32_t>(c.err));
  sl::write_at(reply.data() + 20, static_cast<std::uint32_t>(message.size()));
  std::memcpy(reply.data() + 24, message.data(), message.size());
  try {
    const int fd = areas_.fd(c.local_rank);
    pwrite_all(fd, reply.data() + 8, reply.size() - 8, sl::kReplyAt + 8);
    sl::write_at(reply.data(), c.number);
    pwrite_all(fd, reply.data(), 8, sl::kReplyAt);  // the answer's number, last
  } catch (const std::exception&) {
  }
}

}  // namespace ddprun::agent
