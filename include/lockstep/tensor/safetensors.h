// safetensors read/write, compatible with files written by the Hugging Face `safetensors`
// library. Reads are bounds-checked; writes are atomic (temporary file renamed into place).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "lockstep/tensor/tensor.h"

namespace lockstep {

// A malformed, truncated or unreadable safetensors file, or a failed write. The message names
// the file, the tensor (where there is one) and the problem.
class SafetensorsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

struct SafetensorsFile {
  std::vector<NamedTensor> tensors;              // in file order (ascending data offset)
  std::map<std::string, std::string> metadata;   // "__metadata__"

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
SafetensorsHeader read_safetensors_header(const std::string& path);

// Parse a whole file held in memory; `origin` names it in error messages.
SafetensorsFile parse_safetensors(std::span<const std::byte> bytes, const std::string& origin);
SafetensorsFile read_safetensors(const std::string& path);

// Serialize (header padded with spaces to a multiple of 8 bytes, tensors in the given order).
std::vector<std::byte> serialize_safetensors(const SafetensorsFile& file);
// Write atomically: a temporary file beside `path`, flushed, then renamed over it. On any
// failure the temporary file is removed and `path` is left as it was.
void write_safetensors(const std::string& path, const SafetensorsFile& file);
// The same atomic write for any bytes (config.json and index files beside safetensors files);
// failures throw SafetensorsError naming `path`.
void write_bytes_atomic(const std::string& path, std::span<const std::byte> bytes);

}  // namespace lockstep
