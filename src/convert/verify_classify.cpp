// The byte comparison of `lockstep verify` (verify_classify.h). A differing element code is put
// down, in this order, to: its block scale differing (scale rounding: the codes follow the
// scale), its value lying at or within 2^-18 (relative) of the midpoint between the two codes
// (tie rounding: the contract rounds ties to even, another tool may not, or computes the scaled
// value with another multiplication order), two zeros of opposite sign (signed zero), a global
// scale that differs (scale rounding), otherwise other. A block scale differs by amax floor when
// the contract's is 0 (a block of zeros or of values too small for E4M3) and the file's is not.
#include "verify_classify.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "lockstep/numerics/block_rules.h"
#include "lockstep/numerics/codecs.h"
#include "lockstep/quant/given_amax.h"

namespace lockstep::convert {
namespace {

constexpr float kNearTie = 1.0f / 262144.0f;  // 2^-18

void add(ModuleVerdict& v, DiffClass c, int64_t n = 1) { v.by_class[size_t(c)] += n; }

// Whether |value| lies at or within 2^-18 of the midpoint of the magnitudes a and b (adjacent
// codes of one sign).
bool near_midpoint(float value, float a, float b) {
  const float lo = std::min(std::fabs(a), std::fabs(b)), hi = std::max(std::fabs(a), std::fabs(b));
  if (!(hi > lo)) return false;
  const double mid = (double(lo) + double(hi)) / 2.0;
  return std::fabs(std::fabs(double(value)) - mid) <= double(kNearTie) * mid;
}

// Adjacent codes of a sign-magnitude format (same sign, magnitudes one apart).
bool adjacent(uint32_t a, uint32_t b, uint32_t sign_bit) {
  if ((a & sign_bit) != (b & sign_bit)) return false;
  const uint32_t ma = a & (sign_bit - 1), mb = b & (sign_bit - 1);
  return ma + 1 == mb || mb + 1 == ma;
}

// Classifies one differing element code.
DiffClass element_cause(bool scale_differs, bool outer_differs, float scaled, float decoded_file,
                        float decoded_contract, uint32_t code_file, uint32_t code_contract,
                        uint32_t sign_bit) {
  if (scale_differs) return DiffClass::kScaleRounding;
  if (adjacent(code_file, code_contract, sign_bit) &&
      near_midpoint(scaled, decoded_file, decoded_contract))
    return DiffClass::kTieRounding;
  if (decoded_file == 0.0f && decoded_contract == 0.0f) return DiffClass::kSignedZero;
  if (outer_differs) return DiffClass::kScaleRounding;
  return DiffClass::kOther;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<uint8_t> b(c.nbytes());
  std::memcpy(b.data(), c.raw(), b.size());
  return b;
}

void compare_nvfp4(HfFormat f, const std::vector<float>& x, const ModuleFiles& files,
                   ModuleVerdict& v, const Tensor& w) {
  const int64_t n = v.rows, k = v.cols, nb = k / 16;
  QuantConfig cfg;
  cfg.format = Format::kNvfp4;
  cfg.scaling = Scaling::kPerTensor;
  // 16x16 blocks (ModelOpt / lockstep 2-D weight blocks) when every 16-row tile of the file
  // repeats one row of scales.
  const std::vector<uint8_t> fs = bytes_of(files.block_scale);
  bool tiles = n % 16 == 0 && n > 0;
  for (int64_t r = 0; r < n && tiles; ++r)
    tiles =
        std::equal(fs.begin() + r * nb, fs.begin() + (r + 1) * nb, fs.begin() + (r - r % 16) * nb);
  cfg.block2d = tiles;
  if (tiles) v.domain += ", 16x16 blocks";
  const Tensor a =
      Tensor::from_vector<float>(std::vector<float>{files.contract_amax}, {1}, DType::kF32);
  const QTensor q = quantize_with_amax(w, {}, a, cfg, v.module);
  const num::TwoLevelOuter o = num::two_level_outer(files.contract_amax, num::kE2M1Max);
  v.outer_file = files.outer;
  v.outer_contract = f == HfFormat::kCompressedTensorsNvfp4 ? o.s_enc : o.s_dec;
  const int64_t ulps =
      int64_t(num::f32_bits(v.outer_file)) - int64_t(num::f32_bits(v.outer_contract));
  v.outer_ulps = ulps < 0 ? -ulps : ulps;
  v.outer_differs = ulps != 0;
  if (v.outer_differs) add(v, DiffClass::kScaleRounding);

  const std::vector<uint8_t> fd = bytes_of(files.data), cd = bytes_of(q.rowwise.data);
  const std::vector<uint8_t> cs = bytes_of(q.rowwise.block_scale);
  v.data_bytes = int64_t(fd.size());
  v.scale_bytes = int64_t(fs.size());
  for (size_t i = 0; i < fs.size(); ++i) {
    if (fs[i] == cs[i]) continue;
    ++v.scale_bytes_differ;
    add(v, cs[i] == 0 ? DiffClass::kAmaxFloor : DiffClass::kScaleRounding);
  }
  bool swapped = fd != cd;
  for (size_t i = 0; i < fd.size() && swapped; ++i)
    swapped = uint8_t((fd[i] >> 4) | (fd[i] << 4)) == cd[i];
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const size_t byte = size_t(r * (k / 2) + c / 2);
      const uint32_t cf = (c % 2 == 0) ? (fd[byte] & 0xF) : (fd[byte] >> 4);
      const uint32_t cc = (c % 2 == 0) ? (cd[byte] & 0xF) : (cd[byte] >> 4);
      if (cf == cc) continue;
      ++v.elements_differ;
      if (swapped) {
        add(v, DiffClass::kNibbleOrder);
        continue;
      }
      const size_t blk = size_t(r * nb + c / 16);
      const float enc = num::two_level_encode_factor(cs[blk], o);
      const float scaled = num::mul_rn(x[size_t(r * k + c)], enc);
      add(v,
          element_cause(fs[blk] != cs[blk], v.outer_differs, scaled, num::decode_e2m1(uint8_t(cf)),
                        num::decode_e2m1(uint8_t(cc)), cf, cc, 0x8));
    }
  for (size_t i = 0; i < fd.size(); ++i) v.data_bytes_differ += fd[i] != cd[i] ? 1 : 0;
}

void compare_mxfp8(const std::vector<float>& x, const ModuleFiles& files, ModuleVerdict& v,
                   const Tensor& w) {
  const int64_t n = v.rows, k = v.cols, nb = k / 32;
  QuantConfig cfg;
  cfg.format = Format::kMxfp8;
  cfg.scaling = Scaling::kBlock1x32;
  const QTensor q = quantize(w, cfg, v.module);
  const std::vector<uint8_t> fd = bytes_of(files.data), cd = bytes_of(q.rowwise.data);
  const std::vector<uint8_t> fs = bytes_of(files.block_scale), cs = bytes_of(q.rowwise.block_scale);
  v.data_bytes = int64_t(fd.size());
  v.scale_bytes = int64_t(fs.size());
  for (size_t i = 0; i < fs.size(); ++i)
    if (fs[i] != cs[i]) {
      ++v.scale_bytes_differ;
      add(v, cs[i] == 0 ? DiffClass::kAmaxFloor : DiffClass::kScaleRounding);
    }
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const size_t i = size_t(r * k + c), blk = size_t(r * nb + c / 32);
      if (fd[i] == cd[i]) continue;
      ++v.elements_differ;
      ++v.data_bytes_differ;
      const float scaled = num::mul_rn(x[i], num::mx_encode_factor(cs[blk]));
      add(v, element_cause(fs[blk] != cs[blk], false, scaled, num::decode_e4m3(fd[i]),
                           num::decode_e4m3(cd[i]), fd[i], cd[i], 0x80));
    }
}

void compare_fp8_block(const std::vector<float>& x, const ModuleFiles& files, ModuleVerdict& v,
                       const Tensor& w) {
  const int64_t n = v.rows, k = v.cols, nbc = (k + 127) / 128;
  const Tensor fi = files.scale_inv.contiguous();
  if (fi.dtype() != DType::kF32 || fi.shape() != std::vector<int64_t>{(n + 127) / 128, nbc})
    throw ExportError(fmt::format("{}.weight_scale_inv is {}; expected F32 [{}, {}]", v.module,
                                  fi.describe(), (n + 127) / 128, nbc));
  // Power-of-two scales when every stored scale_inv is one (the DeepSeek-V3 / pow2 recipe).
  bool pow2 = true;
  for (float s : fi.data<float>()) pow2 = pow2 && (num::f32_bits(s) & 0x007FFFFFu) == 0;
  QuantConfig cfg;
  cfg.format = Format::kFp8;
  cfg.scaling = Scaling::kBlock128x128;
  cfg.pow2 = pow2;
  const QTensor q = quantize(w, cfg, v.module);
  const Tensor ci = q.rowwise.scale_inv.contiguous();
  const std::vector<uint8_t> fd = bytes_of(files.data), cd = bytes_of(q.rowwise.data);
  const std::vector<uint8_t> fsb = bytes_of(fi), csb = bytes_of(ci);
  v.data_bytes = int64_t(fd.size());
  v.scale_bytes = int64_t(fsb.size());
  std::vector<bool> block_differs(size_t(fi.numel()), false);
  for (size_t i = 0; i < fsb.size(); ++i)
    if (fsb[i] != csb[i]) {
      ++v.scale_bytes_differ;
      block_differs[i / 4] = true;
    }
  for (bool b : block_differs) add(v, DiffClass::kScaleRounding, b ? 1 : 0);
  // The contract's scale of each block (not stored: scale_inv = RN(1 / scale) is).
  std::vector<float> block_amax(size_t(fi.numel()), num::amax_empty());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      float& acc = block_amax[size_t((r / 128) * nbc + c / 128)];
      acc = num::amax_fold(acc, x[size_t(r * k + c)]);
    }
  std::vector<float> scale(block_amax.size());
  for (size_t b = 0; b < scale.size(); ++b)
    scale[b] = num::fp8_scale(block_amax[b], 448.0f, 0.0f, source_type_max(w.dtype()), pow2);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const size_t i = size_t(r * k + c), blk = size_t((r / 128) * nbc + c / 128);
      if (fd[i] == cd[i]) continue;
      ++v.elements_differ;
      ++v.data_bytes_differ;
      const float scaled = num::mul_rn(x[i], scale[blk]);
      add(v, element_cause(block_differs[blk], false, scaled, num::decode_e4m3(fd[i]),
                           num::decode_e4m3(cd[i]), fd[i], cd[i], 0x80));
    }
}

}  // namespace

float tensor_amax(const Tensor& w) {
  const std::vector<float> x = to_f32(w);
  if (x.empty()) return 0.0f;
  float acc = num::amax_empty();
  for (float e : x) acc = num::amax_fold(acc, e);
  return acc;
}

void compare_module(HfFormat f, const Tensor& w, const ModuleFiles& files, ModuleVerdict& v) {
  const std::vector<float> x = to_f32(w);
  switch (f) {
    case HfFormat::kModeloptNvfp4:
    case HfFormat::kCompressedTensorsNvfp4:
      compare_nvfp4(f, x, files, v, w);
      break;
    case HfFormat::kMxfp8:
      compare_mxfp8(x, files, v, w);
      break;
    case HfFormat::kFp8Block:
      compare_fp8_block(x, files, v, w);
      break;
    default:
      throw std::logic_error("format");
  }
}

}  // namespace lockstep::convert
