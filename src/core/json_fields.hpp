#pragma once
// Typed reads of JSON fields whose errors name the field and the document.
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "nereus/base/error.hpp"

namespace nereus::detail {

using json = nlohmann::json;

inline json parse_json(std::string_view text, std::string_view origin) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {  // parse errors, and numbers out of range (found by fuzzing)
    throw Error(std::string(origin) + ": not valid JSON (" + e.what() + ")");
  }
}

inline const json& field(const json& j, const char* key, std::string_view origin) {
  if (!j.is_object()) throw Error(std::string(origin) + ": expected a JSON object");
  auto it = j.find(key);
  if (it == j.end() || it->is_null())
    throw Error(std::string(origin) + ": missing required field '" + key + "'");
  return *it;
}

/// A positive (or, with allow_zero, non-negative) integer; 4096.0 is accepted, 4096.5 is not.
inline std::int64_t integer(const json& v, const char* key, std::string_view origin,
                            bool allow_zero = false) {
  std::int64_t n = 0;
  if (v.is_number_integer()) {
    n = v.get<std::int64_t>();
  } else if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() &&
             std::fabs(v.get<double>()) < 9e15) {
    n = static_cast<std::int64_t>(v.get<double>());
  } else {
    throw Error(std::string(origin) + ": field '" + key + "' must be an integer, got " + v.dump());
  }
  if (n < 0 || (n == 0 && !allow_zero))
    throw Error(std::string(origin) + ": field '" + key + "' must be " +
                (allow_zero ? "non-negative" : "positive") + ", got " + v.dump());
  return n;
}

inline std::int64_t integer_field(const json& j, const char* key, std::string_view origin) {
  return integer(field(j, key, origin), key, origin);
}

inline double number_field(const json& j, const char* key, std::string_view origin) {
  const json& v = field(j, key, origin);
  if (!v.is_number() || !(v.get<double>() > 0))
    throw Error(std::string(origin) + ": field '" + key + "' must be a positive number, got " +
                v.dump());
  return v.get<double>();
}

inline bool bool_field(const json& j, const char* key, bool fallback, std::string_view origin) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean())
    throw Error(std::string(origin) + ": field '" + key + "' must be true or false, got " +
                it->dump());
  return it->get<bool>();
}

inline std::string string_field(const json& j, const char* key, std::string_view origin) {
  const json& v = field(j, key, origin);
  if (!v.is_string())
    throw Error(std::string(origin) + ": field '" + key + "' must be a string, got " + v.dump());
  return v.get<std::string>();
}

}  // namespace nereus::detail
