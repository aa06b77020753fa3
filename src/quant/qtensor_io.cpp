// Serialization of QTensor parts into safetensors tensors and metadata, and the checked inverse.
#include "lockstep/quant/qtensor_io.h"

#include <fmt/format.h>

#include <cstring>
#include <set>

#include "lockstep/quant/layout.h"

namespace lockstep {
namespace {

constexpr const char* kParts[] = {".qdata", ".block_scale", ".amax", ".scale_inv", ".qdata_colwise",
                                  ".block_scale_colwise", ".group_offsets"};

template <class T>
Tensor make_tensor(DType dtype, std::vector<int64_t> shape, const std::vector<T>& values) {
  Tensor t(dtype, std::move(shape));
  if (t.nbytes() != values.size() * sizeof(T))
    throw std::logic_error(fmt::format("qtensor part {} holds {} bytes, expected {}", t.describe(),
                                       values.size() * sizeof(T), t.nbytes()));
  if (!values.empty()) std::memcpy(t.bytes().data(), values.data(), t.nbytes());
  return t;
}

std::string meta_key(const std::string& name, const char* field) { return fmt::format("lockstep.{}.{}", name, field); }

std::string elem_name(const QTensor& q) {
  if (q.format == Format::kNvfp4) return "e2m1";
  return q.elem == ElemCodec::kE5M2 ? "e5m2" : "e4m3";
}

DType elem_dtype(const QTensor& q) { return q.elem == ElemCodec::kE5M2 ? DType::kF8E5M2 : DType::kF8E4M3; }

std::vector<int64_t> scale_shape(const QTensor& q) {
  if (q.scale_layout == ScaleLayout::kSwizzled) return {round_up(q.scale_rows, 128), round_up(q.scale_cols, 4)};
  return {q.scale_rows, q.scale_cols};
}

// Shape of the stored amax / scale_inv vector.
std::vector<int64_t> outer_shape(const QTensor& q, size_t n) {
  if (q.scaling == Scaling::kPerTensor) return {};
  if (q.scaling == Scaling::kBlock1x128 || q.scaling == Scaling::kBlock128x128) return {q.scale_inv_rows, q.scale_inv_cols};
  return {int64_t(n)};
}

[[noreturn]] void fail(const std::string& name, const std::string& what) {
  throw SafetensorsError(fmt::format("quantized tensor '{}': {}", name, what));
}

const Tensor& part(const SafetensorsFile& f, const std::string& name, const char* suffix, DType dtype,
                   const std::vector<int64_t>& shape) {
  const Tensor* t = f.find(name + suffix);
  if (!t) fail(name, fmt::format("missing part {}{}", name, suffix));
  if (t->dtype() != dtype || t->shape() != shape)
    fail(name, fmt::format("part {}{} is {}, expected {} {}", name, suffix, t->describe(), shape_string(shape),
                           dtype_name(dtype)));
  return *t;
}

template <class T>
std::vector<T> bytes_as(const Tensor& t) {
  std::vector<T> v(t.nbytes() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), t.bytes().data(), t.nbytes());
  return v;
}

}  // namespace

void add_qtensor(SafetensorsFile& file, const std::string& name, const QTensor& q, DType source) {
  auto add = [&](const char* suffix, Tensor t) { file.tensors.push_back({name + suffix, std::move(t)}); };
  auto& md = file.metadata;
  md["lockstep.contract"] = kContractVersion;
  md[meta_key(name, "format")] = std::string(format_name(q.format));
  md[meta_key(name, "scaling")] = std::string(scaling_name(q.scaling));
  md[meta_key(name, "block2d")] = q.block2d ? "true" : "false";
  md[meta_key(name, "elem")] = elem_name(q);
  md[meta_key(name, "shape")] = fmt::format("{},{}", q.rows, q.cols);
  md[meta_key(name, "dtype")] = std::string(dtype_name(source));
  md[meta_key(name, "scale_layout")] = q.scale_layout == ScaleLayout::kCompact ? "compact" : "swizzled";
  switch (q.format) {
    case Format::kNvfp4:
      add(".qdata", make_tensor(DType::kU8, {q.rows, q.cols / 2}, q.data));
      add(".block_scale", make_tensor(DType::kF8E4M3, scale_shape(q), q.block_scale));
      add(".amax", make_tensor(DType::kF32, outer_shape(q, q.amax.size()), q.amax));
      break;
    case Format::kMxfp8:
      md[meta_key(name, "rowwise")] = q.has_rowwise ? "true" : "false";
      if (q.has_rowwise) {
        add(".qdata", make_tensor(elem_dtype(q), {q.rows, q.cols}, q.data));
        add(".block_scale", make_tensor(DType::kF8E8M0, scale_shape(q), q.block_scale));
      }
      if (!q.data_colwise.empty() || (!q.has_rowwise && q.rows * q.cols == 0)) {
        add(".qdata_colwise", make_tensor(elem_dtype(q), {q.rows, q.cols}, q.data_colwise));
        add(".block_scale_colwise", make_tensor(DType::kF8E8M0, {q.rows / 32, q.cols}, q.block_scale_colwise));
      }
      break;
    case Format::kFp8:
      add(".qdata", make_tensor(elem_dtype(q), {q.rows, q.cols}, q.data));
      add(".scale_inv", make_tensor(DType::kF32, outer_shape(q, q.scale_inv.size()), q.scale_inv));
      break;
    case Format::kCount: break;
  }
  if (!q.group_offsets.empty())
    add(".group_offsets", make_tensor(DType::kI64, {int64_t(q.group_offsets.size())}, q.group_offsets));
}

std::vector<std::string> quantized_tensor_names(const SafetensorsFile& file) {
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (const auto& [key, value] : file.metadata) {
    const std::string prefix = "lockstep.", suffix = ".format";
    if (key.size() > prefix.size() + suffix.size() && key.starts_with(prefix) && key.ends_with(suffix)) {
      std::string name = key.substr(prefix.size(), key.size() - prefix.size() - suffix.size());
      if (seen.insert(name).second) names.push_back(name);
    }
  }
  return names;
}

bool is_qtensor_part(const SafetensorsFile& file, const std::string& tensor_name) {
  for (const char* suffix : kParts) {
    std::string s(suffix);
    if (tensor_name.size() > s.size() && tensor_name.ends_with(s)) {
      std::string base = tensor_name.substr(0, tensor_name.size() - s.size());
      if (file.metadata.count(meta_key(base, "format"))) return true;
    }
  }
  return false;
}

QTensor read_qtensor(const SafetensorsFile& file, const std::string& name, DType* source) {
  auto meta = [&](const char* field) -> std::string {
    auto it = file.metadata.find(meta_key(name, field));
    if (it == file.metadata.end()) fail(name, fmt::format("metadata '{}' is missing", meta_key(name, field)));
    return it->second;
  };
  QTensor q;
  auto fmt_opt = format_from_name(meta("format"));
  if (!fmt_opt) fail(name, fmt::format("unknown format '{}'", meta("format")));
  q.format = *fmt_opt;
  auto sc = scaling_from_name(meta("scaling"));
  if (!sc) fail(name, fmt::format("unknown scaling '{}'", meta("scaling")));
  q.scaling = *sc;
  q.block2d = meta("block2d") == "true";
  const std::string elem = meta("elem");
  q.elem = elem == "e5m2" ? ElemCodec::kE5M2 : ElemCodec::kE4M3;
  long long r = -1, c = -1;
  if (std::sscanf(meta("shape").c_str(), "%lld,%lld", &r, &c) != 2 || r < 0 || c < 0)
    fail(name, fmt::format("bad shape metadata '{}'", meta("shape")));
  q.rows = r;
  q.cols = c;
  if (source) {
    auto d = dtype_from_name(meta("dtype"));
    if (!d) fail(name, fmt::format("unknown source dtype '{}'", meta("dtype")));
    *source = *d;
  }
  auto it = file.metadata.find(meta_key(name, "scale_layout"));
  q.scale_layout = (it != file.metadata.end() && it->second == "swizzled") ? ScaleLayout::kSwizzled : ScaleLayout::kCompact;
  if (const Tensor* g = file.find(name + ".group_offsets")) {
    if (g->dtype() != DType::kI64 || g->dim() != 1) fail(name, "group_offsets must be a 1-D I64 tensor");
    q.group_offsets = bytes_as<int64_t>(*g);
    int64_t prev = 0;
    if (q.group_offsets.size() < 2 || q.group_offsets.front() != 0 || q.group_offsets.back() != q.rows)
      fail(name, "group_offsets must start at 0 and end at the row count");
    for (int64_t o : q.group_offsets) {
      if (o < prev) fail(name, "group_offsets decrease");
      prev = o;
    }
  }
  auto outer_n = [&]() -> int64_t {
    if (q.scaling == Scaling::kPerRow) return q.rows;
    if (q.scaling == Scaling::kPerGroup) {
      if (q.group_offsets.empty()) fail(name, "per_group scaling without group_offsets");
      return int64_t(q.group_offsets.size()) - 1;
    }
    return 1;
  };
  switch (q.format) {
    case Format::kNvfp4: {
      if (q.cols % 16 != 0) fail(name, "nvfp4 shape needs cols % 16 == 0");
      q.scale_rows = q.rows;
      q.scale_cols = q.cols / 16;
      q.data = bytes_as<uint8_t>(part(file, name, ".qdata", DType::kU8, {q.rows, q.cols / 2}));
      q.block_scale = bytes_as<uint8_t>(part(file, name, ".block_scale", DType::kF8E4M3, scale_shape(q)));
      const int64_t n = outer_n();
      q.amax = bytes_as<float>(part(file, name, ".amax", DType::kF32, outer_shape(q, size_t(n))));
      break;
    }
    case Format::kMxfp8: {
      if (q.cols % 32 != 0 && file.find(name + ".qdata")) fail(name, "mxfp8 shape needs cols % 32 == 0");
      const DType ed = elem_dtype(q);
      q.has_rowwise = file.find(name + ".qdata") != nullptr;
      if (q.has_rowwise) {
        q.scale_rows = q.rows;
        q.scale_cols = q.cols / 32;
        q.data = bytes_as<uint8_t>(part(file, name, ".qdata", ed, {q.rows, q.cols}));
        q.block_scale = bytes_as<uint8_t>(part(file, name, ".block_scale", DType::kF8E8M0, scale_shape(q)));
      }
      if (file.find(name + ".qdata_colwise")) {
        if (q.rows % 32 != 0) fail(name, "mxfp8 columnwise needs rows % 32 == 0");
        q.data_colwise = bytes_as<uint8_t>(part(file, name, ".qdata_colwise", ed, {q.rows, q.cols}));
        q.block_scale_colwise =
            bytes_as<uint8_t>(part(file, name, ".block_scale_colwise", DType::kF8E8M0, {q.rows / 32, q.cols}));
      }
      if (!q.has_rowwise && q.data_colwise.empty()) fail(name, "neither .qdata nor .qdata_colwise is present");
      break;
    }
    case Format::kFp8: {
      q.data = bytes_as<uint8_t>(part(file, name, ".qdata", elem_dtype(q), {q.rows, q.cols}));
      if (q.scaling == Scaling::kBlock1x128) {
        q.scale_inv_rows = q.rows;
        q.scale_inv_cols = (q.cols + 127) / 128;
      } else if (q.scaling == Scaling::kBlock128x128) {
        q.scale_inv_rows = (q.rows + 127) / 128;
        q.scale_inv_cols = (q.cols + 127) / 128;
      } else {
        q.scale_inv_rows = outer_n();
        q.scale_inv_cols = 1;
      }
      q.scale_inv = bytes_as<float>(part(file, name, ".scale_inv", DType::kF32, outer_shape(q, size_t(q.scale_inv_rows))));
      break;
    }
    case Format::kCount: break;
  }
  return q;
}

}  // namespace lockstep
