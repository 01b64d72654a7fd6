#pragma once
// Checks for code on rank threads. Catch 2.13's assertion macros are not thread-safe, so a rank
// thread never calls them: RANK_CHECK throws a RankCheckFailed naming the file, the line, the
// expression and what the message adds; the fixture running the ranks joins them, keeps the
// first failure and rethrows it on the test's own thread, where Catch reports it.

#include <sstream>
#include <stdexcept>
#include <string>

namespace ddprun::test {

class RankCheckFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace ddprun::test

#define RANK_CHECK_MSG(cond, msg)                                                    \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::ostringstream rank_check_os_;                                             \
      rank_check_os_ << __FILE__ << ":" << __LINE__ << ": " << #cond << " " << msg; \
      throw ::ddprun::test::RankCheckFailed(rank_check_os_.str());                   \
    }                                                                                \
  } while (0)
#define RANK_CHECK(cond) RANK_CHECK_MSG(cond, "")
#define RANK_FAIL(msg) RANK_CHECK_MSG(false, msg)
// `expr` must throw `type`.
#define RANK_CHECK_THROWS_AS(expr, type)                         \
  do {                                                           \
    bool rank_check_thrown_ = false;                             \
    try {                                                        \
      expr;                                                      \
    } catch (const type&) {                                      \
      rank_check_thrown_ = true;                                 \
    }                                                            \
    RANK_CHECK_MSG(rank_check_thrown_, "did not throw " #type); \
  } while (0)
// `expr` must throw an exception whose message contains `text`.
#define RANK_CHECK_THROWS_WITH(expr, text)                                                                \
  do {                                                                                                    \
    std::string rank_check_what_;                                                                         \
    try {                                                                                                 \
      expr;                                                                                               \
    } catch (const std::exception& e) {                                                                   \
      rank_check_what_ = e.what();                                                                        \
    }                                                                                                     \
    RANK_CHECK_MSG(rank_check_what_.find(text) != std::string::npos, "threw '" << rank_check_what_ << "'"); \
  } while (0)
