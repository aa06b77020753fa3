// Reads a whole JSON file (config.json, model.safetensors.index.json) and throws the caller's
// error type, naming the file, when it cannot be opened or is not valid JSON.
#pragma once

#include <fmt/format.h>

#include <fstream>
#include <sstream>
#include <string>

#include "lockstep/recipe/json.h"

namespace lockstep::model {

template <class Error>
Json read_json_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(fmt::format("{}: cannot open", path));
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return parse_json(ss.str());
  } catch (const Json::parse_error& e) {
    throw Error(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
}

}  // namespace lockstep::model
