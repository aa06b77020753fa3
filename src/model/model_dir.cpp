// Model directories in the Hugging Face layout: config.json plus model.safetensors, or
// model.safetensors.index.json plus shards. The index is validated against the shards' headers
// before any tensor is read; every error names the file and the tensor.
#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <set>

#include "json_file.h"
#include "lockstep/model/weights.h"

namespace lockstep::model {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kShardSuffix = ".safetensors";

// A shard file name as an index may give it: a plain name in the model directory.
void check_shard_name(const std::string& file, const std::string& where,
                      const std::string& tensor) {
  const bool plain = !file.empty() && file != "." && file != ".." &&
                     file.find('/') == std::string::npos && file.find('\\') == std::string::npos &&
                     file.find('\0') == std::string::npos;
  if (!plain || file.size() <= kShardSuffix.size() ||
      file.compare(file.size() - kShardSuffix.size(), kShardSuffix.size(), kShardSuffix) != 0)
    throw WeightsError(fmt::format(
        "{}: weight_map entry '{}': shard {} is not a plain '*.safetensors' file name in the "
        "model directory",
        where, tensor, Json(file).dump(-1, ' ', false, Json::error_handler_t::replace)));
}

void write_text_atomic(const fs::path& path, const std::string& text) {
  write_bytes_atomic(path.string(), std::as_bytes(std::span<const char>(text.data(), text.size())));
}

std::string dtype_label(DType d) {
  switch (d) {
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    default:
      throw WeightsError(fmt::format("save_model_dir: dtype {} is not F32 or BF16", dtype_name(d)));
  }
}

// Shard names of an index file already in `dir` (for removing stale shards); none when absent or
// unreadable.
std::set<std::string> existing_index_shards(const fs::path& dir) {
  std::set<std::string> out;
  const fs::path p = dir / kIndexFile;
  if (!fs::exists(p)) return out;
  try {
    for (const auto& s :
         parse_shard_index(read_json_file<WeightsError>(p.string()), p.string()).shards)
      out.insert(s);
  } catch (const std::exception&) {
    // An unreadable old index lists nothing we can safely remove.
  }
  return out;
}

void remove_if_exists(const fs::path& p) {
  std::error_code ec;
  fs::remove(p, ec);
  if (ec)
    throw WeightsError(
        fmt::format("{}: cannot remove the stale file: {}", p.string(), ec.message()));
}

}  // namespace

ShardIndex parse_shard_index(const Json& j, const std::string& where) {
  if (!j.is_object()) throw WeightsError(fmt::format("{}: an index must be a JSON object", where));
  auto wm = j.find("weight_map");
  if (wm == j.end()) throw WeightsError(fmt::format("{}: no \"weight_map\"", where));
  if (!wm->is_object())
    throw WeightsError(
        fmt::format("{}: \"weight_map\" must be an object of tensor -> shard file", where));
  if (auto md = j.find("metadata"); md != j.end() && !md->is_object() && !md->is_null())
    throw WeightsError(fmt::format("{}: \"metadata\" must be an object", where));
  ShardIndex index;
  std::set<std::string> shards;
  for (const auto& [tensor, file] : wm->items()) {
    if (!file.is_string())
      throw WeightsError(fmt::format("{}: weight_map entry '{}': shard must be a file name, got {}",
                                     where, tensor,
                                     file.dump(-1, ' ', false, Json::error_handler_t::replace)));
    const std::string name = file.get<std::string>();
    check_shard_name(name, where, tensor);
    index.weight_map.emplace(tensor, name);
    shards.insert(name);
  }
  if (index.weight_map.empty())
    throw WeightsError(fmt::format("{}: \"weight_map\" is empty", where));
  index.shards.assign(shards.begin(), shards.end());
  return index;
}

void check_shard_index(const ShardIndex& index,
                       const std::map<std::string, std::vector<std::string>>& shard_tensors,
                       const std::string& where) {
  std::map<std::string, std::string> holder;  // tensor -> the shard that holds it
  for (const auto& [shard, names] : shard_tensors) {
    for (const auto& name : names) {
      auto [it, fresh] = holder.emplace(name, shard);
      if (!fresh)
        throw WeightsError(fmt::format("{}: tensor '{}' is in two shards, '{}' and '{}'", where,
                                       name, it->second, shard));
      if (!index.weight_map.contains(name))
        throw WeightsError(fmt::format(
            "{}: shard '{}' holds tensor '{}', which the index does not list", where, shard, name));
    }
  }
  for (const auto& [tensor, shard] : index.weight_map) {
    if (!shard_tensors.contains(shard))
      throw WeightsError(
          fmt::format("{}: the index lists shard '{}' (for tensor '{}'), which was not read", where,
                      shard, tensor));
    auto it = holder.find(tensor);
    if (it == holder.end())
      throw WeightsError(
          fmt::format("{}: the index lists tensor '{}' in shard '{}', which does not hold it",
                      where, tensor, shard));
    if (it->second != shard)
      throw WeightsError(
          fmt::format("{}: the index lists tensor '{}' in shard '{}', but it is in '{}'", where,
                      tensor, shard, it->second));
  }
}

ModelWeights load_model_dir(const std::string& dir_name) {
  const fs::path dir(dir_name);
  if (!fs::is_directory(dir))
    throw WeightsError(
        fmt::format("{}: not a model directory (config.json + safetensors)", dir_name));
  const fs::path config_path = dir / kConfigFile;
  if (!fs::exists(config_path))
    throw ConfigError(
        fmt::format("{}: no config.json in the model directory", config_path.string()));
  const ModelConfig config = load_config(config_path.string());

  const fs::path single = dir / kSingleWeightsFile, index_path = dir / kIndexFile;
  const bool has_single = fs::exists(single), has_index = fs::exists(index_path);
  if (has_single && has_index)
    throw WeightsError(
        fmt::format("{}: holds both {} and {}; remove one (which is current is ambiguous)",
                    dir_name, kSingleWeightsFile, kIndexFile));
  std::map<std::string, Tensor> hf;
  std::map<std::string, std::string> file_of;
  if (has_single) {
    for (auto& nt : read_safetensors(single.string()).tensors) {
      file_of.emplace(nt.name, single.string());
      hf.emplace(std::move(nt.name), std::move(nt.tensor));
    }
    return weights_from_hf(config, hf, single.string(), &file_of);
  }
  if (!has_index)
    throw WeightsError(
        fmt::format("{}: no {} and no {}", dir_name, kSingleWeightsFile, kIndexFile));

  const std::string where = index_path.string();
  const ShardIndex index = parse_shard_index(read_json_file<WeightsError>(where), where);
  // Every shard exists and its header agrees with the index before any data is read.
  std::map<std::string, std::vector<std::string>> shard_tensors;
  for (const auto& shard : index.shards) {
    const fs::path p = dir / shard;
    if (!fs::is_regular_file(p)) {
      std::string tensor;
      for (const auto& [t, s] : index.weight_map)
        if (s == shard) {
          tensor = t;
          break;
        }
      throw WeightsError(fmt::format("{}: shard '{}' (listed for tensor '{}') does not exist in {}",
                                     where, shard, tensor, dir_name));
    }
    auto& names = shard_tensors[shard];
    for (const auto& info : read_safetensors_header(p.string()).tensors) names.push_back(info.name);
  }
  check_shard_index(index, shard_tensors, where);
  for (const auto& shard : index.shards) {
    const std::string path = (dir / shard).string();
    for (auto& nt : read_safetensors(path).tensors) {
      file_of.emplace(nt.name, path);
      hf.emplace(std::move(nt.name), std::move(nt.tensor));
    }
  }
  return weights_from_hf(config, hf, where, &file_of);
}

void save_model_dir(const ModelWeights& w, const std::string& dir_name, DType dtype,
                    size_t max_shard_bytes, const std::map<std::string, std::string>& metadata) {
  const std::string label = dtype_label(dtype);
  validate_config(w.config, dir_name + "/" + kConfigFile);
  std::vector<NamedTensor> tensors = weights_to_hf_ordered(w, dtype);

  // Shards: tensors in layout order, a new shard when the next tensor would pass the limit.
  std::vector<std::vector<size_t>> shards(1);
  size_t total = 0, in_shard = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const size_t n = tensors[i].tensor.nbytes();
    if (max_shard_bytes > 0 && !shards.back().empty() && in_shard + n > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += n;
    total += n;
  }

  const fs::path dir(dir_name);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw WeightsError(fmt::format("{}: cannot create the directory: {}", dir_name, ec.message()));
  const std::set<std::string> stale_shards = existing_index_shards(dir);

  std::map<std::string, std::string> file_metadata = metadata;
  file_metadata["format"] = "pt";
  auto write_file = [&](const fs::path& path, const std::vector<size_t>& members) {
    SafetensorsFile f;
    f.metadata = file_metadata;
    for (size_t i : members) f.tensors.push_back(tensors[i]);
    write_safetensors(path.string(), f);
  };

  std::set<std::string> written;
  if (shards.size() == 1) {
    write_file(dir / kSingleWeightsFile, shards[0]);
    written.insert(kSingleWeightsFile);
    if (fs::exists(dir / kIndexFile)) remove_if_exists(dir / kIndexFile);
  } else {
    // Tensor -> shard, sorted by tensor name as transformers writes it; the names are unique, so
    // each entry is appended without a search (an index has tens of thousands).
    std::map<std::string, std::string> by_name;
    for (size_t s = 0; s < shards.size(); ++s) {
      const std::string name =
          fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
      write_file(dir / name, shards[s]);
      written.insert(name);
      for (size_t i : shards[s]) by_name.emplace(tensors[i].name, name);
    }
    Json weight_map = Json::object();
    for (const auto& [tensor, shard] : by_name) append_new_key(weight_map, tensor, shard);
    Json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = std::move(weight_map);
    write_text_atomic(dir / kIndexFile, index.dump(2) + "\n");
    if (fs::exists(dir / kSingleWeightsFile)) remove_if_exists(dir / kSingleWeightsFile);
  }
  for (const auto& s : stale_shards)
    if (!written.contains(s) && fs::exists(dir / s)) remove_if_exists(dir / s);

  Json config = config_to_json(w.config);
  config["torch_dtype"] = label;
  write_text_atomic(dir / kConfigFile, config.dump(2) + "\n");
}

}  // namespace lockstep::model
