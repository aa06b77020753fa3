// Reads a whole JSON file (config.json, model.safetensors.index.json) and throws the caller's
// error type, naming the file, when it cannot be opened or is not valid JSON.
#pragma once

#include <fmt/format.h>

#include <string>

#include "lockstep/recipe/json.h"
#include "lockstep/tensor/file_io.h"

namespace lockstep::model {

template <class Error>
Json read_json_file(const std::string& path) {
  std::string text;
  try {
    text = read_input_file(path);  // regular files only: a FIFO or device is refused
  } catch (const InputPathError& e) {
    throw Error(e.what());  // "PATH: cannot open: ..." or "PATH: is a FIFO; ..."
  }
  try {
    return parse_json(text);
  } catch (const Json::parse_error& e) {
    throw Error(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
}

}  // namespace lockstep::model
