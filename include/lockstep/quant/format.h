// The registry of quantized formats and scaling modes: one row per format, one row per scaling.
// Every op that depends on the format dispatches on these enums in one switch; the static_asserts
// make a forgotten row a compile error.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#include "lockstep/numerics/codecs.h"

namespace lockstep {

// The one format enum of lockstep, shared by quant, gemm and recipes. kBf16 and kF32 are not
// quantized: a GEMM operand of format kBf16 is a dense tensor rounded to bf16, kF32 a dense tensor
// used at its own precision (tests and float64 gradient checks). The first four enumerators keep
// the order bf16, fp8, mxfp8, nvfp4 (kernel tables index by it).
enum class Format : uint8_t { kBf16, kFp8, kMxfp8, kNvfp4, kF32, kCount };

enum class ScaleKind : uint8_t { kNone, kE4M3, kE8M0, kF32 };

struct FormatInfo {
  Format format;
  std::string_view name;        // CLI, recipe and file metadata spelling
  bool quantized;               // has element codes and scales (nvfp4, mxfp8, fp8)
  int elem_bits;                // bits per element
  int block;                    // elements per block along a row (0: fp32 scale per domain/block)
  ScaleKind block_scale;        // what a block scale is stored as
  num::MiniFloat elem;          // default element codec of a quantized format
  int rank;                     // precision order: lower is less precise (nvfp4 0 .. f32 4)
  std::string_view summary;
};

inline constexpr std::array<FormatInfo, size_t(Format::kCount)> kFormats{{
    {Format::kBf16, "bf16", false, 16, 0, ScaleKind::kNone, num::kE4M3, 3,
     "dense bf16 (RNE), fp32 accumulation"},
    {Format::kFp8, "fp8", true, 8, 0, ScaleKind::kF32, num::kE4M3, 2,
     "E4M3 elements with fp32 scales (per tensor, per row, 1x128 or 128x128 blocks)"},
    {Format::kMxfp8, "mxfp8", true, 8, 32, ScaleKind::kE8M0, num::kE4M3, 1,
     "E4M3 elements, 32-element blocks, E8M0 power-of-two scales"},
    {Format::kNvfp4, "nvfp4", true, 4, 16, ScaleKind::kE4M3, num::kE2M1, 0,
     "E2M1 elements, 16-element blocks, E4M3 block scales, fp32 outer amax"},
    {Format::kF32, "f32", false, 32, 0, ScaleKind::kNone, num::kE4M3, 4,
     "dense, unrounded (the tensor's own precision; tests and gradient checks)"},
}};

// How the elements sharing one amax (and so one scale) are chosen.
enum class Scaling : uint8_t {
  kPerTensor,     // one domain: the whole tensor (all tensors, for a joint quantization)
  kPerRow,        // one domain per row (per-token activations, per output row weights)
  kPerGroup,      // one domain per group of rows (one MoE expert); needs group offsets
  kBlock1x32,     // MXFP8: 32 consecutive elements of a row share an E8M0 scale
  kBlock1x128,    // FP8: 128 consecutive elements of a row share an fp32 scale
  kBlock128x128,  // FP8: a 128x128 tile shares an fp32 scale
  kCount,
};

struct ScalingInfo {
  Scaling scaling;
  std::string_view name;
};

inline constexpr std::array<ScalingInfo, size_t(Scaling::kCount)> kScalings{{
    {Scaling::kPerTensor, "per_tensor"},
    {Scaling::kPerRow, "per_row"},
    {Scaling::kPerGroup, "per_group"},
    {Scaling::kBlock1x32, "block_1x32"},
    {Scaling::kBlock1x128, "block_1x128"},
    {Scaling::kBlock128x128, "block_128x128"},
}};

constexpr bool format_tables_in_order() {
  for (size_t i = 0; i < kFormats.size(); ++i)
    if (size_t(kFormats[i].format) != i) return false;
  for (size_t i = 0; i < kScalings.size(); ++i)
    if (size_t(kScalings[i].scaling) != i) return false;
  return true;
}
static_assert(format_tables_in_order(), "registry rows must follow their enumerators");
static_assert(kFormats[size_t(Format::kNvfp4)].block * 4 / 8 == 8, "an NVFP4 block packs to 8 bytes");
static_assert(size_t(Format::kBf16) == 0 && size_t(Format::kNvfp4) == 3, "kernel tables index by Format");

constexpr const FormatInfo& format_info(Format f) { return kFormats[size_t(f)]; }
constexpr std::string_view format_name(Format f) { return format_info(f).name; }
constexpr bool is_quantized(Format f) { return format_info(f).quantized; }
constexpr std::string_view scaling_name(Scaling s) { return kScalings[size_t(s)].name; }

constexpr std::optional<Format> format_from_name(std::string_view n) {
  for (const auto& r : kFormats)
    if (r.name == n) return r.format;
  return std::nullopt;
}
constexpr std::optional<Scaling> scaling_from_name(std::string_view n) {
  for (const auto& r : kScalings)
    if (r.name == n) return r.scaling;
  return std::nullopt;
}

}  // namespace lockstep
