// The safetensors header validator (safetensors_detail.h): the JSON header parsed as SAX events
// into one small DOM per tensor entry, so a header of many tensors parses in linear time, and every
// entry checked against the rules of the format (dtype, shape, offsets covering the data exactly).
// Every error names the file, the tensor where there is one, and the rule broken.
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <unordered_set>

#include "safetensors_detail.h"

namespace lockstep::safetensors_detail {

[[noreturn]] void fail(const std::string& origin, const std::string& problem) {
  throw SafetensorsError(fmt::format("{}: {}", origin, problem));
}
[[noreturn]] void fail_tensor(const std::string& origin, const std::string& name,
                              const std::string& problem) {
  throw SafetensorsError(fmt::format("{}: tensor '{}': {}", origin, name, problem));
}

uint64_t load_u64_le(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | uint64_t(p[i]);
  return v;
}

namespace {

using json = nlohmann::json;

// Reads a non-negative integer that fits int64 from `v` (dims and offsets); `what` names it.
uint64_t json_to_u64(const json& v, const std::string& origin, const std::string& name,
                     const std::string& what) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max()))
      fail_tensor(origin, name, fmt::format("{} {} is too large", what, u));
    return u;
  }
  if (v.is_number_integer())  // signed and not unsigned: negative
    fail_tensor(origin, name, fmt::format("{} {} is negative", what, v.get<int64_t>()));
  fail_tensor(origin, name, fmt::format("{} {} is not an integer", what, v.dump()));
}

// The Hugging Face reader's JSON recursion limit (serde_json's 128); a valid header nests 3 deep.
constexpr int kMaxJsonDepth = 128;

[[noreturn]] void nesting_too_deep(const std::string& origin) {
  fail(origin,
       fmt::format("header is not valid JSON (nested deeper than {} levels)", kMaxJsonDepth));
}

const char* json_type_name(json::value_t t) {
  switch (t) {
    case json::value_t::object:
      return "object";
    case json::value_t::array:
      return "array";
    case json::value_t::string:
      return "string";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::null:
      return "null";
    case json::value_t::binary:
      return "binary";
    default:
      return "number";
  }
}

// SAX events of the header (nlohmann::json::sax_parse), turned into one small DOM per top-level
// entry that is handed to `sink` as soon as it is complete, so the whole header never exists as
// one DOM. Linear in the header: nlohmann's callback parser rescans the enclosing object at every
// nested object's end, which is quadratic in the tensor count (40k tensors took minutes).
// Also records the first duplicate key at any depth (nlohmann keeps only the last value of a
// duplicated key, which would silently drop a tensor) and the kind of a root that is not an
// object; the caller reports those once the text is known to be valid JSON.
class HeaderSax {
 public:
  using Sink = std::function<void(const std::string& key, json&& value)>;
  HeaderSax(const std::string& origin, Sink sink) : origin_(origin), sink_(std::move(sink)) {}

  bool null() { return scalar(json(nullptr)); }
  bool boolean(bool v) { return scalar(json(v)); }
  bool number_integer(json::number_integer_t v) { return scalar(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return scalar(json(v)); }
  bool number_float(json::number_float_t v, const std::string&) { return scalar(json(v)); }
  bool string(std::string& v) { return scalar(json(std::move(v))); }
  bool binary(json::binary_t& v) { return scalar(json(std::move(v))); }
  bool start_object(std::size_t) { return open(json::value_t::object); }
  bool start_array(std::size_t) { return open(json::value_t::array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(std::string& k) {
    if (depth_ == 1) {
      top_key_ = k;
      skip_entry_ = !top_keys_.insert(k).second;
      if (skip_entry_) note_duplicate(k, 1);
    } else if (!skip_entry_ && !stack_.empty()) {
      if (!object_keys_.back().insert(k).second) note_duplicate(k, depth_);
      pending_key_.back() = k;
    }
    return true;
  }
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& e) {
    fail(origin_, fmt::format("header is not valid JSON ({})", e.what()));
  }

  json::value_t root_type() const { return root_type_; }
  const std::string& duplicate() const { return duplicate_; }
  size_t duplicate_depth() const { return duplicate_depth_; }

 private:
  void note_duplicate(const std::string& k, size_t depth) {
    if (duplicate_.empty()) {
      duplicate_ = k;
      duplicate_depth_ = depth;
    }
  }
  // Where a new value goes: nullptr when it is a whole top-level entry (or outside the root
  // object, or in a skipped duplicate entry: not built).
  json* place(json&& v) {
    json* parent = stack_.back();
    if (parent->is_array()) {
      parent->push_back(std::move(v));
      return &parent->back();
    }
    json& slot = (*parent)[pending_key_.back()];
    slot = std::move(v);
    return &slot;
  }
  bool building() const { return root_type_ == json::value_t::object && !skip_entry_; }
  bool scalar(json&& v) {
    if (depth_ == 0) {
      root_type_ = v.type();
      return true;
    }
    if (!building()) return true;
    if (stack_.empty())
      sink_(top_key_, std::move(v));
    else
      place(std::move(v));
    return true;
  }
  bool open(json::value_t type) {
    if (depth_ >= kMaxJsonDepth) nesting_too_deep(origin_);
    if (depth_ == 0) root_type_ = type;
    ++depth_;
    if (depth_ == 1 || !building()) return true;
    json* node = nullptr;
    if (stack_.empty()) {
      entry_ = json(type);
      node = &entry_;
    } else {
      node = place(json(type));
    }
    stack_.push_back(node);
    object_keys_.emplace_back();
    pending_key_.emplace_back();
    return true;
  }
  bool close() {
    --depth_;
    if (depth_ == 0) return true;
    if (stack_.empty()) {  // the end of a value that was not built (skipped or not in an object)
      if (depth_ == 1) skip_entry_ = false;
      return true;
    }
    stack_.pop_back();
    object_keys_.pop_back();
    pending_key_.pop_back();
    if (stack_.empty()) sink_(top_key_, std::move(entry_));
    return true;
  }

  const std::string& origin_;
  Sink sink_;
  size_t depth_ = 0;  // open containers, the root included
  json::value_t root_type_ = json::value_t::discarded;
  std::string top_key_;
  bool skip_entry_ = false;  // inside the value of a duplicated top-level key
  std::unordered_set<std::string> top_keys_;
  json entry_;                                      // the top-level entry being built
  std::vector<json*> stack_;                        // its open containers, innermost last
  std::vector<std::set<std::string>> object_keys_;  // keys seen in each open container
  std::vector<std::string> pending_key_;            // the key of the next value in each
  std::string duplicate_;
  size_t duplicate_depth_ = 0;
};

TensorInfo parse_entry(const std::string& name, const json& entry, uint64_t data_bytes,
                       const std::string& origin) {
  if (!entry.is_object())
    fail_tensor(origin, name, fmt::format("entry is a JSON {}, not an object", entry.type_name()));
  TensorInfo info;
  info.name = name;

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end()) fail_tensor(origin, name, "missing field 'dtype'");
  if (!dtype_it->is_string()) fail_tensor(origin, name, "field 'dtype' is not a string");
  auto dtype = dtype_from_name(dtype_it->get_ref<const std::string&>());
  if (!dtype)
    fail_tensor(origin, name,
                fmt::format("unknown dtype '{}'", dtype_it->get_ref<const std::string&>()));
  info.dtype = *dtype;

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end()) fail_tensor(origin, name, "missing field 'shape'");
  if (!shape_it->is_array()) fail_tensor(origin, name, "field 'shape' is not an array");
  // numel * element size in bytes, checked for overflow at every step.
  uint64_t nbytes = dtype_size(info.dtype);
  bool overflow = false;
  for (const json& d : *shape_it) {
    uint64_t dim = json_to_u64(d, origin, name, "dimension");
    info.shape.push_back(int64_t(dim));
    if (dim != 0 && nbytes > std::numeric_limits<uint64_t>::max() / dim) overflow = true;
    nbytes = overflow ? 0 : nbytes * dim;
  }
  // A zero dimension makes the tensor empty whatever the other dimensions are, but a shape whose
  // nonzero dimensions overflow is still refused: no reader could allocate it.
  if (overflow || nbytes > uint64_t(std::numeric_limits<int64_t>::max()))
    fail_tensor(origin, name,
                fmt::format("shape {} x {} bytes overflows", shape_string(info.shape),
                            dtype_size(info.dtype)));

  auto off_it = entry.find("data_offsets");
  if (off_it == entry.end()) fail_tensor(origin, name, "missing field 'data_offsets'");
  if (!off_it->is_array() || off_it->size() != 2)
    fail_tensor(origin, name, fmt::format("data_offsets {} is not [begin, end]", off_it->dump()));
  info.begin = json_to_u64((*off_it)[0], origin, name, "data_offsets begin");
  info.end = json_to_u64((*off_it)[1], origin, name, "data_offsets end");
  if (info.begin > info.end)
    fail_tensor(origin, name,
                fmt::format("data_offsets [{}, {}] has begin > end", info.begin, info.end));
  if (info.end > data_bytes)
    fail_tensor(origin, name,
                fmt::format("data_offsets end {} is beyond the data buffer ({} bytes)", info.end,
                            data_bytes));
  if (info.end - info.begin != nbytes)
    fail_tensor(origin, name,
                fmt::format("size mismatch: data_offsets [{}, {}] hold {} bytes but {} {} needs {}",
                            info.begin, info.end, info.end - info.begin, shape_string(info.shape),
                            dtype_name(info.dtype), nbytes));
  return info;
}

}  // namespace

SafetensorsHeader parse_header(std::span<const std::byte> prefix_and_json, uint64_t file_size,
                               const std::string& origin) {
  if (file_size < 8)
    fail(origin, fmt::format("file is {} bytes, shorter than the 8-byte header length", file_size));
  SafetensorsHeader out;
  out.header_bytes = load_u64_le(prefix_and_json.data());
  if (out.header_bytes > kMaxHeaderBytes)
    fail(origin, fmt::format("header length {} is larger than the {} byte limit", out.header_bytes,
                             kMaxHeaderBytes));
  if (out.header_bytes > file_size - 8)
    fail(origin, fmt::format("header length {} is larger than the file ({} bytes after the length)",
                             out.header_bytes, file_size - 8));
  out.data_bytes = file_size - 8 - out.header_bytes;
  std::string_view text(reinterpret_cast<const char*>(prefix_and_json.data() + 8),
                        out.header_bytes);
  // The JSON library ends its input at a NUL byte, so "{...}\0junk" would parse; JSON has no
  // place for a raw NUL (strings escape it), and the Hugging Face reader refuses it.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    fail(origin, fmt::format("header is not valid JSON (a NUL byte at header offset {})", nul));

  // Entries are checked as they are parsed; the first error (in name order, as a reader that
  // sorts the names would meet it) is reported once the whole text is known to be valid JSON.
  std::optional<std::pair<std::string, std::string>> entry_error;  // (key, message)
  auto sink = [&](const std::string& key, json&& value) {
    if (entry_error && key >= entry_error->first) return;
    try {
      if (key == kMetadataKey) {
        if (!value.is_object())
          fail(origin, fmt::format("__metadata__ is a JSON {}, not an object", value.type_name()));
        for (auto& [mk, mv] : value.items()) {
          if (!mv.is_string())
            fail(origin, fmt::format("__metadata__ value of '{}' is a JSON {}, not a string", mk,
                                     mv.type_name()));
          out.metadata.emplace(mk, mv.get<std::string>());
        }
        return;
      }
      if (key.empty())
        fail(origin,
             "a tensor has an empty name (\"\" in the header); tensor names must be non-empty");
      out.tensors.push_back(parse_entry(key, value, out.data_bytes, origin));
    } catch (const SafetensorsError& e) {
      entry_error.emplace(key, e.what());
    }
  };
  HeaderSax sax(origin, sink);
  json::sax_parse(text.begin(), text.end(), &sax);
  if (sax.root_type() != json::value_t::object)
    fail(origin,
         fmt::format("header is a JSON {}, not an object", json_type_name(sax.root_type())));
  if (!sax.duplicate().empty()) {
    if (sax.duplicate_depth() == 1)
      fail(origin, fmt::format("duplicate tensor name '{}' in header", sax.duplicate()));
    fail(origin, fmt::format("duplicate key '{}' inside a header entry", sax.duplicate()));
  }
  if (entry_error) throw SafetensorsError(entry_error->second);

  // File order is data order. As the Hugging Face reader does, the entries sorted by
  // (begin, end) must tile the data buffer exactly: each starts where the previous one ends
  // (an empty tensor too), the first at 0, the last at the end of the buffer. So no byte is
  // shared, skipped or left over.
  // Empty tensors that share an offset are ordered by name, so the order never depends on the
  // order of the JSON text.
  std::sort(out.tensors.begin(), out.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
  const TensorInfo* prev = nullptr;
  uint64_t covered = 0;  // bytes [0, covered) belong to the tensors seen so far
  for (const TensorInfo& t : out.tensors) {
    if (t.begin < covered)
      fail_tensor(origin, t.name,
                  fmt::format("data_offsets [{}, {}] overlap tensor '{}' at [{}, {}]", t.begin,
                              t.end, prev->name, prev->begin, prev->end));
    if (t.begin > covered)
      fail_tensor(origin, t.name,
                  fmt::format("data_offsets [{}, {}] leave a gap of {} unindexed bytes after {}; "
                              "tensors must cover the data buffer contiguously",
                              t.begin, t.end, t.begin - covered,
                              prev ? fmt::format("tensor '{}' (ends at {})", prev->name, prev->end)
                                   : std::string("the start of the data buffer")));
    covered = t.end;
    prev = &t;
  }
  if (covered != out.data_bytes)
    fail(origin, fmt::format("{} trailing bytes after {} are not indexed by any tensor (the data "
                             "buffer is {} bytes)",
                             out.data_bytes - covered,
                             prev ? fmt::format("tensor '{}' (ends at {})", prev->name, prev->end)
                                  : std::string("the header (no tensor holds data)"),
                             out.data_bytes));
  return out;
}

}  // namespace lockstep::safetensors_detail
