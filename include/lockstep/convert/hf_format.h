// The Hugging Face checkpoint formats lockstep writes for serving stacks (vLLM, SGLang,
// transformers), one row each: the name the CLI takes, the weight format a recipe must quantize
// with, and what the files hold. docs/export.md describes each format's tensors and config.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "lockstep/quant/format.h"

namespace lockstep::convert {

// A request the format or the input cannot serve: an unknown format, a recipe the format cannot
// express (the message names the layer and why), a model without the tensors the format needs,
// an output folder that exists. The CLI exits 2.
class ExportError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

enum class HfFormat : uint8_t {
  kModeloptNvfp4,           // NVIDIA ModelOpt unified checkpoint, quant_algo NVFP4 / W4A16_NVFP4
  kCompressedTensorsNvfp4,  // compressed-tensors "nvfp4-pack-quantized" (llm-compressor)
  kMxfp8,                   // NVIDIA ModelOpt unified checkpoint, quant_algo MXFP8
  kFp8Block,                // DeepSeek-V3 style fp8 with 128x128 weight_scale_inv blocks
  kCount,
};

struct HfFormatInfo {
  HfFormat format;
  std::string_view name;  // CLI spelling
  Format weight_format;   // what the recipe's quantized weights must be
  int block_cols;         // elements per block along K (fp8-block: 128x128 tiles)
  std::string_view summary;
};

inline constexpr std::array<HfFormatInfo, size_t(HfFormat::kCount)> kHfFormats{{
    {HfFormat::kModeloptNvfp4, "modelopt-nvfp4", Format::kNvfp4, 16,
     "weight U8 [N, K/2], weight_scale F8_E4M3 [N, K/16], weight_scale_2 F32 (amax / 2688), "
     "hf_quant_config.json"},
    {HfFormat::kCompressedTensorsNvfp4, "compressed-tensors-nvfp4", Format::kNvfp4, 16,
     "weight_packed U8 [N, K/2], weight_scale F8_E4M3 [N, K/16], weight_global_scale F32 "
     "(2688 / amax)"},
    {HfFormat::kMxfp8, "mxfp8", Format::kMxfp8, 32,
     "weight F8_E4M3 [N, K], weight_scale U8 (E8M0) [N, K/32], hf_quant_config.json MXFP8"},
    {HfFormat::kFp8Block, "fp8-block", Format::kFp8, 128,
     "weight F8_E4M3 [N, K], weight_scale_inv F32 [ceil(N/128), ceil(K/128)], quant_method fp8"},
}};

constexpr bool hf_format_table_in_order() {
  for (size_t i = 0; i < kHfFormats.size(); ++i)
    if (size_t(kHfFormats[i].format) != i) return false;
  return true;
}
static_assert(hf_format_table_in_order(), "kHfFormats rows must follow the HfFormat enumerators");

constexpr const HfFormatInfo& hf_format_info(HfFormat f) { return kHfFormats[size_t(f)]; }
constexpr std::string_view hf_format_name(HfFormat f) { return hf_format_info(f).name; }
std::optional<HfFormat> hf_format_from_name(std::string_view name);
// "modelopt-nvfp4, compressed-tensors-nvfp4, mxfp8, fp8-block"
std::string hf_format_names();
// The format named `name`, or ExportError listing the known ones.
HfFormat hf_format_or_throw(std::string_view name);

}  // namespace lockstep::convert
