// safetensors reader and writer: one header validator shared by the in-memory parser, the file
// reader and `lockstep inspect`, and an atomic writer (mkstemp beside the target, fsync, rename).
// Every error names the file, the tensor where there is one, and the rule broken.
#include "lockstep/tensor/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

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

// Parses the JSON text, reporting the first duplicate key at any depth (nlohmann keeps only the
// last value of a duplicated key, which would silently drop a tensor).
json parse_header_json(std::string_view text, const std::string& origin) {
  std::vector<std::set<std::string>> keys_per_object;
  std::string duplicate;
  size_t duplicate_depth = 0;
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        keys_per_object.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys_per_object.empty()) keys_per_object.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys_per_object.empty() && parsed.is_string() &&
            !keys_per_object.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
          duplicate = parsed.get<std::string>();
          duplicate_depth = keys_per_object.size();
        }
        break;
      default:
        break;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    fail(origin, fmt::format("header is not valid JSON ({})", e.what()));
  }
  if (!header.is_object())
    fail(origin, fmt::format("header is a JSON {}, not an object", header.type_name()));
  if (!duplicate.empty()) {
    if (duplicate_depth == 1)
      fail(origin, fmt::format("duplicate tensor name '{}' in header", duplicate));
    fail(origin, fmt::format("duplicate key '{}' inside a header entry", duplicate));
  }
  return header;
}

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
  json header = parse_header_json(text, origin);

  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object())
        fail(origin, fmt::format("__metadata__ is a JSON {}, not an object", value.type_name()));
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          fail(origin, fmt::format("__metadata__ value of '{}' is a JSON {}, not a string", mk,
                                   mv.type_name()));
        out.metadata.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    out.tensors.push_back(parse_entry(key, value, out.data_bytes, origin));
  }

  // File order is data order. Empty tensors occupy no bytes and cannot overlap anything; every
  // other tensor must start at or after the end of the previous one.
  std::stable_sort(out.tensors.begin(), out.tensors.end(),
                   [](const TensorInfo& a, const TensorInfo& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : out.tensors) {
    if (t.begin == t.end) continue;
    if (prev && t.begin < prev->end)
      fail_tensor(origin, t.name,
                  fmt::format("data_offsets [{}, {}] overlap tensor '{}' at [{}, {}]", t.begin,
                              t.end, prev->name, prev->begin, prev->end));
    prev = &t;
  }
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
  // Closes now and reports close's result (a deferred write error can surface here).
  int close() {
    int rc = fd_ >= 0 ? ::close(fd_) : 0;
    fd_ = -1;
    return rc;
  }
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
  f.fd.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.fd.get() < 0) fail(path, fmt::format("cannot open: {}", errno_text()));
  struct stat st {};
  if (::fstat(f.fd.get(), &st) != 0) fail(path, fmt::format("cannot stat: {}", errno_text()));
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
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

void write_all(int fd, std::span<const std::byte> bytes, const std::string& path) {
  const std::byte* p = bytes.data();
  size_t n = bytes.size();
  while (n > 0) {
    ssize_t put = ::write(fd, p, std::min<size_t>(n, 1u << 30));
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) fail(path, fmt::format("write failed: {}", errno_text()));
    p += put;
    n -= size_t(put);
  }
}

// The 8-byte length plus the JSON header padded with spaces to a multiple of 8, for tensors laid
// out contiguously in the given order.
std::vector<std::byte> build_header(const SafetensorsFile& file, const std::string& origin) {
  // Entries are dumped one by one and joined, keeping the given order in linear time (an
  // ordered_json object looks keys up linearly, which is quadratic for big MoE checkpoints).
  std::string text = "{";
  std::set<std::string_view> names;
  try {
    if (!file.metadata.empty())
      text += fmt::format("\"{}\":{}", kMetadataKey, json(file.metadata).dump());
    uint64_t offset = 0;
    for (const NamedTensor& nt : file.tensors) {
      if (nt.name == kMetadataKey) fail(origin, "a tensor may not be named __metadata__");
      if (!names.insert(nt.name).second) fail_tensor(origin, nt.name, "duplicate tensor name");
      uint64_t end = offset + nt.tensor.nbytes();
      nlohmann::ordered_json entry = {{"dtype", std::string(dtype_name(nt.tensor.dtype()))},
                                      {"shape", nt.tensor.shape()},
                                      {"data_offsets", {offset, end}}};
      if (text.size() > 1) text += ',';
      text += json(nt.name).dump();
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

SafetensorsHeader read_safetensors_header(const std::string& path) {
  OpenedFile f;
  open_and_read_header(path, f);
  return std::move(f.header);
}

SafetensorsFile read_safetensors(const std::string& path) {
  // Reads the header, then each tensor straight into its own storage (no whole-file copy).
  OpenedFile f;
  open_and_read_header(path, f);
  const uint64_t data_start = 8 + f.header.header_bytes;
  SafetensorsFile out;
  out.metadata = std::move(f.header.metadata);
  out.tensors.reserve(f.header.tensors.size());
  for (const TensorInfo& info : f.header.tensors) {
    Tensor t = make_tensor(info, path);
    pread_all(f.fd.get(), t.bytes().data(), t.nbytes(), data_start + info.begin, path);
    out.tensors.push_back({info.name, std::move(t)});
  }
  return out;
}

std::vector<std::byte> serialize_safetensors(const SafetensorsFile& file) {
  std::vector<std::byte> out = build_header(file, "serialize_safetensors");
  size_t total = out.size();
  for (const auto& nt : file.tensors) total += nt.tensor.nbytes();
  out.reserve(total);
  for (const auto& nt : file.tensors)
    out.insert(out.end(), nt.tensor.bytes().begin(), nt.tensor.bytes().end());
  return out;
}

namespace {

// Writes the concatenation of `parts` to `path` atomically: a temporary file beside `path`
// (mkstemp), written, fsynced, renamed into place, then the directory fsynced.
void write_parts_atomic(const std::string& path,
                        std::span<const std::span<const std::byte>> parts) {
  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  std::string tmpl = (dir / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  std::vector<char> tmp_name(tmpl.begin(), tmpl.end());
  tmp_name.push_back('\0');

  // Removes the temporary file unless it was renamed into place.
  struct TempFile {
    Fd fd;
    std::string name;
    bool committed = false;
    ~TempFile() {
      fd.reset();
      if (!name.empty() && !committed) ::unlink(name.c_str());
    }
  } tmp;
  tmp.fd.reset(::mkstemp(tmp_name.data()));
  if (tmp.fd.get() < 0)
    fail(path,
         fmt::format("cannot create a temporary file in '{}': {}", dir.string(), errno_text()));
  tmp.name = tmp_name.data();

  // mkstemp creates 0600; give the file the target's mode if it exists, else rw-r--r--.
  struct stat st {};
  mode_t mode = ::stat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0644;
  if (::fchmod(tmp.fd.get(), mode) != 0)
    fail(path, fmt::format("cannot set mode: {}", errno_text()));

  for (const auto& part : parts) write_all(tmp.fd.get(), part, path);
  if (::fsync(tmp.fd.get()) != 0) fail(path, fmt::format("fsync failed: {}", errno_text()));
  if (tmp.fd.close() != 0) fail(path, fmt::format("close failed: {}", errno_text()));
  if (::rename(tmp.name.c_str(), path.c_str()) != 0)
    fail(path, fmt::format("cannot rename the temporary file into place: {}", errno_text()));
  tmp.committed = true;
  // Make the rename itself durable; a failure here leaves a complete file, so it is not an error.
  Fd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.get() >= 0) ::fsync(dir_fd.get());
}

}  // namespace

void write_safetensors(const std::string& path, const SafetensorsFile& file) {
  // Everything that can be checked is checked before a file is created.
  std::vector<std::byte> header = build_header(file, path);
  std::vector<std::span<const std::byte>> parts{header};
  for (const auto& nt : file.tensors) parts.push_back(nt.tensor.bytes());
  write_parts_atomic(path, parts);
}

void write_bytes_atomic(const std::string& path, std::span<const std::byte> bytes) {
  const std::span<const std::byte> parts[1] = {bytes};
  write_parts_atomic(path, parts);
}

}  // namespace lockstep
