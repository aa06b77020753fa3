// The registry of quantized formats: one row per format (what it allows: scalings with their GEMM
// K multiple, element codecs, options), one row per scaling and per element codec, and QuantSpec,
// one choice from it. The quantizer, the recipe checks, the nn padding and the GEMM operand checks
// all read these rows; the static_asserts make a forgotten row a compile error.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "lockstep/numerics/codecs.h"

namespace lockstep {

// The one format enum of lockstep, shared by quant, gemm and recipes. kBf16 and kF32 are not
// quantized: a GEMM operand of format kBf16 is a dense tensor rounded to bf16, kF32 a dense tensor
// used at its own precision (tests and float64 gradient checks). The first four enumerators keep
// the order bf16, fp8, mxfp8, nvfp4 (kernel tables index by it).
enum class Format : uint8_t { kBf16, kFp8, kMxfp8, kNvfp4, kF32, kCount };

enum class ScaleKind : uint8_t { kNone, kE4M3, kE8M0, kF32 };

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

// The element codec of FP8 and MXFP8 (NVFP4 elements are always E2M1).
enum class ElemCodec : uint8_t { kE4M3, kE5M2, kCount };

// Options a quantized format may take besides its scaling and element codec (FormatInfo::options).
enum QuantOption : uint8_t {
  kOptBlock2d = 1u << 0,     // 16x16 blocks (NVFP4 weights)
  kOptHadamard = 1u << 1,    // random Hadamard transform along the reduction dimension
  kOptPow2 = 1u << 2,        // power-of-two scales
  kOptEps = 1u << 3,         // an amax floor
  kOptStochastic = 1u << 4,  // stochastic rounding of elements (CONTRACT.md section 5)
};

inline constexpr size_t kScalingCount = size_t(Scaling::kCount);

struct FormatInfo {
  Format format;
  std::string_view name;  // CLI, recipe and file metadata spelling
  bool quantized;         // has element codes and scales (nvfp4, mxfp8, fp8)
  int elem_bits;          // bits per element
  int block;              // elements per block along a row, never partial (0: no fixed block)
  ScaleKind block_scale;  // what a block scale is stored as
  num::MiniFloat elem;    // element codec when the format fixes it, else the default choice
  // Per Scaling (enumerator order): 0 when the format does not take that scaling, else the
  // multiple the reduction dimension K of a GEMM reading the operand must have. The first
  // nonzero entry is the format's default scaling. A dense format takes per_tensor only, which
  // stands for "no scaling".
  std::array<int16_t, kScalingCount> k_multiple;
  uint8_t codecs;   // ElemCodec choices (bit per enumerator); 0: the element codec is fixed
  uint8_t options;  // QuantOption bits the format takes
  int rank;         // precision order: lower is less precise (nvfp4 0 .. f32 4)
  std::string_view summary;
};

inline constexpr uint8_t kBothFp8Codecs =
    (1u << size_t(ElemCodec::kE4M3)) | (1u << size_t(ElemCodec::kE5M2));

// k_multiple columns: per_tensor, per_row, per_group, block_1x32, block_1x128, block_128x128.
inline constexpr std::array<FormatInfo, size_t(Format::kCount)> kFormats{{
    {Format::kBf16,
     "bf16",
     false,
     16,
     0,
     ScaleKind::kNone,
     num::kE4M3,
     {1, 0, 0, 0, 0, 0},
     0,
     0,
     3,
     "dense bf16 (RNE), fp32 accumulation"},
    {Format::kFp8,
     "fp8",
     true,
     8,
     0,
     ScaleKind::kF32,
     num::kE4M3,
     {1, 1, 1, 0, 128, 128},
     kBothFp8Codecs,
     kOptPow2 | kOptEps | kOptStochastic,
     2,
     "E4M3 elements with fp32 scales (per tensor, per row, per group, 1x128 or 128x128 blocks)"},
    {Format::kMxfp8,
     "mxfp8",
     true,
     8,
     32,
     ScaleKind::kE8M0,
     num::kE4M3,
     {0, 0, 0, 32, 0, 0},
     kBothFp8Codecs,
     kOptStochastic,
     1,
     "E4M3 elements, 32-element blocks, E8M0 power-of-two scales"},
    {Format::kNvfp4,
     "nvfp4",
     true,
     4,
     16,
     ScaleKind::kE4M3,
     num::kE2M1,
     {16, 16, 16, 0, 0, 0},
     0,
     kOptBlock2d | kOptHadamard | kOptStochastic,
     0,
     "E2M1 elements, 16-element blocks, E4M3 block scales, fp32 outer amax"},
    {Format::kF32,
     "f32",
     false,
     32,
     0,
     ScaleKind::kNone,
     num::kE4M3,
     {1, 0, 0, 0, 0, 0},
     0,
     0,
     4,
     "dense, unrounded (the tensor's own precision; tests and gradient checks)"},
}};

struct ScalingInfo {
  Scaling scaling;
  std::string_view name;
};

inline constexpr std::array<ScalingInfo, kScalingCount> kScalings{{
    {Scaling::kPerTensor, "per_tensor"},
    {Scaling::kPerRow, "per_row"},
    {Scaling::kPerGroup, "per_group"},
    {Scaling::kBlock1x32, "block_1x32"},
    {Scaling::kBlock1x128, "block_1x128"},
    {Scaling::kBlock128x128, "block_128x128"},
}};

struct ElemCodecInfo {
  ElemCodec codec;
  std::string_view name;
  num::MiniFloat minifloat;
};

inline constexpr std::array<ElemCodecInfo, size_t(ElemCodec::kCount)> kElemCodecs{{
    {ElemCodec::kE4M3, "e4m3", num::kE4M3},
    {ElemCodec::kE5M2, "e5m2", num::kE5M2},
}};

constexpr bool format_tables_in_order() {
  for (size_t i = 0; i < kFormats.size(); ++i)
    if (size_t(kFormats[i].format) != i) return false;
  for (size_t i = 0; i < kScalings.size(); ++i)
    if (size_t(kScalings[i].scaling) != i) return false;
  for (size_t i = 0; i < kElemCodecs.size(); ++i)
    if (size_t(kElemCodecs[i].codec) != i) return false;
  return true;
}
// Every format takes at least one scaling, and a block format's K multiple covers its block.
constexpr bool format_rows_consistent() {
  for (const FormatInfo& f : kFormats) {
    bool any = false;
    for (int16_t m : f.k_multiple) {
      any = any || m > 0;
      if (m > 0 && f.block > 0 && m % f.block != 0) return false;
    }
    if (!any || (!f.quantized && (f.codecs != 0 || f.options != 0))) return false;
  }
  return true;
}
static_assert(format_tables_in_order(), "registry rows must follow their enumerators");
static_assert(format_rows_consistent(), "a format row's scalings, K multiples or options disagree");
static_assert(kFormats[size_t(Format::kNvfp4)].block * 4 / 8 == 8,
              "an NVFP4 block packs to 8 bytes");
static_assert(size_t(Format::kBf16) == 0 && size_t(Format::kNvfp4) == 3,
              "kernel tables index by Format");

constexpr const FormatInfo& format_info(Format f) { return kFormats[size_t(f)]; }
constexpr std::string_view format_name(Format f) { return format_info(f).name; }
constexpr bool is_quantized(Format f) { return format_info(f).quantized; }
constexpr std::string_view scaling_name(Scaling s) { return kScalings[size_t(s)].name; }
constexpr std::string_view elem_codec_name(ElemCodec e) { return kElemCodecs[size_t(e)].name; }

// Whether format f takes scaling s (a dense format: per_tensor only, meaning no scaling).
constexpr bool format_takes(Format f, Scaling s) {
  return format_info(f).k_multiple[size_t(s)] > 0;
}
constexpr bool format_takes(Format f, ElemCodec e) {
  const uint8_t codecs = format_info(f).codecs;
  return codecs == 0 ? e == ElemCodec{} : (codecs >> size_t(e)) & 1u;
}
constexpr bool format_takes(Format f, QuantOption o) { return (format_info(f).options & o) != 0; }
// The first scaling the format takes.
constexpr Scaling default_scaling(Format f) {
  for (size_t s = 0; s < kScalingCount; ++s)
    if (format_info(f).k_multiple[s] > 0) return Scaling(s);
  return Scaling::kPerTensor;
}
// The multiple K must have for a GEMM to read an operand of format f and scaling s along K
// (nvfp4 16, mxfp8 32, fp8 1x128 / 128x128 128, others 1); 1 for a scaling f does not take.
constexpr int64_t k_multiple(Format f, Scaling s) {
  const int16_t m = format_info(f).k_multiple[size_t(s)];
  return m > 0 ? m : 1;
}

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
constexpr std::optional<ElemCodec> elem_codec_from_name(std::string_view n) {
  for (const auto& r : kElemCodecs)
    if (r.name == n) return r.codec;
  return std::nullopt;
}
// "per_tensor, per_row, per_group": the scalings f takes, in enumerator order.
std::string scaling_names(Format f);

// One quantization choice: what a recipe names for a GEMM operand and what quantize() applies
// (QuantConfig adds what one call needs: copies, Philox key, scale layout, stream). Fields that do
// not apply to `format` keep their defaults. The API grows by adding fields here.
struct QuantSpec {
  Format format = Format::kBf16;          // kBf16 / kF32: not quantized
  Scaling scaling = Scaling::kPerTensor;  // one the format takes (FormatInfo::k_multiple)
  ElemCodec elem = ElemCodec::kE4M3;      // fp8 / mxfp8 element codec
  bool block2d = false;                   // nvfp4: 16x16 blocks (weights)
  bool pow2 = false;                      // fp8: power-of-two scales
  float eps = 0.0f;                       // fp8: amax floor (finite, >= 0)
  bool stochastic = false;                // stochastic rounding of elements (CONTRACT.md section 5)
  bool hadamard = false;  // nvfp4: random Hadamard transform along the reduction dim
  bool operator==(const QuantSpec&) const = default;
};

// Format f with its defaults: its default scaling, every option off.
constexpr QuantSpec default_spec(Format f) {
  QuantSpec s;
  s.format = f;
  s.scaling = default_scaling(f);
  return s;
}

// Why `s` is not a choice the format table allows, or "" when it is: a scaling, element codec or
// option the format does not take, an option set on a dense format, eps negative or not finite,
// block2d with per_row (a 16x16 tile spans 16 rows). Shape rules are the quantizer's and the
// GEMM's. The message names the field and what the format takes.
std::string quant_spec_violation(const QuantSpec& s);

}  // namespace lockstep
