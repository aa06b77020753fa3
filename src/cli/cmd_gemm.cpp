// `lockstep gemm`: quantize tensor `a` [M, K] and `w` [N, K] with the contract's quantizers, then
// D = A W^T by the quantized-GEMM semantics of docs/gemm.md; writes `d` [M, N] F32.
// Mixed pairings (w4a16, w4a8) through --a-format / --w-format.
#include <fmt/format.h>

#include "commands.h"
#include "lockstep/diag/run_meta.h"
#include "lockstep/gemm/oracle.h"
#include "lockstep/gemm/qgemm.h"
#include "lockstep/quant/quantize.h"
#include "lockstep/recipe/json.h"
#include "lockstep/tensor/device.h"
#include "lockstep/tensor/safetensors.h"

namespace lockstep::cli {
namespace {

struct GemmArgs {
  std::string a_path, w_path, output, format = "nvfp4", a_format, w_format, scaling, a_scaling,
                                      w_scaling, device = "cpu";
  bool deterministic = false, pow2 = false, oracle = false, json = false, allow_nonfinite = false,
       dry_run = false;
  std::string run_meta;
};

// The tensor called `name`, or the file's only tensor.
const NamedTensor& pick_tensor(const SafetensorsFile& f, const std::string& path,
                               const std::string& name) {
  for (const NamedTensor& nt : f.tensors)
    if (nt.name == name) return nt;
  if (f.tensors.size() == 1) return f.tensors.front();
  throw UsageError(fmt::format("{}: no tensor named '{}' (and {} tensors, so none is implied)",
                               path, name, f.tensors.size()));
}

struct Side {
  Tensor t;      // the input as read (F32 / BF16 / F16)
  Tensor dense;  // bf16 operands: the input rounded to BF16
  std::optional<QTensor> q;
  std::string format, scaling;
  GemmArg arg() const { return q ? GemmArg(*q) : GemmArg(dense); }
};

void prepare(Side& s, const GemmArgs& a, const std::string& path, const std::string& name,
             std::string format, std::string scaling, Device device) {
  SafetensorsFile f = read_safetensors(path);
  const NamedTensor& nt = pick_tensor(f, path, name);
  if (nt.tensor.dim() != 2)
    throw UsageError(
        fmt::format("{}: tensor '{}' {} is not 2-D", path, nt.name, nt.tensor.describe()));
  const DType dt = nt.tensor.dtype();
  if (dt != DType::kF32 && dt != DType::kBF16 && dt != DType::kF16)
    throw UsageError(fmt::format("{}: tensor '{}' {} is not F32, BF16 or F16", path, nt.name,
                                 nt.tensor.describe()));
  s.t = nt.tensor;
  if (!a.allow_nonfinite) {
    const int64_t bad = count_nonfinite(to_f32(s.t));
    if (bad > 0)
      throw UsageError(
          fmt::format("{}: tensor '{}' {} has {} non-finite value(s); pass --allow-nonfinite to "
                      "apply the contract's NaN/Inf rules",
                      path, nt.name, nt.tensor.describe(), bad));
  }
  s.format = format;
  if (format == "bf16") {
    if (!scaling.empty())
      throw UsageError(
          fmt::format("--scaling '{}' given for the bf16 operand '{}'", scaling, name));
    s.scaling = "none";
    s.dense = cast(dt == DType::kF16 ? cast(s.t, DType::kF32) : s.t, DType::kBF16).to(device);
    return;
  }
  auto fm = format_from_name(format);
  if (!fm || !is_quantized(*fm))
    throw UsageError(fmt::format("unknown format '{}' for '{}' (choose bf16, fp8, mxfp8 or nvfp4)",
                                 format, name));
  if (scaling.empty()) scaling = *fm == Format::kMxfp8 ? "block_1x32" : "per_tensor";
  auto sc = scaling_from_name(scaling);
  if (!sc || *sc == Scaling::kPerGroup)
    throw UsageError(
        fmt::format("unknown scaling '{}' for '{}' (choose per_tensor, per_row, block_1x32, "
                    "block_1x128 or block_128x128)",
                    scaling, name));
  QuantConfig cfg;
  cfg.format = *fm;
  cfg.scaling = *sc;
  cfg.pow2 = a.pow2 && *fm == Format::kFp8;
  s.scaling = scaling;
  // F16 is widened on the host (the CUDA quantizers take F32 and BF16).
  const Tensor x = dt == DType::kF16 ? cast(s.t, DType::kF32) : s.t;
  s.q = naming_file(path, [&] { return quantize(x.to(device), cfg, name); });
}

void run_gemm(const GemmArgs& a) {
  check_output_paths({{"-o", a.output}, {"--run-meta", a.run_meta}});
  check_outputs_not_inputs({{"-o", a.output}, {"--run-meta", a.run_meta}},
                           {{"--a", a.a_path}, {"--w", a.w_path}});
  if (dry_run(a.dry_run, fmt::format("quantize {} and {} ({}), multiply on {} -> {}", a.a_path,
                                     a.w_path, a.format, a.device, a.output)))
    return;
  const auto device = parse_device(a.device);
  if (!device) throw UsageError(fmt::format("unknown --device '{}' (cpu or cuda)", a.device));
  if (device->is_cuda() && a.oracle)
    throw UsageError("--oracle (float64 accumulation) runs on --device cpu only");
  require_device(*device);
  Side as, ws;
  prepare(as, a, a.a_path, "a", a.a_format.empty() ? a.format : a.a_format,
          a.a_scaling.empty() ? a.scaling : a.a_scaling, *device);
  prepare(ws, a, a.w_path, "w", a.w_format.empty() ? a.format : a.w_format,
          a.w_scaling.empty() ? a.scaling : a.w_scaling, *device);
  // --deterministic: the batch-invariant order (the CPU path always is); otherwise the library's
  // fastest kernel for the shape (docs/gemm.md lists which ones are batch-invariant).
  if (as.t.cols() != ws.t.cols())
    throw UsageError(
        fmt::format("K mismatch: {} holds a [{}, {}] and {} holds w [{}, {}]; D = A W^T needs "
                    "the same number of columns (K) in both",
                    a.a_path, as.t.rows(), as.t.cols(), a.w_path, ws.t.rows(), ws.t.cols()));
  GemmConfig cfg;
  cfg.order = a.deterministic ? GemmOrder::kBatchInvariant : GemmOrder::kFast;
  GemmResult r = a.oracle ? qgemm_oracle(as.arg(), ws.arg(), cfg) : qgemm(as.arg(), ws.arg(), cfg);
  const std::string path = a.oracle ? "cpu_oracle_f64" : std::string(r.variant);
  const Tensor d = r.d.to(Device::cpu());
  const int64_t M = d.rows(), N = d.cols(), K = as.t.cols();
  SafetensorsFile out;
  out.tensors.push_back({"d", d});
  out.metadata["lockstep.contract"] = "1";
  out.metadata["lockstep.gemm.a"] = fmt::format("{} {}", as.format, as.scaling);
  out.metadata["lockstep.gemm.w"] = fmt::format("{} {}", ws.format, ws.scaling);
  out.metadata["lockstep.gemm.path"] = path;
  const Json meta = provenance(
      "gemm", a.device,
      Json{{"a", a.a_path},
           {"w", a.w_path},
           {"output", a.output},
           {"a_operand", out.metadata["lockstep.gemm.a"]},
           {"w_operand", out.metadata["lockstep.gemm.w"]},
           {"path", out.metadata["lockstep.gemm.path"]}},
      Json{{"accumulation",
            path == "cuda_cublas" ? "cuBLAS bf16 GEMM on the exact inner values, fp32 "
                                    "accumulation in cuBLAS's order (not batch-invariant)"
            : device->is_cuda()   ? "bf16 tensor cores (exact inner values), fp32 accumulators, "
                                    "order fixed by K (docs/gemm.md CUDA order)"
                                  : "fp32, ascending k, one RN per product and per add"}},
      {});
  out.metadata["lockstep.run_meta"] = meta.dump();
  write_outputs(a.output, out, a.run_meta, meta);
  if (a.json) {
    fmt::print("{}\n", Json{{"output", a.output},
                            {"m", M},
                            {"n", N},
                            {"k", K},
                            {"a", {{"format", as.format}, {"scaling", as.scaling}}},
                            {"w", {{"format", ws.format}, {"scaling", ws.scaling}}},
                            {"path", path}}
                           .dump(2));
  } else {
    fmt::print("d [{}, {}] = a ({} {}) x w^T ({} {}), K = {} -> {}\n", M, N, as.format, as.scaling,
               ws.format, ws.scaling, K, a.output);
  }
}

}  // namespace

void register_gemm_command(CLI::App& app) {
  auto a = std::make_shared<GemmArgs>();
  CLI::App* g = app.add_subcommand("gemm",
                                   "Quantize tensor `a` [M, K] and `w` [N, K] (or each file's only "
                                   "tensor), multiply D = A W^T by the\n"
                                   "quantized-GEMM semantics of docs/gemm.md (exact inner values, "
                                   "fp32 accumulation in ascending k,\n"
                                   "outer scales last) and write `d` [M, N] F32.\n"
                                   "Example: lockstep gemm --a x.safetensors --w w.safetensors -o "
                                   "d.safetensors --format nvfp4 --scaling per_row\n"
                                   "         lockstep gemm --a x.safetensors --w w.safetensors -o "
                                   "d.safetensors --a-format bf16 --w-format nvfp4");
  g->add_option("--a", a->a_path, "safetensors file holding `a` [M, K]")->required();
  g->add_option("--w", a->w_path, "safetensors file holding `w` [N, K]")->required();
  g->add_option("-o,--output", a->output,
                "output safetensors file with `d` [M, N] F32 (written atomically)")
      ->required();
  g->add_option("--format", a->format, "bf16, fp8, mxfp8 or nvfp4 for both operands")
      ->capture_default_str();
  g->add_option("--a-format", a->a_format,
                "override --format for a (e.g. mxfp8 for w4a8, bf16 for w4a16)");
  g->add_option("--w-format", a->w_format, "override --format for w");
  g->add_option(
      "--scaling", a->scaling,
      "per_tensor, per_row (nvfp4, fp8), block_1x32 (mxfp8), block_1x128, block_128x128 (fp8); "
      "default per_tensor (block_1x32 for mxfp8)");
  g->add_option("--a-scaling", a->a_scaling, "override --scaling for a");
  g->add_option("--w-scaling", a->w_scaling, "override --scaling for w");
  g->add_flag("--pow2", a->pow2, "fp8: power-of-two scales");
  g->add_flag(
      "--deterministic", a->deterministic,
      "batch-invariant accumulation order for every M (always the case on the cpu; cuda: the wgmma "
      "kernel instead of the decode kernel or the cuBLAS fast path)");
  g->add_flag("--oracle", a->oracle,
              "use the float64-accumulation oracle instead of the fp32 path");
  g->add_option("--device", a->device, "cpu or cuda")->capture_default_str();
  g->add_flag("--allow-nonfinite", a->allow_nonfinite,
              "quantize NaN/Inf inputs by the contract's rules instead of refusing");
  g->add_flag("--json", a->json, "machine-readable summary on stdout");
  g->add_option("--run-meta", a->run_meta,
                "also write the run's provenance (run_meta.json) to this file");
  g->add_flag("--dry-run", a->dry_run, "print the environment and the command; create nothing");
  g->callback([a] { run_gemm(*a); });
}

}  // namespace lockstep::cli
