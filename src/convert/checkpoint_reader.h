// Reading Hugging Face checkpoints by byte range, private to src/convert: where each tensor of a
// model directory lies (single file or index + shards), and one tensor read on demand, so a
// conversion holds only the tensors it works on.
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "lockstep/recipe/json.h"
#include "lockstep/tensor/safetensors.h"

namespace lockstep::convert {

// A JSON file, or ExportError naming it.
Json read_json(const std::filesystem::path& p);

// Where a tensor of a checkpoint lies: its file, header entry and the data section's offset.
struct TensorLocation {
  std::string file;
  TensorInfo info;
  uint64_t data_start = 0;  // 8 + header length
};

// Every tensor of model.safetensors, or of the shards model.safetensors.index.json lists
// (ExportError for neither or both, a missing shard, a tensor in two files).
std::map<std::string, TensorLocation> index_checkpoint(const std::filesystem::path& dir);

// The tensor's bytes, read from its file.
Tensor read_tensor(const TensorLocation& loc);

}  // namespace lockstep::convert
