// Writing an export (convert/export.h): the output folder is built as a temporary folder beside
// OUT_DIR (shards streamed tensor by tensor, index, config.json, hf_quant_config.json, tokenizer
// files), fsynced and renamed into place only when complete; any error removes it. Shared by
// export_policy_dir (a policy in memory) and convert_model_dir (a streamed checkpoint).
#include "export_write.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "lockstep/tensor/file_io.h"

namespace lockstep::convert {
namespace fs = std::filesystem;
using json = Json;

const std::vector<std::string>& tokenizer_file_names() {
  static const std::vector<std::string> names{"tokenizer.json",
                                              "tokenizer_config.json",
                                              "special_tokens_map.json",
                                              "tokenizer.model",
                                              "vocab.json",
                                              "merges.txt",
                                              "added_tokens.json",
                                              "generation_config.json",
                                              "chat_template.jinja",
                                              "chat_template.json"};
  return names;
}

namespace {

void fsync_path(const fs::path& p, bool dir) {
  const int fd = ::open(p.c_str(), dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// The shard of every tensor: tensors in plan order, a new shard when the next tensor would pass
// the limit (a larger tensor gets a shard alone), as transformers shards.
std::vector<std::vector<size_t>> shard_plan(const std::vector<TensorSpec>& specs, uint64_t limit,
                                            uint64_t& total) {
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0;
  total = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    uint64_t n = dtype_size(specs[i].dtype);
    for (int64_t d : specs[i].shape) n *= uint64_t(d);
    if (limit > 0 && !shards.back().empty() && in_shard + n > limit) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += n;
    total += n;
  }
  return shards;
}

}  // namespace

void check_out_dir(const std::string& out_dir) {
  if (out_dir.empty()) throw ExportError("give the output folder with -o OUT_DIR");
  std::error_code ec;
  const fs::path out(out_dir);
  if (fs::exists(fs::symlink_status(out, ec)))
    throw ExportError(fmt::format(
        "output folder '{}' exists; lockstep writes a new folder and never replaces one (remove "
        "it or choose another name)",
        out_dir));
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  if (!fs::is_directory(parent, ec))
    throw ExportError(fmt::format("output folder '{}': its parent '{}' is not a folder", out_dir,
                                  parent.string()));
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    throw ExportError(
        fmt::format("output folder '{}': cannot write into '{}'", out_dir, parent.string()));
}

ExportResult write_export(const ExportPlan& plan, json config, const std::string& tokenizer_dir,
                          const std::string& out_dir, const UnitProducer& produce) {
  check_out_dir(out_dir);
  const fs::path out(out_dir);
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  std::vector<TensorSpec> specs;
  std::vector<size_t> unit_of;
  for (size_t u = 0; u < plan.units.size(); ++u)
    for (const TensorSpec& s : plan.units[u].specs) {
      specs.push_back(s);
      unit_of.push_back(u);
    }
  uint64_t total = 0;
  const std::vector<std::vector<size_t>> shards =
      shard_plan(specs, plan.opt.max_shard_bytes, total);
  std::vector<std::string> shard_names;
  for (size_t s = 0; s < shards.size(); ++s)
    shard_names.push_back(shards.size() == 1 ? std::string("model.safetensors")
                                             : fmt::format("model-{:05d}-of-{:05d}.safetensors",
                                                           s + 1, shards.size()));

  std::string tmpl = (parent / fmt::format(".{}.tmp.XXXXXX", out.filename().string())).string();
  if (!::mkdtemp(tmpl.data()))
    throw ExportError(fmt::format("output folder '{}': cannot create a temporary folder in '{}'",
                                  out_dir, parent.string()));
  const fs::path tmp(tmpl);
  ExportResult result;
  try {
    std::map<std::string, std::string> metadata = plan.opt.metadata;
    metadata["format"] = "pt";
    metadata["lockstep.export_format"] = std::string(hf_format_name(plan.opt.format));
    metadata["lockstep.contract"] = "1";
    metadata["lockstep.recipe"] = plan.recipe.name;
    // Shards are written in order; a unit's tensors may cross into the next shard.
    size_t shard = 0, next_in_shard = 0;
    std::unique_ptr<AtomicFile> file;
    std::unique_ptr<SafetensorsStreamWriter> writer;
    auto open_shard = [&](size_t s) {
      std::vector<TensorSpec> members;
      for (size_t i : shards[s]) members.push_back(specs[i]);
      writer = std::make_unique<SafetensorsStreamWriter>(members, metadata,
                                                         (tmp / shard_names[s]).string());
      file = std::make_unique<AtomicFile>((tmp / shard_names[s]).string());
      writer->start(*file);
    };
    auto close_shard = [&]() {
      writer->finish();
      file->commit();
      result.files.push_back(shard_names[shard]);
      writer.reset();
      file.reset();
    };
    open_shard(0);
    size_t spec_index = 0;
    for (size_t u = 0; u < plan.units.size(); ++u) {
      const ExportUnit& unit = plan.units[u];
      if (unit.specs.empty()) continue;
      const std::vector<NamedTensor> tensors = produce(unit);
      if (tensors.size() != unit.specs.size())
        throw std::logic_error(fmt::format("export: unit '{}' produced {} tensors, planned {}",
                                           unit.name, tensors.size(), unit.specs.size()));
      for (const NamedTensor& t : tensors) {
        if (next_in_shard == shards[shard].size()) {
          close_shard();
          open_shard(++shard);
          next_in_shard = 0;
        }
        writer->write(t.name, t.tensor);
        result.tensor_bytes += t.tensor.nbytes();
        ++next_in_shard;
        ++spec_index;
      }
      if (unit.linear) ++(unit.quantized ? result.quantized_modules : result.bf16_modules);
      if (plan.opt.on_progress) plan.opt.on_progress(int64_t(u + 1), int64_t(plan.units.size()));
    }
    close_shard();
    if (spec_index != specs.size()) throw std::logic_error("export: tensors left unwritten");

    if (shards.size() > 1) {
      json weight_map = json::object();
      for (size_t s = 0; s < shards.size(); ++s)
        for (size_t i : shards[s]) weight_map[specs[i].name] = shard_names[s];
      const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
      write_file_atomic((tmp / "model.safetensors.index.json").string(), index.dump(2) + "\n");
      result.files.push_back("model.safetensors.index.json");
    }
    config["torch_dtype"] = "bfloat16";
    config["quantization_config"] = quantization_config(plan);
    write_file_atomic((tmp / "config.json").string(), config.dump(2) + "\n");
    result.files.push_back("config.json");
    if (const json hq = hf_quant_config(plan); !hq.is_null()) {
      write_file_atomic((tmp / "hf_quant_config.json").string(), hq.dump(2) + "\n");
      result.files.push_back("hf_quant_config.json");
    }
    if (!tokenizer_dir.empty())
      for (const std::string& name : tokenizer_file_names()) {
        const fs::path src = fs::path(tokenizer_dir) / name;
        std::error_code ec;
        if (!fs::is_regular_file(src, ec)) continue;
        fs::copy_file(src, tmp / name, ec);
        if (ec)
          throw FileWriteError(
              fmt::format("{}: cannot copy into the export: {}", src.string(), ec.message()));
        fsync_path(tmp / name, false);
        result.files.push_back(name);
      }
    fsync_path(tmp, true);
    // Never over a folder that appeared meanwhile (rename alone would replace an empty one).
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, out.c_str(), RENAME_NOREPLACE) != 0) {
      const int err = errno;
      if (err == EEXIST || err == ENOTEMPTY)
        throw ExportError(
            fmt::format("output folder '{}' appeared while the export was written; "
                        "it was left as it is",
                        out_dir));
      throw FileWriteError(
          fmt::format("cannot move the finished export to '{}': {}", out_dir, std::strerror(err)));
    }
    fsync_path(parent, true);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  return result;
}

}  // namespace lockstep::convert
