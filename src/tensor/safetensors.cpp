// safetensors reader and writer: one header validator shared by the in-memory parser, the file
// reader and `lockstep inspect`, and a writer over AtomicFile (file_io.h).
// Every error names the file, the tensor where there is one, and the rule broken.
#include "lockstep/tensor/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <unordered_set>

namespace lockstep {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian bytes; lockstep copies them without swapping");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // 100 MB, as Hugging Face's reader
constexpr const char* kMetadataKey = "__metadata__";

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& origin, const std::string& problem) {
  throw SafetensorsError(fmt::format("{}: {}", origin, problem));
}
[[noreturn]] void fail_tensor(const std::string& origin, const std::string& name,
                              const std::string& problem) {
  throw SafetensorsError(fmt::format("{}: tensor '{}': {}", origin, name, problem));
}

std::string errno_text() { return std::strerror(errno); }

uint64_t load_u64_le(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | uint64_t(p[i]);
  return v;
}

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

// Validates the header given the file's leading bytes (at least the 8-byte prefix and the JSON)
// and the total file size.
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

Tensor make_tensor(const TensorInfo& info, const std::string& origin) {
  try {
    return Tensor(info.dtype, info.shape);
  } catch (const std::exception& e) {
    fail_tensor(origin, info.name, e.what());
  }
}

// RAII for a POSIX file descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

// Reads exactly `n` bytes at `offset` or throws.
void pread_all(int fd, std::byte* dst, uint64_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    size_t chunk = size_t(std::min<uint64_t>(n, 1u << 30));
    ssize_t got = ::pread(fd, dst, chunk, off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail(path, fmt::format("read failed: {}", errno_text()));
    if (got == 0) fail(path, "file shrank while being read");
    dst += got;
    n -= uint64_t(got);
    offset += uint64_t(got);
  }
}

struct OpenedFile {
  Fd fd;
  SafetensorsHeader header;
};

void open_and_read_header(const std::string& path, OpenedFile& f) {
  try {
    f.fd.reset(open_input_file(path));  // a FIFO or device is refused, never waited on
  } catch (const InputPathError& e) {
    throw SafetensorsError(e.what());
  }
  struct stat st {};
  if (::fstat(f.fd.get(), &st) != 0) fail(path, fmt::format("cannot stat: {}", errno_text()));
  uint64_t size = uint64_t(st.st_size);
  std::vector<std::byte> prefix(8);
  if (size < 8)
    fail(path, fmt::format("file is {} bytes, shorter than the 8-byte header length", size));
  pread_all(f.fd.get(), prefix.data(), 8, 0, path);
  uint64_t n = load_u64_le(prefix.data());
  if (n <= kMaxHeaderBytes && n <= size - 8) {  // otherwise parse_header reports it
    prefix.resize(8 + n);
    pread_all(f.fd.get(), prefix.data() + 8, n, 8, path);
  }
  f.header = parse_header(prefix, size, path);
}

// One tensor read (pread) into its own storage.
Tensor read_tensor(const OpenedFile& f, const TensorInfo& info, const std::string& path) {
  Tensor t = make_tensor(info, path);
  pread_all(f.fd.get(), t.bytes().data(), t.nbytes(), 8 + f.header.header_bytes + info.begin, path);
  return t;
}

// Bytes of a tensor of `spec` (dtype size x every dimension), refusing a shape that overflows.
uint64_t spec_bytes(const TensorSpec& spec, const std::string& origin) {
  uint64_t n = dtype_size(spec.dtype);
  for (int64_t d : spec.shape) {
    if (d < 0)
      fail_tensor(origin, spec.name,
                  fmt::format("negative dimension in {}", shape_string(spec.shape)));
    if (d != 0 && n > uint64_t(std::numeric_limits<int64_t>::max()) / uint64_t(d))
      fail_tensor(origin, spec.name, fmt::format("shape {} overflows", shape_string(spec.shape)));
    n *= uint64_t(d);
  }
  return n;
}

// The 8-byte length plus the JSON header padded with spaces to a multiple of 8, for tensors laid
// out contiguously in the given order; `sizes` receives each tensor's byte count.
std::vector<std::byte> build_header(std::span<const TensorSpec> specs,
                                    const std::map<std::string, std::string>& metadata,
                                    const std::string& origin, std::vector<uint64_t>& sizes) {
  // Entries are dumped one by one and joined, keeping the given order in linear time (an
  // ordered_json object looks keys up linearly, which is quadratic for big MoE checkpoints).
  std::string text = "{";
  std::set<std::string_view> names;
  sizes.clear();
  try {
    if (!metadata.empty()) text += fmt::format("\"{}\":{}", kMetadataKey, json(metadata).dump());
    uint64_t offset = 0;
    for (const TensorSpec& spec : specs) {
      if (spec.name == kMetadataKey) fail(origin, "a tensor may not be named __metadata__");
      if (spec.name.empty())
        fail(origin, "a tensor has an empty name; tensor names must be non-empty");
      if (!names.insert(spec.name).second) fail_tensor(origin, spec.name, "duplicate tensor name");
      sizes.push_back(spec_bytes(spec, origin));
      const uint64_t end = offset + sizes.back();
      nlohmann::ordered_json entry = {{"dtype", std::string(dtype_name(spec.dtype))},
                                      {"shape", spec.shape},
                                      {"data_offsets", {offset, end}}};
      if (text.size() > 1) text += ',';
      text += json(spec.name).dump();
      text += ':';
      text += entry.dump();
      offset = end;
    }
  } catch (const json::exception& e) {  // e.g. a name that is not valid UTF-8
    fail(origin, fmt::format("cannot encode header: {}", e.what()));
  }
  text += '}';
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<std::byte> out(8 + text.size());
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = std::byte(uint8_t(n >> (8 * i)));
  std::memcpy(out.data() + 8, text.data(), text.size());
  return out;
}

std::vector<TensorSpec> specs_of(const SafetensorsFile& file) {
  std::vector<TensorSpec> specs;
  specs.reserve(file.tensors.size());
  for (const NamedTensor& nt : file.tensors)
    specs.push_back({nt.name, nt.tensor.dtype(), nt.tensor.shape()});
  return specs;
}

void write_tensors(SafetensorsStreamWriter& w, AtomicFile& out, const SafetensorsFile& file) {
  w.start(out);
  for (const NamedTensor& nt : file.tensors) w.write(nt.name, nt.tensor);
  w.finish();
}

}  // namespace

const Tensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& nt : tensors)
    if (nt.name == name) return &nt.tensor;
  return nullptr;
}
Tensor* SafetensorsFile::find(const std::string& name) {
  for (auto& nt : tensors)
    if (nt.name == name) return &nt.tensor;
  return nullptr;
}

SafetensorsFile parse_safetensors(std::span<const std::byte> bytes, const std::string& origin) {
  SafetensorsHeader header = parse_header(bytes, bytes.size(), origin);
  const std::byte* data = bytes.data() + 8 + header.header_bytes;
  SafetensorsFile out;
  out.metadata = std::move(header.metadata);
  out.tensors.reserve(header.tensors.size());
  for (const TensorInfo& info : header.tensors) {
    Tensor t = make_tensor(info, origin);
    if (t.nbytes()) std::memcpy(t.bytes().data(), data + info.begin, t.nbytes());
    out.tensors.push_back({info.name, std::move(t)});
  }
  return out;
}

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> prefix, uint64_t file_size,
                                           const std::string& origin) {
  if (prefix.size() < std::min<uint64_t>(file_size, 8))
    fail(origin, "the prefix holds fewer than 8 bytes");
  if (file_size >= 8) {
    const uint64_t n = load_u64_le(prefix.data());
    if (n <= kMaxHeaderBytes && n <= file_size - 8 && prefix.size() < 8 + n)
      fail(origin, fmt::format("the prefix holds {} bytes, not the 8 + {} of the header",
                               prefix.size(), n));
  }
  return parse_header(prefix, file_size, origin);
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  OpenedFile f;
  open_and_read_header(path, f);
  return std::move(f.header);
}

SafetensorsFile read_safetensors(const std::string& path) {
  // Reads the header, then each tensor straight into its own storage (no whole-file copy).
  OpenedFile f;
  open_and_read_header(path, f);
  SafetensorsFile out;
  out.metadata = std::move(f.header.metadata);
  out.tensors.reserve(f.header.tensors.size());
  for (const TensorInfo& info : f.header.tensors)
    out.tensors.push_back({info.name, read_tensor(f, info, path)});
  return out;
}

SafetensorsFile map_safetensors(const std::string& path) {
  OpenedFile f;
  open_and_read_header(path, f);
  const uint64_t file_size = 8 + f.header.header_bytes + f.header.data_bytes;
  // One private read-only mapping of the whole file, unmapped when the last tensor viewing it
  // goes. Without it (mmap refused: a file system that cannot map, an address-space limit) every
  // tensor is read into its own storage instead.
  std::shared_ptr<const void> mapping;
  if (f.header.data_bytes > 0) {
    void* p = ::mmap(nullptr, size_t(file_size), PROT_READ, MAP_PRIVATE, f.fd.get(), 0);
    if (p != MAP_FAILED)
      mapping = std::shared_ptr<const void>(
          p, [len = size_t(file_size)](const void* q) { ::munmap(const_cast<void*>(q), len); });
  }
  const auto* data = static_cast<const std::byte*>(mapping.get()) + 8 + f.header.header_bytes;
  SafetensorsFile out;
  out.metadata = std::move(f.header.metadata);
  out.tensors.reserve(f.header.tensors.size());
  for (const TensorInfo& info : f.header.tensors) {
    const std::byte* at = data + info.begin;
    // A view only where the bytes are aligned to the element size (the reader's typed pointers
    // need it; files from the safetensors library always are); otherwise an owned copy.
    if (mapping && reinterpret_cast<uintptr_t>(at) % dtype_size(info.dtype) == 0) {
      auto storage =
          Storage::wrap_host(const_cast<std::byte*>(at), size_t(info.end - info.begin), mapping);
      out.tensors.push_back({info.name, Tensor::wrap(std::move(storage), info.dtype, info.shape)});
    } else {
      out.tensors.push_back({info.name, read_tensor(f, info, path)});
    }
  }
  return out;
}

SafetensorsStreamWriter::SafetensorsStreamWriter(std::vector<TensorSpec> specs,
                                                 const std::map<std::string, std::string>& metadata,
                                                 const std::string& origin)
    : specs_(std::move(specs)), origin_(origin) {
  header_ = build_header(specs_, metadata, origin_, sizes_);
}

void SafetensorsStreamWriter::start(AtomicFile& out) {
  if (out_) throw std::logic_error(fmt::format("{}: the header is already written", origin_));
  out_ = &out;
  out_->write(header_);
}

void SafetensorsStreamWriter::write(std::string_view name, std::span<const std::byte> bytes) {
  if (!out_)
    throw std::logic_error(fmt::format("{}: tensor '{}' written before start()", origin_, name));
  if (next_ >= specs_.size() || specs_[next_].name != name || sizes_[next_] != bytes.size())
    throw std::logic_error(fmt::format(
        "{}: tensor '{}' ({} bytes) does not match the planned tensor {} of the header ({})",
        origin_, name, bytes.size(), next_,
        next_ < specs_.size() ? fmt::format("'{}', {} bytes", specs_[next_].name, sizes_[next_])
                              : std::string("none left")));
  out_->write(bytes);
  ++next_;
}

void SafetensorsStreamWriter::write(std::string_view name, const Tensor& t) {
  if (next_ < specs_.size() && specs_[next_].name == name &&
      (t.dtype() != specs_[next_].dtype || t.shape() != specs_[next_].shape))
    throw std::logic_error(fmt::format("{}: tensor '{}' is {}, the header says {} {}", origin_,
                                       name, t.describe(), shape_string(specs_[next_].shape),
                                       dtype_name(specs_[next_].dtype)));
  write(name, t.bytes());
}

void SafetensorsStreamWriter::finish() const {
  if (next_ != specs_.size())
    throw std::logic_error(
        fmt::format("{}: {} of {} planned tensors written", origin_, next_, specs_.size()));
}

std::vector<std::byte> serialize_safetensors(const SafetensorsFile& file) {
  std::vector<uint64_t> sizes;
  std::vector<std::byte> out =
      build_header(specs_of(file), file.metadata, "serialize_safetensors", sizes);
  size_t total = out.size();
  for (const auto& nt : file.tensors) total += nt.tensor.nbytes();
  out.reserve(total);
  for (const auto& nt : file.tensors)
    out.insert(out.end(), nt.tensor.bytes().begin(), nt.tensor.bytes().end());
  return out;
}

void write_safetensors(AtomicFile& out, const SafetensorsFile& file) {
  SafetensorsStreamWriter w(specs_of(file), file.metadata, out.path());
  write_tensors(w, out, file);
}

void write_safetensors(const std::string& path, const SafetensorsFile& file) {
  // Everything that can be checked is checked before a file is created.
  SafetensorsStreamWriter w(specs_of(file), file.metadata, path);
  AtomicFile out(path);
  write_tensors(w, out, file);
  out.commit();
}

void write_bytes_atomic(const std::string& path, std::span<const std::byte> bytes) {
  AtomicFile out(path);
  out.write(bytes);
  out.commit();
}

}  // namespace lockstep
