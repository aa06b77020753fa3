// Private to src/tensor: the safetensors header validator (safetensors_header.cpp) and the error
// helpers the reader and the writer share (safetensors.cpp).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "lockstep/tensor/safetensors.h"

namespace lockstep::safetensors_detail {

inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // 100 MB, as Hugging Face's reader
inline constexpr const char* kMetadataKey = "__metadata__";

// SafetensorsError "ORIGIN: PROBLEM" / "ORIGIN: tensor 'NAME': PROBLEM".
[[noreturn]] void fail(const std::string& origin, const std::string& problem);
[[noreturn]] void fail_tensor(const std::string& origin, const std::string& name,
                              const std::string& problem);

uint64_t load_u64_le(const std::byte* p);

// Validates the header given the file's leading bytes (at least the 8-byte prefix and the JSON)
// and the total file size.
SafetensorsHeader parse_header(std::span<const std::byte> prefix_and_json, uint64_t file_size,
                               const std::string& origin);

}  // namespace lockstep::safetensors_detail
