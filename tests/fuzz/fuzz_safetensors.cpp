// libFuzzer target for parse_safetensors: any input either parses or throws SafetensorsError
// (anything else, or a sanitizer report, is a bug), and whatever parses survives
// serialize -> parse unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "lockstep/tensor/safetensors.h"

namespace {

bool same(const lockstep::SafetensorsFile& a, const lockstep::SafetensorsFile& b) {
  if (a.metadata != b.metadata || a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& x = a.tensors[i];
    const auto& y = b.tensors[i];
    if (x.name != y.name || x.tensor.dtype() != y.tensor.dtype() ||
        x.tensor.shape() != y.tensor.shape() || x.tensor.nbytes() != y.tensor.nbytes())
      return false;
    if (x.tensor.nbytes() &&
        std::memcmp(x.tensor.bytes().data(), y.tensor.bytes().data(), x.tensor.nbytes()))
      return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  lockstep::SafetensorsFile parsed;
  try {
    parsed = lockstep::parse_safetensors(bytes, "fuzz-input");
  } catch (const lockstep::SafetensorsError&) {
    return 0;  // a rejected input is fine; any other exception escapes and is reported
  }
  auto again =
      lockstep::parse_safetensors(lockstep::serialize_safetensors(parsed), "fuzz-roundtrip");
  if (!same(parsed, again)) std::abort();
  return 0;
}
