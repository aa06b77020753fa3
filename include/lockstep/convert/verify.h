// `lockstep verify`: a neutral byte-level judge between stacks. Given a bf16 checkpoint and a
// quantized one made by any tool (ModelOpt, llm-compressor / compressed-tensors, a serving
// engine's dump, lockstep export) in one of the formats of convert/hf_format.h, re-quantize each
// quantized module's bf16 weight with the contract and report how many data and scale bytes
// differ and why: scale rounding (another scale arithmetic, and the codes that follow from it),
// tie rounding (a value at or a few ulps from the midpoint of two codes), amax floor (a block the
// contract scales to 0 that the tool floors), nibble order (the two codes of each byte swapped),
// signed zero, other.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/convert/hf_format.h"
#include "lockstep/recipe/json.h"

namespace lockstep::convert {

enum class DiffClass : uint8_t {
  kScaleRounding,
  kTieRounding,
  kAmaxFloor,
  kNibbleOrder,
  kSignedZero,
  kOther,
  kCount,
};
std::string_view diff_class_name(DiffClass c);  // "scale_rounding", "tie_rounding", ...

struct ModuleVerdict {
  std::string module;  // Hugging Face prefix, e.g. "model.layers.0.mlp.experts.3.gate_proj"
  std::string domain;  // the contract's outer domain: "tensor" or "joint: q_proj, k_proj, v_proj"
  int64_t rows = 0, cols = 0;
  int64_t data_bytes = 0, data_bytes_differ = 0;
  int64_t elements_differ = 0;
  int64_t scale_bytes = 0, scale_bytes_differ = 0;  // block scales (fp8-block: scale_inv bytes)
  bool outer_differs = false;                       // NVFP4 global scale (bits)
  float outer_file = 0, outer_contract = 0;
  int64_t outer_ulps = 0;
  // Differing values (elements and block scales) by cause.
  std::array<int64_t, size_t(DiffClass::kCount)> by_class{};
  bool identical() const {
    return data_bytes_differ == 0 && scale_bytes_differ == 0 && !outer_differs;
  }
};

struct VerifyReport {
  HfFormat format = HfFormat::kModeloptNvfp4;
  std::string detected_from;  // "hf_quant_config.json quant_algo NVFP4", ...
  std::vector<ModuleVerdict> modules;
  int64_t identical_modules() const;
  bool identical() const;
};

// Reads both directories tensor by tensor. ExportError (exit 2) when the quantized directory is in
// no format verify reads, or a quantized module has no bf16 weight of its shape in bf16_dir.
VerifyReport verify_checkpoint(const std::string& bf16_dir, const std::string& quant_dir);

Json verify_json(const VerifyReport& r);

}  // namespace lockstep::convert
