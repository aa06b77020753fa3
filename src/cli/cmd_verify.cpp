// `lockstep verify BF16_DIR QUANT_DIR`: re-quantize a bf16 checkpoint's weights with the contract
// and report, per quantized module of a checkpoint made by any tool, how many data and scale bytes
// differ and why (convert/verify.h).
#include <fmt/format.h>

#include <cstdlib>

#include "commands.h"
#include "lockstep/convert/verify.h"

namespace lockstep::cli {
namespace {

struct VerifyArgs {
  std::string bf16_dir, quant_dir;
  bool json = false, strict = false, all = false;
};

std::string verify_classes_text(const convert::ModuleVerdict& m) {
  std::string s;
  for (size_t c = 0; c < m.by_class.size(); ++c)
    if (m.by_class[c] > 0)
      s += fmt::format("{}{} {}", s.empty() ? "" : ", ",
                       convert::diff_class_name(convert::DiffClass(c)), m.by_class[c]);
  return s;
}

void run_verify(const VerifyArgs& a) {
  const convert::VerifyReport r = convert::verify_checkpoint(a.bf16_dir, a.quant_dir);
  if (a.json) {
    fmt::print("{}\n", convert::verify_json(r).dump());
  } else {
    fmt::print("{}: {} ({}), {} quantized modules, {} identical to the contract\n", a.quant_dir,
               convert::hf_format_name(r.format), r.detected_from, r.modules.size(),
               r.identical_modules());
    for (const convert::ModuleVerdict& m : r.modules) {
      if (m.identical() && !a.all) continue;
      std::string outer;
      if (!m.domain.empty())
        outer = fmt::format("; global scale {} (file {:.9g}, contract {:.9g}, {} ulp), domain {}",
                            m.outer_differs ? "differs" : "equal", m.outer_file, m.outer_contract,
                            m.outer_ulps, m.domain);
      fmt::print("  {} [{}, {}]: data {}/{} bytes differ ({} elements), scales {}/{} bytes{}{}{}\n",
                 m.module, m.rows, m.cols, m.data_bytes_differ, m.data_bytes, m.elements_differ,
                 m.scale_bytes_differ, m.scale_bytes, outer, m.identical() ? "" : ": ",
                 verify_classes_text(m));
    }
  }
  if (a.strict && !r.identical()) {
    std::fflush(stdout);
    std::exit(kExitFailure);
  }
}

}  // namespace

void register_verify_command(CLI::App& app) {
  auto a = std::make_shared<VerifyArgs>();
  CLI::App* c = app.add_subcommand(
      "verify",
      "Re-quantize a bf16 checkpoint with the contract and compare, byte by byte, with a "
      "quantized checkpoint made by any tool (modelopt-nvfp4, compressed-tensors-nvfp4, mxfp8, "
      "fp8-block)\n"
      "Example: lockstep verify BF16_DIR QUANT_DIR --json");
  c->add_option("BF16_DIR", a->bf16_dir, "the bf16 checkpoint the quantized one was made from")
      ->required();
  c->add_option("QUANT_DIR", a->quant_dir, "the quantized checkpoint")->required();
  c->add_flag("--json", a->json, "print the report as JSON");
  c->add_flag("--all", a->all, "list identical modules too");
  c->add_flag("--strict", a->strict, "exit 1 when any byte differs");
  c->callback([a] { run_verify(*a); });
}

}  // namespace lockstep::cli
