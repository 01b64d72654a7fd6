#pragma once
// Strict reading of the JSON records nodes exchange: a wrong type or a value out of range is a
// ProtocolError naming the key and the field.

#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>

#include "ddprun/common/error.hpp"

namespace ddprun::rounds::json_fields {

using json = nlohmann::json;

[[noreturn]] inline void malformed(const std::string& key, const std::string& why) {
  throw ProtocolError("rendezvous: malformed value at key '" + key + "': " + why +
                      " (written by a different ddprun version, or by something other than ddprun?)");
}

// `value` as a JSON object.
inline json object(const std::string& key, const std::string& value) {
  auto j = json::parse(value, nullptr, false);
  if (j.is_discarded()) malformed(key, "not JSON (" + std::to_string(value.size()) + " bytes)");
  if (!j.is_object()) malformed(key, std::string("a JSON ") + j.type_name() + ", not an object");
  return j;
}

// `j` as text; bytes that are not UTF-8 (a worker's output cut mid-character) become U+FFFD
// rather than an exception.
inline std::string text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Field `name` of `j` (absent or null: `fallback`): a string, a bool, or an integer within T.
template <typename T>
T field(const json& j, const std::string& key, const char* name, T fallback) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return fallback;
  auto wrong = [&](const char* want) {
    malformed(key, std::string("field '") + name + "' is a " + it->type_name() + ", not " + want);
  };
  if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) wrong("a string");
    return it->template get<std::string>();
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) wrong("a boolean");
    return it->template get<bool>();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!it->is_number()) wrong("a number");
    return it->template get<T>();
  } else {
    if (!it->is_number_integer()) wrong("an integer");
    // Above LLONG_MAX (JSON's unsigned numbers) a cast to long long would wrap to a small one.
    if (it->is_number_unsigned() &&
        it->template get<unsigned long long>() > static_cast<unsigned long long>(std::numeric_limits<long long>::max())) {
      malformed(key, std::string("field '") + name + "' is out of range");
    }
    auto v = it->template get<long long>();
    if (v < static_cast<long long>(std::numeric_limits<T>::min()) ||
        v > static_cast<long long>(std::numeric_limits<T>::max())) {
      malformed(key, std::string("field '") + name + "' is out of range");
    }
    return static_cast<T>(v);
  }
}

}  // namespace ddprun::rounds::json_fields
