// `lockstep gemm`: quantize tensor `a` [M, K] and `w` [N, K] with the contract's quantizers, then
// D = A W^T by the quantized-GEMM semantics of docs/gemm.md; writes `d` [M, N] F32.
// Mixed pairings (w4a16, w4a8) through --a-format / --w-format.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "lockstep/backend/device.h"
#include "lockstep/gemm/qgemm.h"
#if defined(LOCKSTEP_HAVE_CUDA)
#include "lockstep/gemm/qgemm_cuda.h"
#endif
#include "lockstep/quant/quantize.h"
#include "lockstep/tensor/safetensors.h"

namespace lockstep::cli {
namespace {

struct GemmArgs {
  std::string a_path, w_path, output, format = "nvfp4", a_format, w_format, scaling, a_scaling, w_scaling,
      device = "cpu";
  bool deterministic = false, pow2 = false, oracle = false, json = false, allow_nonfinite = false,
       dry_run = false;
  std::string run_meta;
};

// The tensor called `name`, or the file's only tensor.
const NamedTensor& pick_tensor(const SafetensorsFile& f, const std::string& path, const std::string& name) {
  for (const NamedTensor& nt : f.tensors)
    if (nt.name == name) return nt;
  if (f.tensors.size() == 1) return f.tensors.front();
  throw UsageError(fmt::format("{}: no tensor named '{}' (and {} tensors, so none is implied)", path, name,
                               f.tensors.size()));
}

struct Side {
  std::vector<float> values;
  MatrixF32 m;
  std::optional<QTensor> q;
  std::string format, scaling;
};

void prepare(Side& s, const GemmArgs& a, const std::string& path, const std::string& name, std::string format,
             std::string scaling) {
  SafetensorsFile f = read_safetensors(path);
  const NamedTensor& nt = pick_tensor(f, path, name);
  s.m = naming_file(path, [&] { return as_matrix_f32(nt.tensor, s.values, name); });
  if (!a.allow_nonfinite) {
    const int64_t bad = count_nonfinite(s.m.values);
    if (bad > 0)
      throw UsageError(fmt::format("{}: tensor '{}' {} has {} non-finite value(s); pass --allow-nonfinite to "
                                   "apply the contract's NaN/Inf rules",
                                   path, nt.name, nt.tensor.describe(), bad));
  }
  s.format = format;
  if (format == "bf16") {
    if (!scaling.empty()) throw UsageError(fmt::format("--scaling '{}' given for the bf16 operand '{}'", scaling, name));
    s.scaling = "none";
    return;
  }
  auto fm = format_from_name(format);
  if (!fm) throw UsageError(fmt::format("unknown format '{}' for '{}' (choose bf16, fp8, mxfp8 or nvfp4)", format, name));
  if (scaling.empty()) scaling = *fm == Format::kMxfp8 ? "block_1x32" : "per_tensor";
  auto sc = scaling_from_name(scaling);
  if (!sc || *sc == Scaling::kPerGroup)
    throw UsageError(fmt::format(
        "unknown scaling '{}' for '{}' (choose per_tensor, per_row, block_1x32, block_1x128 or block_128x128)",
        scaling, name));
  QuantSpec spec;
  spec.format = *fm;
  spec.scaling = *sc;
  spec.pow2 = a.pow2 && *fm == Format::kFp8;
  s.scaling = scaling;
  s.q = naming_file(path, [&] { return quantize(s.m, spec); });
}

GemmOperand operand(const Side& s, const std::string& name) {
  if (s.q) return GemmOperand::quantized(*s.q, name);
  return GemmOperand::bf16(s.m.values, s.m.rows, s.m.cols, name);
}

void run_gemm(const GemmArgs& a) {
  check_output_paths({{"-o", a.output}, {"--run-meta", a.run_meta}});
  if (dry_run(a.dry_run, fmt::format("quantize {} and {} ({}), multiply on {} -> {}", a.a_path, a.w_path, a.format,
                                     a.device, a.output)))
    return;
  if (a.device != "cpu" && a.device != "cuda") throw UsageError(fmt::format("unknown --device '{}' (cpu or cuda)", a.device));
  if (a.device == "cuda" && a.oracle) throw UsageError("--oracle (float64 accumulation) runs on --device cpu only");
  if (a.device == "cuda") require_device(Device::kCuda);
  Side as, ws;
  prepare(as, a, a.a_path, "a", a.a_format.empty() ? a.format : a.a_format,
          a.a_scaling.empty() ? a.scaling : a.a_scaling);
  prepare(ws, a, a.w_path, "w", a.w_format.empty() ? a.format : a.w_format,
          a.w_scaling.empty() ? a.scaling : a.w_scaling);
  if (as.m.cols != ws.m.cols)
    throw UsageError(
        fmt::format("K mismatch: {} holds a [{}, {}] and {} holds w [{}, {}]; D = A W^T needs "
                    "the same number of columns (K) in both",
                    a.a_path, as.m.rows, as.m.cols, a.w_path, ws.m.rows, ws.m.cols));
  const GemmOperand ao = operand(as, "a"), wo = operand(ws, "w");
  // The CPU path is always the deterministic (batch-invariant) one; on cuda --deterministic picks
  // the tiled kernel (its order depends on K only, whatever M).
  GemmResult r;
  std::string path = a.oracle ? "cpu_oracle_f64" : "cpu_deterministic";
  if (a.device == "cuda") {
#if defined(LOCKSTEP_HAVE_CUDA)
    // --deterministic: the wgmma kernel (the tiled one where wgmma does not run: not sm_90, K % 64),
    // whose order depends on K only (batch-invariant for every M); otherwise the fast path
    // (cuda::qgemm_fast_kernel: the decode kernel for M <= 16, also batch-invariant within
    // M <= 16; above that wgmma for nvfp4 / fp8 W and cuBLAS for mxfp8 / bf16 W, not batch-invariant).
    // fp8 block-scaled operands (per-128 k chunk scales) run on the tiled kernel only.
    auto fp8_block = [](const GemmOperand& o) {
      return o.q && o.q->format == Format::kFp8 &&
             (o.q->scaling == Scaling::kBlock1x128 || o.q->scaling == Scaling::kBlock128x128);
    };
    const bool chunked = fp8_block(ao) || fp8_block(wo);
    const cuda::QgemmKernel det =
        cuda::qgemm_wgmma_available(ao.n_cols()) ? cuda::QgemmKernel::kWgmma : cuda::QgemmKernel::kTiled;
    const cuda::QgemmKernel k = chunked           ? cuda::QgemmKernel::kTiled
                                : a.deterministic ? det
                                                  : cuda::qgemm_fast_kernel(wo.format(), 1, ao.n_rows(), ao.n_cols());
    r = cuda::qgemm_cuda(ao, wo, {}, k);
    path = cuda::qgemm_kernel_name(k);
#endif
  } else {
    r = a.oracle ? qgemm_oracle_cpu(ao, wo) : qgemm_cpu(ao, wo);
  }
  SafetensorsFile out;
  out.tensors.push_back({"d", from_f32(r.d, {r.rows, r.cols}, DType::kF32)});
  out.metadata["lockstep.contract"] = "1";
  out.metadata["lockstep.gemm.a"] = fmt::format("{} {}", as.format, as.scaling);
  out.metadata["lockstep.gemm.w"] = fmt::format("{} {}", ws.format, ws.scaling);
  out.metadata["lockstep.gemm.path"] = path;
  const Json meta = provenance("gemm", a.device,
                               Json{{"a", a.a_path}, {"w", a.w_path}, {"output", a.output},
                                    {"a_operand", out.metadata["lockstep.gemm.a"]},
                                    {"w_operand", out.metadata["lockstep.gemm.w"]},
                                    {"path", out.metadata["lockstep.gemm.path"]}},
                               Json{{"accumulation", path == "cuda_cublas"
                                                         ? "cuBLAS bf16 GEMM on the exact inner values, fp32 "
                                                           "accumulation in cuBLAS's order (not batch-invariant)"
                                                     : a.device == "cuda"
                                                         ? "bf16 tensor cores (exact inner values), fp32 accumulators, "
                                                           "order fixed by K (docs/gemm.md CUDA order)"
                                                         : "fp32, ascending k, one RN per product and per add"}},
                               {});
  out.metadata["lockstep.run_meta"] = meta.dump();
  write_outputs(a.output, out, a.run_meta, meta);
  if (a.json) {
    fmt::print("{}\n", nlohmann::json{{"output", a.output},
                                      {"m", r.rows},
                                      {"n", r.cols},
                                      {"k", ao.n_cols()},
                                      {"a", {{"format", as.format}, {"scaling", as.scaling}}},
                                      {"w", {{"format", ws.format}, {"scaling", ws.scaling}}},
                                      {"path", out.metadata["lockstep.gemm.path"]}}
                           .dump(2));
  } else {
    fmt::print("d [{}, {}] = a ({} {}) x w^T ({} {}), K = {} -> {}\n", r.rows, r.cols, as.format, as.scaling,
               ws.format, ws.scaling, ao.n_cols(), a.output);
  }
}

}  // namespace

void register_gemm_command(CLI::App& app) {
  auto a = std::make_shared<GemmArgs>();
  CLI::App* g = app.add_subcommand(
      "gemm",
      "Quantize tensor `a` [M, K] and `w` [N, K] (or each file's only tensor), multiply D = A W^T by the\n"
      "quantized-GEMM semantics of docs/gemm.md (exact inner values, fp32 accumulation in ascending k,\n"
      "outer scales last) and write `d` [M, N] F32.\n"
      "Example: lockstep gemm --a x.safetensors --w w.safetensors -o d.safetensors --format nvfp4 --scaling per_row\n"
      "         lockstep gemm --a x.safetensors --w w.safetensors -o d.safetensors --a-format bf16 --w-format nvfp4");
  g->add_option("--a", a->a_path, "safetensors file holding `a` [M, K]")->required();
  g->add_option("--w", a->w_path, "safetensors file holding `w` [N, K]")->required();
  g->add_option("-o,--output", a->output, "output safetensors file with `d` [M, N] F32 (written atomically)")->required();
  g->add_option("--format", a->format, "bf16, fp8, mxfp8 or nvfp4 for both operands")->capture_default_str();
  g->add_option("--a-format", a->a_format, "override --format for a (e.g. mxfp8 for w4a8, bf16 for w4a16)");
  g->add_option("--w-format", a->w_format, "override --format for w");
  g->add_option("--scaling", a->scaling,
                "per_tensor, per_row (nvfp4, fp8), block_1x32 (mxfp8), block_1x128, block_128x128 (fp8); "
                "default per_tensor (block_1x32 for mxfp8)");
  g->add_option("--a-scaling", a->a_scaling, "override --scaling for a");
  g->add_option("--w-scaling", a->w_scaling, "override --scaling for w");
  g->add_flag("--pow2", a->pow2, "fp8: power-of-two scales");
  g->add_flag("--deterministic", a->deterministic,
              "batch-invariant accumulation order for every M (always the case on the cpu; cuda: the wgmma "
              "kernel instead of the decode kernel or the cuBLAS fast path)");
  g->add_flag("--oracle", a->oracle, "use the float64-accumulation oracle instead of the fp32 path");
  g->add_option("--device", a->device, "cpu or cuda")->capture_default_str();
  g->add_flag("--allow-nonfinite", a->allow_nonfinite, "quantize NaN/Inf inputs by the contract's rules instead of refusing");
  g->add_flag("--json", a->json, "machine-readable summary on stdout");
  g->add_option("--run-meta", a->run_meta, "also write the run's provenance (run_meta.json) to this file");
  g->add_flag("--dry-run", a->dry_run, "print the resolved recipe, environment and command; create nothing");
  g->callback([a] { run_gemm(*a); });
}

}  // namespace lockstep::cli
