// Reading Hugging Face checkpoints by byte range (checkpoint_reader.h).
#include "checkpoint_reader.h"

#include <fmt/format.h>

#include <fstream>

#include "lockstep/convert/hf_format.h"
#include "lockstep/model/weights.h"

namespace lockstep::convert {
namespace fs = std::filesystem;
using json = Json;

json read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw ExportError(fmt::format("{}: cannot read", p.string()));
  try {
    return json::parse(in);
  } catch (const std::exception& e) {
    throw ExportError(fmt::format("{}: not JSON ({})", p.string(), e.what()));
  }
}

std::map<std::string, TensorLocation> index_checkpoint(const fs::path& dir) {
  const fs::path single = dir / model::kSingleWeightsFile, index = dir / model::kIndexFile;
  const bool has_single = fs::exists(single), has_index = fs::exists(index);
  if (has_single && has_index)
    throw ExportError(fmt::format("{}: holds both {} and {}; remove one", dir.string(),
                                  model::kSingleWeightsFile, model::kIndexFile));
  if (!has_single && !has_index)
    throw ExportError(fmt::format("{}: no {} and no {} (not a model directory)", dir.string(),
                                  model::kSingleWeightsFile, model::kIndexFile));
  std::vector<std::string> files;
  if (has_single) {
    files.push_back(single.string());
  } else {
    const model::ShardIndex ix = model::parse_shard_index(read_json(index), index.string());
    for (const std::string& s : ix.shards) files.push_back((dir / s).string());
  }
  std::map<std::string, TensorLocation> out;
  for (const std::string& f : files) {
    if (!fs::is_regular_file(f))
      throw ExportError(fmt::format("{}: shard '{}' does not exist", index.string(), f));
    const SafetensorsHeader h = read_safetensors_header(f);
    for (const TensorInfo& t : h.tensors) {
      if (out.contains(t.name))
        throw ExportError(
            fmt::format("{}: tensor '{}' is also in {}", f, t.name, out.at(t.name).file));
      out.emplace(t.name, TensorLocation{f, t, 8 + h.header_bytes});
    }
  }
  return out;
}

Tensor read_tensor(const TensorLocation& loc) {
  Tensor t(loc.info.dtype, loc.info.shape);
  std::ifstream in(loc.file, std::ios::binary);
  in.seekg(std::streamoff(loc.data_start + loc.info.begin));
  in.read(static_cast<char*>(t.raw()), std::streamsize(loc.info.end - loc.info.begin));
  if (!in) throw ExportError(fmt::format("{}: cannot read tensor '{}'", loc.file, loc.info.name));
  return t;
}

}  // namespace lockstep::convert
