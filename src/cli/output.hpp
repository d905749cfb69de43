#pragma once
// Shared formatting for the front end: byte figures and JSON of plan objects.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "nereus/core/model.hpp"
#include "nereus/plan/transfer.hpp"

namespace nereus::cli {

/// "56.21 GB" (1 GB = 10^9 B), "3.2 MB", "512 B".
std::string human_bytes(std::uint64_t bytes);

/// One transfer as interfaces.md's `transfers` entry, plus its buffer views.
nlohmann::json transfer_json(const ModelSpec& model, const Transfer& t);

}  // namespace nereus::cli
