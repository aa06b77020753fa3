// `lockstep inspect FILE [--json]`: lists a safetensors file's tensors and metadata, and groups
// the parts of each quantized tensor (CONTRACT.md section 11) under its base name. Reads only the
// header, so it is instant on multi-gigabyte checkpoints.
#include <fmt/format.h>

#include <array>
#include <charconv>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "commands.h"
#include "lockstep/recipe/json.h"
#include "lockstep/tensor/safetensors.h"

namespace lockstep::cli {
namespace {

// Tensor-name suffixes of a quantized tensor's parts, in the order they are listed.
constexpr std::array<std::string_view, 6> kPartSuffixes = {
    ".qdata", ".block_scale", ".amax", ".scale_inv", ".qdata_colwise", ".block_scale_colwise"};
// Per-tensor metadata attributes: `lockstep.NAME.<attr>`. `hadamard` is written only when true
// (the values were Hadamard-transformed before quantizing; dequantize transforms them back).
constexpr std::array<std::string_view, 8> kAttrs = {
    "format", "scaling", "block2d", "elem", "shape", "dtype", "hadamard", "scale_layout"};
constexpr size_t kHadamardAttr = 6;
constexpr std::string_view kPrefix = "lockstep.";

struct QuantGroup {
  std::string name;
  std::array<const std::string*, kAttrs.size()> attrs{};  // null when the metadata lacks it
  std::vector<std::string> parts;                         // full tensor names present
};

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Base names come from `lockstep.NAME.format` metadata and from `NAME.qdata` tensors, so a file
// whose metadata was stripped still shows its quantized tensors (with unknown attributes).
std::vector<QuantGroup> group_quantized(const SafetensorsHeader& h) {
  std::set<std::string> bases;
  for (const auto& [key, value] : h.metadata) {
    std::string_view k = key;
    if (k.starts_with(kPrefix) && ends_with(k, ".format") && k.size() > kPrefix.size() + 7)
      bases.emplace(k.substr(kPrefix.size(), k.size() - kPrefix.size() - 7));
  }
  std::set<std::string> names;
  for (const auto& t : h.tensors) {
    names.insert(t.name);
    if (ends_with(t.name, ".qdata")) bases.insert(t.name.substr(0, t.name.size() - 6));
  }
  std::vector<QuantGroup> out;
  for (const auto& base : bases) {
    QuantGroup g;
    g.name = base;
    for (size_t i = 0; i < kAttrs.size(); ++i) {
      auto it = h.metadata.find(fmt::format("{}{}.{}", kPrefix, base, kAttrs[i]));
      if (it != h.metadata.end()) g.attrs[i] = &it->second;
    }
    for (auto suffix : kPartSuffixes) {
      std::string part = base + std::string(suffix);
      if (names.contains(part)) g.parts.push_back(part);
    }
    out.push_back(std::move(g));
  }
  return out;
}

// "rows,cols" as [rows, cols]; the raw string when it is not a list of integers.
Json shape_attr_json(const std::string& s) {
  Json dims = Json::array();
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = std::min(s.find(',', pos), s.size());
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(s.data() + pos, s.data() + comma, v);
    if (ec != std::errc() || ptr != s.data() + comma) return s;
    dims.push_back(v);
    pos = comma + 1;
  }
  return dims;
}

Json attr_json(std::string_view attr, const std::string* value) {
  if (!value) return nullptr;
  if ((attr == "block2d" || attr == "hadamard") && (*value == "true" || *value == "false"))
    return *value == "true";
  if (attr == "shape") return shape_attr_json(*value);
  return *value;
}

Json to_json(const std::string& path, const SafetensorsHeader& h,
             const std::vector<QuantGroup>& groups) {
  Json out;
  out["file"] = path;
  out["metadata"] = Json::object();
  for (const auto& [k, v] : h.metadata) out["metadata"][k] = v;
  out["tensors"] = Json::array();
  for (const auto& t : h.tensors)
    out["tensors"].push_back({{"name", t.name},
                              {"dtype", std::string(dtype_name(t.dtype))},
                              {"shape", t.shape},
                              {"bytes", t.end - t.begin}});
  out["quantized"] = Json::array();
  for (const auto& g : groups) {
    Json q;
    q["name"] = g.name;
    for (size_t i = 0; i < kAttrs.size(); ++i)
      q[std::string(kAttrs[i])] = attr_json(kAttrs[i], g.attrs[i]);
    if (!g.attrs[kHadamardAttr] && g.attrs[0]) q["hadamard"] = false;
    q["parts"] = g.parts;
    out["quantized"].push_back(std::move(q));
  }
  return out;
}

// Metadata values and names are arbitrary strings; control characters are shown JSON-escaped so
// one value cannot break the table.
std::string printable(const std::string& s) {
  for (unsigned char c : s)
    if (c < 0x20 || c == 0x7f) return Json(s).dump();
  return s;
}

// A left-aligned text table: column widths from the widest cell.
void print_table(const std::vector<std::vector<std::string>>& rows,
                 std::vector<bool> right_align = {}) {
  if (rows.empty()) return;
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  right_align.resize(width.size(), false);
  for (const auto& r : rows) {
    std::string line = "  ";
    for (size_t i = 0; i < r.size(); ++i) {
      bool last = i + 1 == r.size();
      if (right_align[i])
        line += fmt::format("{:>{}}", r[i], width[i]);
      else
        line += last ? r[i] : fmt::format("{:<{}}", r[i], width[i]);
      if (!last) line += "  ";
    }
    fmt::print("{}\n", line);
  }
}

void print_human(const std::string& path, const SafetensorsHeader& h,
                 const std::vector<QuantGroup>& groups) {
  uint64_t total = 0;
  for (const auto& t : h.tensors) total += t.end - t.begin;
  fmt::print("{}: {} tensors, {} data bytes, {} header bytes, {} metadata keys\n", path,
             h.tensors.size(), total, h.header_bytes, h.metadata.size());

  if (!h.tensors.empty()) {
    fmt::print("\ntensors (file order)\n");
    std::vector<std::vector<std::string>> rows{{"name", "dtype", "shape", "bytes"}};
    for (const auto& t : h.tensors)
      rows.push_back({printable(t.name), std::string(dtype_name(t.dtype)), shape_string(t.shape),
                      std::to_string(t.end - t.begin)});
    print_table(rows, {false, false, false, true});
  }

  if (!h.metadata.empty()) {
    fmt::print("\nmetadata\n");
    std::vector<std::vector<std::string>> rows;
    // Long values (the embedded run_meta JSON) are cut in the table; --json shows them whole.
    auto shorten = [](std::string v) { return v.size() > 100 ? v.substr(0, 97) + "..." : v; };
    for (const auto& [k, v] : h.metadata)
      rows.push_back({printable(k), "=", shorten(printable(v))});
    print_table(rows);
  }

  if (!groups.empty()) {
    fmt::print("\nquantized tensors\n");
    std::vector<std::vector<std::string>> rows{{"name"}};
    for (auto a : kAttrs) rows[0].emplace_back(a);
    rows[0].emplace_back("parts");
    for (const auto& g : groups) {
      std::vector<std::string> r{printable(g.name)};
      for (size_t i = 0; i < kAttrs.size(); ++i) {
        const std::string* v = g.attrs[i];
        const bool absent_false = i == kHadamardAttr && g.attrs[0];  // written only when true
        r.push_back(v ? printable(*v) : absent_false ? "false" : "-");
      }
      std::string parts;
      for (const auto& p : g.parts)
        parts += (parts.empty() ? "" : " ") + p.substr(g.name.size() + 1);
      r.push_back(parts.empty() ? "(none)" : parts);
      rows.push_back(std::move(r));
    }
    print_table(rows);
  }
}

struct InspectOptions {
  std::string path;
  bool json = false;
};

void run_inspect(const InspectOptions& opt) {
  if (std::filesystem::is_directory(opt.path)) {
    inspect_model_dir(opt.path, opt.json);
    return;
  }
  SafetensorsHeader h = read_safetensors_header(opt.path);
  auto groups = group_quantized(h);
  if (opt.json)
    fmt::print("{}\n", to_json(opt.path, h, groups).dump(2));
  else
    print_human(opt.path, h, groups);
}

}  // namespace

void register_inspect_command(CLI::App& app) {
  auto opt = std::make_shared<InspectOptions>();
  CLI::App* cmd = app.add_subcommand(
      "inspect",
      "List a safetensors file's tensors (name, dtype, shape, bytes) and metadata, and group the\n"
      "parts of lockstep quantized tensors (NAME.qdata, NAME.block_scale, ...) with their format.\n"
      "Reads only the header; a malformed file exits with code 2. Given a model directory\n"
      "(config.json + safetensors, single or sharded), loads it with every check and lists the\n"
      "config and the weights in lockstep's layout with FNV-1a 64 checksums of their F32 bytes.\n"
      "Example: lockstep inspect model.safetensors --json\n"
      "         lockstep inspect models/tiny-moe");
  cmd->add_option("file", opt->path, "safetensors file or model directory to inspect")->required();
  cmd->add_flag("--json", opt->json,
                "print one JSON object {file, metadata, tensors, quantized} instead of tables");
  cmd->callback([opt] { run_inspect(*opt); });
}

}  // namespace lockstep::cli
