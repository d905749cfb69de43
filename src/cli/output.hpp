#pragma once
// Shared formatting for the front end: byte figures and JSON of plan objects.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "nereus/core/bytes.hpp"
#include "nereus/core/model.hpp"
#include "nereus/plan/transfer.hpp"

namespace nereus::cli {


/// One transfer as interfaces.md's `transfers` entry, plus its buffer views.
nlohmann::json transfer_json(const ModelSpec& model, const Transfer& t);

}  // namespace nereus::cli
