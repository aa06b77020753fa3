// `lockstep quantize` and `lockstep dequantize`: whole safetensors files through the contract's
// quantizers. Output paths and input shapes are validated before any work; outputs are written
// all or none, each atomically. quantize streams: memory-mapped input, one tensor at a time.
// dequantize undoes the Hadamard transform of tensors quantized with --hadamard.
#include <fmt/format.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <optional>

#include "commands.h"
#include "lockstep/diag/run_meta.h"
#include "lockstep/numerics/hadamard.h"
#include "lockstep/quant/format.h"
#include "lockstep/quant/qtensor_io.h"
#include "lockstep/quant/quantize.h"
#include "lockstep/recipe/json.h"
#include "lockstep/tensor/device.h"
#include "lockstep/tensor/safetensors.h"

namespace lockstep::cli {
namespace {

struct QuantizeArgs {
  std::string input, output, format = "nvfp4", scaling, elem = "e4m3", scale_layout = "compact";
  bool block2d = false, colwise = false, pow2 = false, allow_nonfinite = false, stochastic = false,
       hadamard = false, json = false, dry_run = false;
  std::string device = "cpu", run_meta;
  std::optional<uint64_t> seed;    // Philox seed of --stochastic (unset: 0)
  std::optional<uint64_t> stream;  // a Philox stream id: 32 bits (unset: 0)
  std::optional<double> eps;       // fp8 amax floor; unset means 0
};

// --eps: finite, >= 0, within fp32 range, and for fp8 only (nvfp4 and mxfp8 have no amax floor).
float checked_eps(const QuantizeArgs& a, Format f) {
  if (!a.eps) return 0.0f;
  const double e = *a.eps;
  if (!std::isfinite(e) || e < 0.0 || e > double(FLT_MAX))
    throw UsageError(
        fmt::format("--eps {}: expected a finite amax floor from 0 to {:g}", e, double(FLT_MAX)));
  if (e > 0.0 && float(e) == 0.0f)
    throw UsageError(
        fmt::format("--eps {}: rounds to 0 in fp32; give 0 or a value of at least {:g}", e,
                    double(std::numeric_limits<float>::denorm_min())));
  if (f != Format::kFp8)
    throw UsageError(fmt::format(
        "--eps applies to fp8 (its per-tensor/per-row/block amax floor), not {}", format_name(f)));
  return float(e);
}

bool is_quantizable(const Tensor& t) {
  return t.dim() == 2 &&
         (t.dtype() == DType::kF32 || t.dtype() == DType::kBF16 || t.dtype() == DType::kF16);
}

QuantConfig make_spec(const QuantizeArgs& a) {
  QuantConfig s;
  auto f = format_from_name(a.format);
  if (!f)
    throw UsageError(fmt::format("unknown --format '{}' (choose nvfp4, mxfp8 or fp8)", a.format));
  s.format = *f;
  std::string sc = a.scaling;
  if (sc.empty()) sc = s.format == Format::kMxfp8 ? "block_1x32" : "per_tensor";
  auto scaling = scaling_from_name(sc);
  if (!scaling || *scaling == Scaling::kPerGroup)
    throw UsageError(
        fmt::format("unknown --scaling '{}' (choose per_tensor, per_row, block_1x32, block_1x128 "
                    "or block_128x128)",
                    sc));
  s.scaling = *scaling;
  if (a.elem != "e4m3" && a.elem != "e5m2")
    throw UsageError(fmt::format("unknown --elem '{}' (e4m3 or e5m2)", a.elem));
  if (a.elem == "e5m2" && s.format == Format::kNvfp4)
    throw UsageError("--elem e5m2 applies to fp8 and mxfp8, not nvfp4");
  s.elem = a.elem == "e5m2" ? ElemCodec::kE5M2 : ElemCodec::kE4M3;
  s.block2d = a.block2d;
  s.colwise = a.colwise;
  s.pow2 = a.pow2;
  s.eps = checked_eps(a, s.format);
  s.stochastic = a.stochastic;
  if ((a.seed || a.stream) && !a.stochastic)
    throw UsageError(
        fmt::format("{} applies to --stochastic rounding only; add --stochastic or drop it",
                    a.seed ? "--seed" : "--stream"));
  s.seed = a.seed.value_or(0);
  s.rng_stream = uint32_t(a.stream.value_or(0));
  s.hadamard = a.hadamard;
  if (a.scale_layout != "compact" && a.scale_layout != "swizzled")
    throw UsageError(
        fmt::format("unknown --scale-layout '{}' (compact or swizzled)", a.scale_layout));
  s.scale_layout = a.scale_layout == "swizzled" ? ScaleLayout::kSwizzled : ScaleLayout::kCompact;
  if (s.scale_layout == ScaleLayout::kSwizzled && s.format == Format::kFp8)
    throw UsageError("--scale-layout swizzled applies to nvfp4 and mxfp8 block scales");
  return s;
}

Device device_arg(const std::string& name) {
  auto d = parse_device(name);
  if (!d) throw UsageError(fmt::format("unknown --device '{}' (cpu, cuda or cuda:N)", name));
  return *d;
}

// Refuses a file that already holds lockstep quantized tensors (lockstep.NAME.format metadata):
// quantizing it again would treat their parts (NAME.scale_inv, NAME.amax) as weights.
void refuse_quantized_input(const SafetensorsFile& in, const std::string& path) {
  const std::vector<std::string> names = quantized_tensor_names(in);
  if (names.empty()) return;
  const std::string& name = names.front();
  throw UsageError(fmt::format(
      "{}: tensor '{}' is already quantized ({}, metadata 'lockstep.{}.format'){}; quantize takes "
      "high-precision tensors: run `lockstep dequantize` on the file first",
      path, name, in.metadata.at("lockstep." + name + ".format"), name,
      names.size() > 1 ? fmt::format(", as are {} other tensor(s)", names.size() - 1) : ""));
}

// The tensor's non-finite count, refused unless --allow-nonfinite.
void refuse_nonfinite(const QuantizeArgs& a, const NamedTensor& nt, int64_t nonfinite) {
  if (nonfinite > 0 && !a.allow_nonfinite)
    throw QuantError(fmt::format(
        "{}: tensor '{}' {} has {} non-finite value(s) (NaN or Inf); refusing to quantize "
        "(pass --allow-nonfinite to apply the contract's NaN/Inf rules)",
        a.input, nt.name, nt.tensor.describe(), nonfinite));
}

// Streams the file: the input is memory-mapped (tensors are views of the page cache), the
// output header is planned from the shapes alone, then each tensor is quantized (in parallel over
// its rows) and appended before the next one is read, so peak memory is the input's pages plus
// one tensor's output. Nothing is renamed into place unless every tensor was written.
void run_quantize(const QuantizeArgs& a) {
  check_output_paths({{"-o", a.output}, {"--run-meta", a.run_meta}});
  check_outputs_not_inputs({{"-o", a.output}, {"--run-meta", a.run_meta}}, {{"input", a.input}});
  const QuantConfig spec = make_spec(a);
  const Device device = device_arg(a.device);
  if (dry_run(a.dry_run, fmt::format("{} {} of every 2-D float tensor of {} on {} -> {}", a.format,
                                     scaling_name(spec.scaling), a.input, a.device, a.output)))
    return;
  require_device(device);
  const SafetensorsFile in = map_safetensors(a.input);
  refuse_quantized_input(in, a.input);
  // Every shape is validated before any work, so a contract violation leaves no output file.
  std::vector<TensorSpec> specs;
  std::map<std::string, std::string> metadata = in.metadata;
  Json report = Json::array();
  for (const NamedTensor& nt : in.tensors) {
    const Tensor& t = nt.tensor;
    if (!is_quantizable(t)) {
      specs.push_back({nt.name, t.dtype(), t.shape()});  // passed through unchanged
      continue;
    }
    naming_file(a.input, [&] { validate_quant_input(nt.name, t.rows(), t.cols(), {}, spec); });
    plan_qtensor(specs, metadata, nt.name, t.rows(), t.cols(), t.dtype(), spec);
    report.push_back({{"name", nt.name}, {"shape", t.shape()}, {"dtype", dtype_name(t.dtype())}});
  }
  if (report.empty())
    throw UsageError(fmt::format("{}: no 2-D F32, BF16 or F16 tensor to quantize", a.input));
  const Json meta =
      provenance("quantize", a.device,
                 Json{{"input", a.input},
                      {"output", a.output},
                      {"format", a.format},
                      {"scaling", std::string(scaling_name(spec.scaling))},
                      {"block2d", a.block2d},
                      {"colwise", a.colwise},
                      {"pow2", a.pow2},
                      {"eps", spec.eps},
                      {"elem", a.elem},
                      {"stochastic", a.stochastic},
                      {"hadamard", a.hadamard},
                      {"allow_nonfinite", a.allow_nonfinite}},
                 Json{{"block_scale", a.scale_layout},
                      {"fp4_packing", "two codes per byte, even column in the low nibble"}},
                 a.stochastic ? std::map<std::string, uint64_t>{{"stochastic_rounding", spec.seed},
                                                                {"stream", spec.rng_stream}}
                              : std::map<std::string, uint64_t>{});
  metadata["lockstep.run_meta"] = meta.dump();
  SafetensorsStreamWriter writer(std::move(specs), metadata, a.output);
  AtomicFile out(a.output);
  writer.start(out);
  for (const NamedTensor& nt : in.tensors) {
    if (!is_quantizable(nt.tensor)) {
      writer.write(nt.name, nt.tensor);
      continue;
    }
    // The CUDA quantizers read F32 and BF16: F16 is widened exactly on the host for them.
    const Tensor x = device.is_cpu() || nt.tensor.dtype() != DType::kF16
                         ? nt.tensor
                         : cast(nt.tensor, DType::kF32);
    QuantStats stats;
    const QTensor q =
        naming_file(a.input, [&] { return quantize(x.to(device), spec, nt.name, &stats); });
    refuse_nonfinite(a, nt, stats.nonfinite);
    write_qtensor(writer, nt.name, q);
  }
  writer.finish();
  commit_outputs(out, a.run_meta, meta);
  if (a.json) {
    fmt::print("{}\n", Json{{"output", a.output},
                            {"format", a.format},
                            {"scaling", std::string(scaling_name(spec.scaling))},
                            {"quantized", report}}
                           .dump(2));
  } else {
    fmt::print("quantized {} tensor(s) to {} ({}) -> {}\n", report.size(), a.format,
               scaling_name(spec.scaling), a.output);
  }
}

struct DequantizeArgs {
  std::string input, output, dtype = "f32", device = "cpu", run_meta;
  bool dry_run = false;
};

// The output dtype of one tensor: f32, bf16, or (--dtype source) the dtype it was quantized from.
DType output_dtype(const std::string& dtype_arg, DType source, const std::string& input,
                   const std::string& name) {
  if (dtype_arg == "f32") return DType::kF32;
  if (dtype_arg == "bf16") return DType::kBF16;
  if (source != DType::kF32 && source != DType::kBF16 && source != DType::kF16)
    throw SafetensorsError(
        fmt::format("{}: quantized tensor '{}': metadata 'lockstep.{}.dtype' says {}, which "
                    "quantize never writes (F32, BF16 or F16); use --dtype f32 or bf16",
                    input, name, name, dtype_name(source)));
  return source;
}

int64_t count_inf(std::span<const float> v) {
  int64_t n = 0;
  for (float x : v) n += std::isinf(x) ? 1 : 0;
  return n;
}

void run_dequantize(const DequantizeArgs& a) {
  const std::string &input = a.input, &output = a.output, &dtype_arg = a.dtype;
  check_output_paths({{"-o", output}, {"--run-meta", a.run_meta}});
  check_outputs_not_inputs({{"-o", output}, {"--run-meta", a.run_meta}}, {{"input", input}});
  const Device device = device_arg(a.device);
  if (dry_run(a.dry_run, fmt::format("dequantize every quantized tensor of {} on {} -> {} ({})",
                                     input, a.device, output, dtype_arg)))
    return;
  require_device(device);
  SafetensorsFile in = read_safetensors(input);
  const auto names = quantized_tensor_names(in);
  if (names.empty())
    throw UsageError(
        fmt::format("{}: no lockstep quantized tensors (no lockstep.*.format metadata)", input));
  SafetensorsFile out;
  for (const auto& [k, v] : in.metadata)
    if (!k.starts_with("lockstep.")) out.metadata[k] = v;
  // Values that dequantize to +-Inf: finite inputs too close to FLT_MAX for the format (MXFP8:
  // |x| >= 248 x 2^120, docs/contract-notes.md), values beyond the range of a narrower output
  // dtype, or Inf inputs quantized with --allow-nonfinite.
  std::vector<std::pair<std::string, int64_t>> overflowed;
  int64_t overflowed_total = 0;
  int64_t inverted = 0;  // tensors quantized with --hadamard, transformed back
  for (const std::string& name : names) {
    DType source = DType::kF32;
    QTensor q = naming_file(input, [&] { return read_qtensor(in, name, &source); });
    const DType dt = output_dtype(dtype_arg, source, input, name);
    DequantConfig dc;
    dc.copy = q.has_rowwise() ? Copy::kRowwise : Copy::kColwise;
    std::vector<float> values =
        naming_file(input, [&] { return to_f32(dequantize(q.to(device), dc).to(Device::cpu())); });
    if (q.hadamard) {
      undo_hadamard(values, q.rows, q.cols, dc.copy);
      ++inverted;
    }
    Tensor t = from_f32(values, {q.rows, q.cols}, dt);
    const int64_t inf = dt == DType::kF32 ? count_inf(values) : count_inf(to_f32(t));
    if (inf > 0) {
      overflowed.emplace_back(name, inf);
      overflowed_total += inf;
      fmt::print(stderr,
                 "lockstep: warning: {}: tensor '{}' ({}): {} of {} value(s) dequantize to +-Inf "
                 "in {} (a finite input too close to FLT_MAX overflows the format or the output "
                 "dtype, or the input held Inf; see docs/contract-notes.md)\n",
                 input, name, format_name(q.format), inf, q.rows * q.cols, dtype_name(dt));
    }
    out.tensors.push_back({name, std::move(t)});
  }
  for (NamedTensor& nt : in.tensors)
    if (!is_qtensor_part(in, nt.name)) out.tensors.push_back(std::move(nt));
  const Json meta = provenance("dequantize", a.device,
                               Json{{"input", input},
                                    {"output", output},
                                    {"dtype", dtype_arg},
                                    {"overflowed_to_inf", overflowed_total},
                                    {"hadamard_inverted", inverted}},
                               Json::object(), {});
  out.metadata["lockstep.run_meta"] = meta.dump();
  write_outputs(output, out, a.run_meta, meta);
  std::string note;
  if (overflowed_total > 0) {
    note = fmt::format("; {} value(s) overflowed to +-Inf (", overflowed_total);
    for (size_t i = 0; i < overflowed.size(); ++i)
      note += fmt::format("{}'{}' {}", i ? ", " : "", overflowed[i].first, overflowed[i].second);
    note += ")";
  }
  if (inverted > 0)
    note += fmt::format(
        "; {} tensor(s) quantized with --hadamard transformed back (exact inverse of the "
        "transform; its bf16 rounding and the quantization error remain)",
        inverted);
  fmt::print("dequantized {} tensor(s) -> {}{}\n", names.size(), output, note);
}

}  // namespace

void register_quantize_commands(CLI::App& app) {
  auto a = std::make_shared<QuantizeArgs>();
  CLI::App* q = app.add_subcommand(
      "quantize",
      "Quantize every 2-D F32/BF16/F16 tensor of a safetensors file per the lockstep contract.\n"
      "Other tensors are copied unchanged. Writes NAME.qdata, NAME.block_scale, NAME.amax "
      "(nvfp4),\n"
      "NAME.qdata, NAME.block_scale (mxfp8), NAME.qdata, NAME.scale_inv (fp8), and with --colwise "
      "the\n"
      "columnwise copy NAME.*_colwise (CONTRACT section 12).\n"
      "Example: lockstep quantize model.safetensors -o model.nvfp4.safetensors --format nvfp4 "
      "--scaling per_row");
  q->add_option("input", a->input, "input safetensors file")->required();
  q->add_option("-o,--output", a->output, "output safetensors file (written atomically)")
      ->required();
  q->add_option("--format", a->format, "nvfp4, mxfp8 or fp8")->capture_default_str();
  q->add_option(
      "--scaling", a->scaling,
      "per_tensor, per_row (nvfp4, fp8), block_1x32 (mxfp8), block_1x128, block_128x128 (fp8); "
      "default per_tensor (block_1x32 for mxfp8)");
  q->add_flag("--block2d", a->block2d, "nvfp4: 16x16 blocks (weights); needs rows % 16 == 0");
  q->add_flag(
      "--colwise", a->colwise,
      "also write the columnwise copy for the backward GEMMs: nvfp4 / fp8 the quantized transpose "
      "(rows % 16 == 0 for nvfp4), mxfp8 blocks of 32 down columns (rows % 32 == 0)");
  q->add_flag("--pow2", a->pow2, "fp8: round scales down to powers of two");
  q->add_option("--eps", a->eps, "fp8: amax floor (finite, >= 0; default 0)");
  q->add_option("--elem", a->elem, "fp8/mxfp8 element type: e4m3 or e5m2")->capture_default_str();
  q->add_flag("--stochastic", a->stochastic,
              "stochastic rounding of elements (Philox, CONTRACT section 5)");
  add_integer_option<uint64_t>(*q, "--seed", a->seed, 0, UINT64_MAX,
                               "Philox seed for --stochastic (0 to 2^64 - 1; default 0)");
  add_integer_option<uint64_t>(*q, "--stream", a->stream, 0, UINT32_MAX,
                               "Philox stream id for --stochastic (0 to 2^32 - 1; default 0)");
  q->add_flag("--hadamard", a->hadamard,
              "random Hadamard transform along rows before quantizing (section 6)");
  q->add_option("--scale-layout", a->scale_layout, "compact or swizzled (128x4 tiles) block scales")
      ->capture_default_str();
  q->add_flag("--allow-nonfinite", a->allow_nonfinite,
              "quantize NaN/Inf inputs by the contract's rules instead of refusing");
  q->add_flag("--json", a->json, "machine-readable summary on stdout");
  q->add_option("--device", a->device, "cpu or cuda (same bytes either way)")
      ->capture_default_str();
  q->add_option("--run-meta", a->run_meta,
                "also write the run's provenance (run_meta.json) to this file");
  q->add_flag("--dry-run", a->dry_run, "print the environment and the command; create nothing");
  q->callback([a] { run_quantize(*a); });

  auto da = std::make_shared<DequantizeArgs>();
  CLI::App* d = app.add_subcommand(
      "dequantize",
      "Reconstruct the tensors of a file written by `lockstep quantize`; other tensors are "
      "copied.\n"
      "Example: lockstep dequantize model.nvfp4.safetensors -o model.dq.safetensors --dtype f32");
  d->add_option("input", da->input, "quantized safetensors file")->required();
  d->add_option("-o,--output", da->output, "output safetensors file (written atomically)")
      ->required();
  d->add_option("--device", da->device, "cpu or cuda (same bytes either way)")
      ->capture_default_str();
  d->add_option("--run-meta", da->run_meta,
                "also write the run's provenance (run_meta.json) to this file");
  d->add_flag("--dry-run", da->dry_run, "print the environment and the command; create nothing");
  d->add_option(
       "--dtype", da->dtype,
       "f32 (exact), bf16, or source (the dtype the tensor was quantized from: F32, BF16 or F16)")
      ->check(CLI::IsMember({"f32", "bf16", "source"}))
      ->capture_default_str();
  d->callback([da] { run_dequantize(*da); });
}

}  // namespace lockstep::cli
