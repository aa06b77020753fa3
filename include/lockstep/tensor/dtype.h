// Element types of lockstep tensors, one row each in one table (name as safetensors spells it,
// size in bytes). Adding a dtype means adding an enumerator and a row; the static_assert catches
// a forgotten row.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace lockstep {

enum class DType : uint8_t {
  kBool,
  kU8,
  kI8,
  kU16,
  kI16,
  kF16,
  kBF16,
  kU32,
  kI32,
  kF32,
  kU64,
  kI64,
  kF64,
  kF8E4M3,
  kF8E5M2,
  kF8E8M0,
  kCount,
};

struct DTypeInfo {
  DType dtype;
  std::string_view name;  // safetensors spelling
  size_t size;            // bytes per element
  bool is_float;
};

inline constexpr std::array<DTypeInfo, size_t(DType::kCount)> kDTypes{{
    {DType::kBool, "BOOL", 1, false},
    {DType::kU8, "U8", 1, false},
    {DType::kI8, "I8", 1, false},
    {DType::kU16, "U16", 2, false},
    {DType::kI16, "I16", 2, false},
    {DType::kF16, "F16", 2, true},
    {DType::kBF16, "BF16", 2, true},
    {DType::kU32, "U32", 4, false},
    {DType::kI32, "I32", 4, false},
    {DType::kF32, "F32", 4, true},
    {DType::kU64, "U64", 8, false},
    {DType::kI64, "I64", 8, false},
    {DType::kF64, "F64", 8, true},
    {DType::kF8E4M3, "F8_E4M3", 1, true},
    {DType::kF8E5M2, "F8_E5M2", 1, true},
    {DType::kF8E8M0, "F8_E8M0", 1, true},
}};

constexpr bool dtype_table_in_order() {
  for (size_t i = 0; i < kDTypes.size(); ++i)
    if (size_t(kDTypes[i].dtype) != i) return false;
  return true;
}
static_assert(dtype_table_in_order(), "kDTypes rows must follow the DType enumerators");

constexpr const DTypeInfo& dtype_info(DType d) { return kDTypes[size_t(d)]; }
constexpr size_t dtype_size(DType d) { return dtype_info(d).size; }
constexpr std::string_view dtype_name(DType d) { return dtype_info(d).name; }

constexpr std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& row : kDTypes)
    if (row.name == name) return row.dtype;
  return std::nullopt;
}

}  // namespace lockstep
