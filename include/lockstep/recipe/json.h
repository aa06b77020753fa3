// The one JSON type of lockstep: recipes, model configs and checkpoints, run metadata, metrics
// rows, reports and CLI output all use it, so no value is dumped and parsed again to cross a layer.
// Objects keep the order their writer chose (schema order, "step" first in metrics rows).
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

namespace lockstep {

using Json = nlohmann::ordered_json;

// Parses JSON text in time linear in its size. Json's own parser checks each object key against
// every key before it (quadratic in an object's size; a model's shard index has tens of thousands
// of keys); this one keeps a hash of each large object's keys. A repeated key keeps its last value,
// as Json::parse does. Throws what Json::parse throws (Json::parse_error; Json::out_of_range for a
// number such as 1e999).
Json parse_json(std::string_view text);

// Appends `key: value` to the object j without looking for an earlier `key` (constant time; the
// caller guarantees the key is new, e.g. the keys of a std::map). j must be an object.
void append_new_key(Json& j, const std::string& key, Json value);

}  // namespace lockstep
