// safetensors reader and writer: the in-memory parser, the file reader (and mapper) and
// `lockstep inspect` share one header validator (safetensors_header.cpp); a writer over AtomicFile
// (file_io.h).
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
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "safetensors_detail.h"

namespace lockstep {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian bytes; lockstep copies them without swapping");

namespace {

using namespace safetensors_detail;
using json = nlohmann::json;

std::string errno_text() { return std::strerror(errno); }

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
