// libFuzzer target for the model directory readers: config.json (config_from_json) and
// model.safetensors.index.json (parse_shard_index, check_shard_index). Any input is either
// accepted or refused with ConfigError / WeightsError (anything else, or a sanitizer report, is a
// bug); an accepted config survives config_to_json -> config_from_json unchanged and its layout's
// sizes fit int64; an accepted index passes the check against shards holding exactly what it
// lists and fails it when one tensor is moved to another shard or duplicated.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include "lockstep/model/config.h"
#include "lockstep/model/weights.h"

namespace {
using namespace lockstep::model;

void fuzz_config(const Json& j) {
  ModelConfig c;
  try {
    c = config_from_json(j, "fuzz/config.json");
  } catch (const ConfigError&) {
    return;
  }
  const ModelConfig back = config_from_json(config_to_json(c), "fuzz/roundtrip");
  if (!(back == c)) std::abort();
  validate_config(c, "fuzz/validate");
  // Every tensor's element count, and their sum, fit int64 (UBSan reports an overflow).
  int64_t total = 0;
  for (const auto& [name, shape] : weight_shapes(c)) {
    int64_t n = 1;
    for (int64_t d : shape) {
      if (d <= 0) std::abort();
      n *= d;
    }
    if (n > std::numeric_limits<int64_t>::max() / 4 - total) std::abort();
    total += n;
  }
}

bool check_throws(const ShardIndex& index,
                  const std::map<std::string, std::vector<std::string>>& shards) {
  try {
    check_shard_index(index, shards, "fuzz/index");
  } catch (const WeightsError&) {
    return true;
  }
  return false;
}

void fuzz_index(const Json& j) {
  ShardIndex index;
  try {
    index = parse_shard_index(j, "fuzz/index");
  } catch (const WeightsError&) {
    return;
  }
  if (index.shards.empty()) std::abort();
  std::map<std::string, std::vector<std::string>> shards;
  for (const auto& s : index.shards) shards[s];
  for (const auto& [tensor, shard] : index.weight_map) shards.at(shard).push_back(tensor);
  check_shard_index(index, shards, "fuzz/index");  // consistent shards: must pass
  const auto& [tensor, shard] = *index.weight_map.begin();
  auto dup = shards;
  dup[shard + ".other.safetensors"].push_back(tensor);  // in two shards
  if (!check_throws(index, dup)) std::abort();
  if (index.shards.size() > 1) {  // moved to a shard the index does not name for it
    auto moved = shards;
    auto& from = moved.at(shard);
    from.erase(std::find(from.begin(), from.end(), tensor));
    moved.at(index.shards[0] == shard ? index.shards[1] : index.shards[0]).push_back(tensor);
    if (!check_throws(index, moved)) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Json j = Json::parse(data, data + size, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;  // not JSON: the readers turn json::parse_error into their own
  fuzz_config(j);
  fuzz_index(j);
  return 0;
}
