// CUDA columnwise copies, host side (CONTRACT.md section 12): which passes run for each format and
// outer domain, the output parts and their metadata, exactly as the CPU reference lays them out
// (quantize_copies_cpu.cpp): transposed copies [cols, rows] ungrouped, per-group pieces
// concatenated 1-D for grouped buffers. Compiles to nothing without LOCKSTEP_HAVE_CUDA.
#if defined(LOCKSTEP_HAVE_CUDA)
#include "lockstep/numerics/block_rules.h"
#include "lockstep/quant/layout.h"
#include "quantize_cuda_plan.h"

namespace lockstep::cuda::plan {
namespace {
using namespace detail;

ColTileParams tile_params(Ctx& c, const Input& x, const QuantConfig& cfg) {
  ColTileParams p;
  p.rows = x.rows, p.cols = x.cols;
  p.bands = c.bands();
  p.offsets = c.d_off();
  p.groups = c.groups();
  p.tile_cols = (x.cols + 127) / 128;
  p.elem_max = elem_max_of(cfg), p.eps = cfg.eps, p.type_max = x.type_max;
  p.pow2 = cfg.pow2, p.e5m2 = cfg.elem == ElemCodec::kE5M2, p.sr = sr_of(cfg);
  return p;
}

FinishParams fp8_finish(const Input& x, const QuantConfig& cfg) {
  FinishParams f;
  f.fp8 = true, f.elem_max = elem_max_of(cfg), f.eps = cfg.eps, f.type_max = x.type_max,
  f.pow2 = cfg.pow2;
  return f;
}

}  // namespace

void alloc_nvfp4_colwise(Ctx& c, int64_t rows, int64_t cols, const QuantConfig& cfg, QData& o) {
  const bool grouped = c.grouped;
  o.data = grouped ? c.u8({rows * cols / 2}) : c.u8({cols, rows / 2});
  o.block_scale =
      grouped ? c.u8({rows * cols / 16}) : alloc_scales(c, cols, rows / 16, cfg.scale_layout);
  o.scale_rows = cols;
  o.scale_cols = grouped ? 0 : rows / 16;
}

void nvfp4_colwise(Ctx& c, const Input& x, const QuantConfig& cfg, QTensor& q,
                   const RowwiseInfo& ri, const uint32_t* joint_keys, bool joint_nonempty) {
  const int64_t rows = x.rows, cols = x.cols;
  const bool swz = !c.grouped && cfg.scale_layout == ScaleLayout::kSwizzled;
  QData& o = q.colwise;
  if (!o.data.defined()) alloc_nvfp4_colwise(c, rows, cols, cfg, o);
  if (cfg.block2d) {  // the transpose of the rowwise codes and 16x16 tile scales (same S_enc)
    o.amax = q.rowwise.amax;
    if (rows * cols == 0 || ri.col2d_written) return;
    Nvfp4TransposeParams p;
    p.rows = rows, p.cols = cols, p.bands = c.bands(), p.offsets = c.d_off();
    p.data = q.rowwise.data.ptr<uint8_t>();
    p.scale = scale_out(q.rowwise.block_scale, cols / 16, cfg.scale_layout);
    p.data_col = o.data.ptr<uint8_t>(), p.scale_col = o.block_scale.ptr<uint8_t>(),
    p.scale_col_swizzled = swz;
    launch_nvfp4_transpose(p, c.nbands(), c.cs);
    return;
  }
  // 1-D: the quantization of each X_g^T; with the Hadamard option the transform runs down the
  // columns (16-row chunks of each group: group offsets are multiples of 16) before everything.
  const Input xc = cfg.hadamard && rows * cols > 0 ? hadamard_cols_into(c, x) : x;
  const float* amax = nullptr;
  int col_dom = 0;
  if (cfg.scaling == Scaling::kPerRow) {  // one A per column of each group
    col_dom = 2;
    o.amax = c.f32({c.groups() * cols});
    FinishParams f;
    f.amax_out = o.amax.ptr<float>();
    amax = column_pass(c, xc, f);
  } else {
    const bool per_group = cfg.scaling == Scaling::kPerGroup;
    col_dom = per_group ? 1 : 0;
    const int64_t ndom = per_group ? c.groups() : 1;
    if (!joint_keys && ri.dom_amax && ri.same_values && !cfg.hadamard) {
      amax = ri.dom_amax;  // the rowwise copy's A: the same domains over the same values
      o.amax = q.rowwise.amax;
    } else {
      o.amax = c.f32({ndom});
      FinishParams f;
      f.tensor_nonempty = joint_keys ? joint_nonempty : rows * cols > 0;
      f.amax_out = o.amax.ptr<float>();
      amax = domain_pass(c, xc, per_group ? kDomGroup : kDomTensor, ndom, 0, f, joint_keys);
    }
  }
  if (rows * cols == 0) return;
  ColTileParams p = tile_params(c, xc, cfg);
  p.data_col = o.data.ptr<uint8_t>();
  p.scale_col = o.block_scale.ptr<uint8_t>(), p.scale_col_swizzled = swz;
  p.col_val = amax, p.col_dom = col_dom;
  launch_col_tiles(xc.ref, ColMode::kNvfp4, p, c.nbands(), c.cs);
}

void nvfp4_both_one_read(Ctx& c, const Input& x, const QuantConfig& cfg, QTensor& q,
                         const uint32_t* joint_keys, bool joint_nonempty) {
  const int64_t rows = x.rows, cols = x.cols;
  const bool per_group = cfg.scaling == Scaling::kPerGroup;
  const int64_t ndom = per_group ? c.groups() : 1;
  QData& r = q.rowwise;
  r.data = c.u8({rows, cols / 2});
  r.block_scale = alloc_scales(c, rows, cols / 16, cfg.scale_layout);
  r.amax = c.f32({ndom});
  r.scale_rows = rows, r.scale_cols = cols / 16;
  FinishParams f;
  f.tensor_nonempty = joint_keys ? joint_nonempty : rows * cols > 0;
  f.amax_out = r.amax.ptr<float>();
  const float* amax = domain_pass(c, x, per_group ? kDomGroup : kDomTensor, ndom, 0, f, joint_keys);
  const bool swz = !c.grouped && cfg.scale_layout == ScaleLayout::kSwizzled;
  QData& o = q.colwise;
  alloc_nvfp4_colwise(c, rows, cols, cfg, o);
  o.amax = r.amax;  // the same domains over the same values
  if (rows * cols == 0) return;
  ColTileParams p = tile_params(c, x, cfg);
  p.data_col = o.data.ptr<uint8_t>();
  p.scale_col = o.block_scale.ptr<uint8_t>(), p.scale_col_swizzled = swz;
  p.col_val = amax, p.col_dom = per_group ? 1 : 0;
  p.data_row = r.data.ptr<uint8_t>(),
  p.scale_row = scale_out(r.block_scale, cols / 16, cfg.scale_layout);
  launch_col_tiles(x.ref, ColMode::kNvfp4, p, c.nbands(), c.cs);
}

void fp8_with_colwise(Ctx& c, const Input& x, const QuantConfig& cfg, QTensor& q) {
  const int64_t rows = x.rows, cols = x.cols, tile_cols = (cols + 127) / 128;
  const bool grouped = c.grouped;
  QData& r = q.rowwise;
  QData& o = q.colwise;
  o.data = grouped ? c.u8({rows * cols}) : c.u8({cols, rows});
  o.scale_rows = cols;
  ColTileParams p = tile_params(c, x, cfg);
  p.data_col = o.data.ptr<uint8_t>();
  switch (cfg.scaling) {
    case Scaling::kBlock1x128: {  // both copies from one read
      if (cfg.rowwise) {
        r.data = c.u8({rows, cols});
        r.scale_inv = c.f32({rows, tile_cols});
        r.scale_rows = rows, r.scale_cols = tile_cols;
        p.data = r.data.ptr<uint8_t>(), p.scale_inv = r.scale_inv.ptr<float>();
      }
      const int64_t nblk = c.sbase().back();  // 128-row blocks of all groups
      o.scale_inv = grouped ? c.f32({cols * nblk}) : c.f32({cols, nblk});
      o.scale_cols = grouped ? 0 : nblk;
      p.scale_inv_col = o.scale_inv.ptr<float>(), p.col_sbase = c.d_sbase();
      launch_col_tiles(x.ref, ColMode::kFp8Block, p, c.nbands(), c.cs);
      return;
    }
    case Scaling::kPerRow: {  // the per_row quantization of each X_g^T: one scale per group column
      if (cfg.rowwise) fp8_rowwise(c, x, cfg, r);
      o.scale_inv = grouped ? c.f32({c.groups() * cols}) : c.f32({cols, 1});
      o.scale_cols = grouped ? 0 : 1;
      FinishParams f = fp8_finish(x, cfg);
      f.scale_inv_out = o.scale_inv.ptr<float>();
      p.col_val = column_pass(c, x, f);
      launch_col_tiles(x.ref, ColMode::kFp8Col, p, c.nbands(), c.cs);
      return;
    }
    default:
      break;
  }
  // Per tensor, per group, 128x128: the transpose of the rowwise copy (same blocks, same scales),
  // written from the rowwise codes of the same read.
  const int kind = cfg.scaling == Scaling::kPerGroup       ? kDomGroup
                   : cfg.scaling == Scaling::kBlock128x128 ? kDomTile128
                                                           : kDomTensor;
  const int64_t sr = kind == kDomGroup ? c.groups() : kind == kDomTile128 ? (rows + 127) / 128 : 1;
  const int64_t sc = kind == kDomTile128 ? tile_cols : 1;
  r.scale_inv = c.f32({sr, sc});
  r.scale_rows = sr, r.scale_cols = sc;
  FinishParams f = fp8_finish(x, cfg);
  f.tensor_nonempty = rows * cols > 0;
  f.scale_inv_out = r.scale_inv.ptr<float>();
  p.dom_kind = kind;
  p.dom_val = domain_pass(c, x, kind, sr * sc, tile_cols, f);
  if (cfg.rowwise) {
    r.data = c.u8({rows, cols});
    p.data = r.data.ptr<uint8_t>();
  }
  launch_col_tiles(x.ref, ColMode::kFp8Transpose, p, c.nbands(), c.cs);
  if (kind == kDomTile128) {
    o.scale_inv = grouped ? c.f32({sc * sr}) : c.f32({sc, sr});
    o.scale_rows = grouped ? cols : sc;
    o.scale_cols = grouped ? 0 : sr;
    launch_fp8_tile_scale_transpose(r.scale_inv.ptr<float>(), rows, sc, c.d_off(), c.groups(),
                                    o.scale_inv.ptr<float>(), c.cs);
  } else {
    o.scale_inv = grouped ? r.scale_inv.view({sr * sc}) : r.scale_inv;
    o.scale_rows = grouped ? cols : sr;
    o.scale_cols = grouped ? 0 : sc;
  }
}

}  // namespace lockstep::cuda::plan
#endif  // LOCKSTEP_HAVE_CUDA
