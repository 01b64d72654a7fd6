#pragma once
// Small text helpers every part of ddprun shares: strict integer parsing, durations and
// addresses in messages, splitting and trimming. One copy each (they used to exist in up to four).

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun {

// The whole of `s` as a base-10 integer: no sign other than a leading '-', no spaces, no
// trailing text, no overflow. nullopt otherwise.
std::optional<long long> parse_int(std::string_view s) noexcept;
// As parse_int, and within [lo, hi].
std::optional<long long> parse_int(std::string_view s, long long lo, long long hi) noexcept;
// A finite decimal number ("1.5", "2", "1e3"); nullopt for anything else.
std::optional<double> parse_double(std::string_view s) noexcept;

// "5 s", "250 ms", "1.5 s": for messages about time-outs and durations.
std::string duration_text(std::chrono::milliseconds d);

// "host:port", or "[v6]:port" for an IPv6 literal.
std::string format_address(const std::string& host, std::uint16_t port);

// Bytes someone else chose (a store client's key, a peer's host name), made safe to put in a log
// line or an error message: one line of printable ASCII, so that they can neither start a line of
// their own nor send escape sequences to the operator's terminal. A newline, carriage return and
// tab become \n \r \t, a backslash becomes two, any other byte under 0x20 or from 0x7f up
// becomes \xNN. At most the first `max_bytes` are shown; a longer input ends in "... (N bytes)".
std::string escape_for_log(std::string_view bytes, std::size_t max_bytes = 64);

// An error message with each quoted value over `max` bytes cut to its first 60 and its length (an
// argument of 100 KB is not echoed whole; a path a message asks to copy, up to 1 KiB, stays whole);
// a message still over 4 KiB is cut too.
std::string shorten_quoted(const std::string& message, std::size_t max = 1024);

// Splits at every `sep` (empty fields kept, none for an empty string).
std::vector<std::string> split(std::string_view s, char sep);
// Without leading and trailing white space.
std::string trim(std::string_view s);
// In lower case (ASCII).
std::string lower(std::string_view s);

}  // namespace ddprun
