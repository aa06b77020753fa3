// `lockstep serve-weights` and `lockstep receive-weights`: a model's policy version sent to a
// sampler process on the same machine through CUDA IPC (model/policy_ipc.h, docs/model.md "Sync"),
// and the receiving end, which verifies the checksum on its GPU and reports what arrived.
#include <fmt/format.h>

#include <chrono>

#include "commands.h"
#include "lockstep/model/policy_ipc.h"
#include "model_cli.h"

namespace lockstep::cli {
namespace {

struct ServeArgs {
  ModelSource source;
  SelectionInputs recipe;
  std::string socket, device = "cuda";
  int64_t version = 1;
  int64_t receivers = 1;
  uint64_t bucket_mib = 64;
  int slots = 2;
  bool json = false;
};

struct ReceiveArgs {
  std::string socket, device = "cuda", recipe;
  int64_t count = 1;
  bool json = false;
};

Device cuda_device_flag(const std::string& flag, const std::string& choice) {
  const Device d = device_flag(choice);
  if (!d.is_cuda())
    throw UsageError(
        fmt::format("{} {}: CUDA IPC needs a CUDA device (cuda or cuda:N)", flag, d.str()));
  return d;
}

Json stats_json(const model::PolicyIpcStats& s) {
  return {{"version", s.version},
          {"checksum", fmt::format("{:016x}", s.checksum)},
          {"header_bytes", s.header_bytes},
          {"payload_bytes", s.payload_bytes},
          {"buckets", s.buckets},
          {"staging_bytes", s.staging_bytes},
          {"seconds", s.seconds},
          {"setup_seconds", s.setup_seconds},
          {"transfer_seconds", s.transfer_seconds},
          {"verify_seconds", s.verify_seconds},
          {"transfer_GBps",
           s.transfer_seconds > 0 ? s.payload_bytes / s.transfer_seconds * 1e-9 : 0.0}};
}

void print_stats(const char* verb, const model::PolicyIpcStats& s) {
  fmt::print(
      "{} version {} (checksum {:016x}): {:.1f} MB in {} bucket(s), {:.1f} MB staging, {:.3f} s "
      "({:.2f} GB/s)\n",
      verb, s.version, s.checksum, s.payload_bytes * 1e-6, s.buckets, s.staging_bytes * 1e-6,
      s.seconds, s.seconds > 0 ? s.payload_bytes / s.seconds * 1e-9 : 0.0);
  if (s.transfer_seconds > 0)
    fmt::print("  setup {:.3f} s, transfer {:.3f} s ({:.2f} GB/s), verify {:.3f} s\n",
               s.setup_seconds, s.transfer_seconds, s.payload_bytes / s.transfer_seconds * 1e-9,
               s.verify_seconds);
}

void run_serve(const ServeArgs& a) {
  const Device dev = cuda_device_flag("--device", a.device);
  if (a.socket.empty()) throw UsageError("--socket PATH is required");
  const Recipe recipe = select_run_recipe(a.recipe).recipe;
  // The socket and staging buffers first: a path in use or a missing GPU is refused before the
  // weights are read.
  model::PolicyIpcOptions opt;
  opt.bucket_bytes = size_t(a.bucket_mib) << 20;
  opt.slots = a.slots;
  model::PolicyIpcSender sender(a.socket, dev, opt);
  model::ModelWeights w = load_model_source(a.source);
  for (auto& [name, t] : w.tensors) t = t.to(dev);
  const model::PolicyVersion p = model::export_policy(w, recipe, a.version);
  if (!a.json)
    fmt::print(stderr, "serving version {} ({}, {:.1f} MB) on {} to {} receiver(s)\n", p.version,
               recipe.name, p.nbytes() * 1e-6, a.socket, a.receivers);
  Json out = Json::array();
  for (int64_t r = 0; r < a.receivers; ++r) {
    const model::PolicyIpcStats st = sender.serve(p);
    if (a.json)
      out.push_back(stats_json(st));
    else
      print_stats("served", st);
  }
  if (a.json) fmt::print("{}\n", out.dump(2));
}

void run_receive(const ReceiveArgs& a) {
  const Device dev = cuda_device_flag("--device", a.device);
  if (a.socket.empty()) throw UsageError("--socket PATH is required");
  model::PolicyIpcReceiver rx(dev, a.recipe);
  Json out = Json::array();
  for (int64_t i = 0; i < a.count; ++i) {
    model::PolicyIpcStats st;
    const model::PolicyVersion p = rx.receive(a.socket, &st);
    Json j = stats_json(st);
    j["recipe"] = p.recipe.name;
    j["device"] = dev.str();
    if (a.json)
      out.push_back(j);
    else
      print_stats(fmt::format("received ({} on {})", p.recipe.name, dev.str()).c_str(), st);
  }
  if (a.json) fmt::print("{}\n", out.dump(2));
}

}  // namespace

void register_serve_weights_commands(CLI::App& app) {
  auto s = std::make_shared<ServeArgs>();
  CLI::App* c = app.add_subcommand(
      "serve-weights",
      "Serve a policy version to sampler processes on this machine through CUDA IPC\n"
      "Example: lockstep serve-weights --preset gpu-moe --recipe nvfp4_per_token --socket "
      "/tmp/ls.sock\n"
      "   then: lockstep receive-weights --socket /tmp/ls.sock --recipe nvfp4_per_token");
  add_model_source_options(*c, s->source, /*allow_preset=*/true);
  add_recipe_options(*c, s->recipe);
  c->add_option("--socket", s->socket, "Unix domain socket path to create (must not exist)")
      ->required();
  add_integer_option<int64_t>(*c, "--version", s->version, 0, int64_t(1) << 62,
                              "the policy version number to stamp (default 1)");
  add_integer_option<int64_t>(*c, "--receivers", s->receivers, 1, 1'000'000,
                              "receivers to serve, one after the other (default 1)");
  add_unsigned_option(*c, "--bucket-mib", s->bucket_mib, uint64_t(1) << 20,
                      "MiB per staging bucket (default 64; extra GPU memory = slots x this)");
  add_integer_option(*c, "--slots", s->slots, 1, 64, "staging buckets in flight (default 2)");
  c->add_option("--device", s->device, "the GPU to convert and stage on (cuda, cuda:N)");
  c->add_flag("--json", s->json, "print JSON");
  c->callback([s] {
    if (s->bucket_mib == 0) throw UsageError("--bucket-mib must be at least 1");
    run_serve(*s);
  });

  auto r = std::make_shared<ReceiveArgs>();
  CLI::App* rc = app.add_subcommand(
      "receive-weights",
      "Receive policy versions from `lockstep serve-weights` onto a GPU and verify them\n"
      "Example: lockstep receive-weights --socket /tmp/ls.sock --recipe nvfp4_per_token --json");
  rc->add_option("--socket", r->socket, "the sender's Unix domain socket")->required();
  rc->add_option("--recipe", r->recipe, "refuse a version of another recipe (default: any)");
  add_integer_option<int64_t>(*rc, "--count", r->count, 1, 1'000'000,
                              "versions to receive, each newer than the last (default 1)");
  rc->add_option("--device", r->device, "the GPU the version lands on (cuda, cuda:N)");
  rc->add_flag("--json", r->json, "print JSON");
  rc->callback([r] { run_receive(*r); });
}

}  // namespace lockstep::cli
