// safetensors read/write, compatible with files written by the Hugging Face `safetensors`
// library. Reads are bounds-checked; writes are atomic (temporary file renamed into place).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/tensor/file_io.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep {

// A malformed, truncated or unreadable safetensors file, or tensors that cannot be written as one
// (duplicate or empty names). The message names the file, the tensor (where there is one) and the
// problem. A write that fails on the way to disk throws FileWriteError (file_io.h) instead.
class SafetensorsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

struct SafetensorsFile {
  std::vector<NamedTensor> tensors;             // in file order (ascending data offset)
  std::map<std::string, std::string> metadata;  // "__metadata__"

  const Tensor* find(const std::string& name) const;
  Tensor* find(const std::string& name);
};

// One header entry without its data: what `lockstep inspect` lists without reading the tensors.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data buffer (after the header), [begin, end)
  uint64_t end = 0;
};

// The validated header of a file: entries in file order (ascending data offset), metadata,
// and the sizes of the two regions.
struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
  uint64_t header_bytes = 0;  // N, the JSON length (excluding the 8-byte prefix)
  uint64_t data_bytes = 0;    // bytes after the header
};

// Read and validate only the header (every rule that reads do, except copying the data).
// Linear time in the header's size (400,000 tensors: bench/RESULTS.md).
SafetensorsHeader read_safetensors_header(const std::string& path);
// The same from a file's first bytes held in memory (at least the 8-byte length and the header
// it gives) and the file's total size; `origin` names it in error messages.
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> prefix, uint64_t file_size,
                                           const std::string& origin);

// Parse a whole file held in memory; `origin` names it in error messages.
SafetensorsFile parse_safetensors(std::span<const std::byte> bytes, const std::string& origin);
SafetensorsFile read_safetensors(const std::string& path);
// The same validated file with every tensor a read-only view of one private memory mapping of it
// (mmap MAP_PRIVATE, PROT_READ): no copy, the bytes stay in the page cache and are unmapped when
// the last tensor viewing them goes. Writing through such a tensor faults. Where the file cannot
// be mapped, or a tensor's bytes are not aligned to its element size, that tensor is read into
// its own storage as read_safetensors does. For short-lived readers (the CLI's file commands):
// another process truncating the file while it is mapped makes reading the lost pages raise
// SIGBUS, so long-lived tensors of files others may rewrite in place use read_safetensors.
SafetensorsFile map_safetensors(const std::string& path);

// Serialize (header padded with spaces to a multiple of 8 bytes, tensors in the given order).
std::vector<std::byte> serialize_safetensors(const SafetensorsFile& file);
// Name, dtype and shape of one tensor of a file to be written, known before its bytes are.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

// Writes a safetensors file tensor by tensor, so that the whole file never sits in memory: the
// header is computed from the specs alone (names, dtypes, shapes), then each tensor's bytes are
// appended in spec order as they are produced. Usage: construct (checks the specs, creates
// nothing), start(out) once the AtomicFile exists, write() each tensor, finish(), out.commit().
class SafetensorsStreamWriter {
 public:
  // SafetensorsError naming `origin` when the specs cannot form a file (empty, duplicate or
  // reserved names, a shape whose byte count overflows).
  SafetensorsStreamWriter(std::vector<TensorSpec> specs,
                          const std::map<std::string, std::string>& metadata,
                          const std::string& origin);
  // Writes the 8-byte length and the header.
  void start(AtomicFile& out);
  // Appends the next tensor's bytes. `name` and the byte count (and for a Tensor its dtype and
  // shape, which must be host-contiguous) must be the next spec's: std::logic_error otherwise,
  // since the caller's plan and its data disagree.
  void write(std::string_view name, std::span<const std::byte> bytes);
  void write(std::string_view name, const Tensor& t);
  // std::logic_error unless every spec was written.
  void finish() const;

  uint64_t header_bytes() const { return header_.size(); }  // the 8-byte length included

 private:
  std::vector<TensorSpec> specs_;
  std::vector<uint64_t> sizes_;  // bytes of each spec
  std::vector<std::byte> header_;
  std::string origin_;
  AtomicFile* out_ = nullptr;
  size_t next_ = 0;
};

// Write atomically: a temporary file beside `path`, flushed, then renamed over it (AtomicFile).
// On any failure the temporary file is removed and `path` is left as it was: SafetensorsError
// when the tensors cannot be written (before anything is created), OutputPathError for a bad
// target, FileWriteError when writing fails.
void write_safetensors(const std::string& path, const SafetensorsFile& file);
// Writes the file into `out` without committing it, so that a command can commit several outputs
// only once all of them are written.
void write_safetensors(AtomicFile& out, const SafetensorsFile& file);
// The same atomic write for any bytes (config.json and index files beside safetensors files);
// failures throw the errors of tensor/file_io.h naming `path`.
void write_bytes_atomic(const std::string& path, std::span<const std::byte> bytes);

}  // namespace lockstep
