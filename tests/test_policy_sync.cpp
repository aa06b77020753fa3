// The sync path's CPU pieces: the 64-bit digest behind the policy checksum (known vectors from an
// independent byte-wise implementation, word and tail boundaries, the parallel loop), every field
// the policy checksum covers, the policy header / payload layout and its buckets, and the CUDA
// IPC protocol's framing, handle encoding and refusals (no GPU needed).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

#include "lockstep/model/policy.h"
#include "lockstep/model/policy_ipc.h"
#include "lockstep/model/policy_wire.h"
#include "lockstep/numerics/philox.h"
#include "lockstep/recipe/registry.h"
#include "lockstep/tensor/digest.h"
#include "test_util.h"
#include "tiny_model_util.h"

using namespace lockstep;
using namespace lockstep::model;
using namespace lockstep::test;

namespace {

// The definition of docs/model.md ("The policy checksum") written out byte by byte, without the
// library's header: w_i from bytes 8i.. little-endian (zero past the end), term mix64(w_i + (i + 1)
// K), digest = mix64(sum ^ mix64(n + K)).
uint64_t ref_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
uint64_t ref_digest(const std::vector<uint8_t>& b) {
  const uint64_t K = 0x9E3779B97F4A7C15ull;
  uint64_t sum = 0;
  for (size_t i = 0; i < b.size(); i += 8) {
    uint64_t w = 0;
    for (size_t k = 0; k < 8 && i + k < b.size(); ++k) w |= uint64_t(b[i + k]) << (8 * k);
    sum += ref_mix(w + (i / 8 + 1) * K);
  }
  return ref_mix(sum ^ ref_mix(uint64_t(b.size()) + K));
}

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = uint8_t(num::philox_element_word(seed, 3, i));
  return b;
}

uint64_t dig(const std::vector<uint8_t>& b) { return bytes_digest64(b.data(), b.size()); }

const Recipe& recipe(const char* name) { return builtin_recipe_or_throw(name, "test").recipe; }

}  // namespace

TEST(Digest64, KnownVectors) {
  // Values from a separate Python implementation of the definition.
  auto s = [](const char* t) { return std::vector<uint8_t>(t, t + std::strlen(t)); };
  EXPECT_EQ(dig({}), 0x48218226ff3cd4bfull);
  EXPECT_EQ(dig(s("a")), 0x0810975f36a4b9ebull);
  EXPECT_EQ(dig(s("abcdefgh")), 0x2334e646574188a0ull);
  EXPECT_EQ(dig(s("abcdefghi")), 0x169dc8a0fe9314dbull);
  std::vector<uint8_t> ramp(1000);
  for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = uint8_t(i % 251);
  EXPECT_EQ(dig(ramp), 0xa7fae8e68679f9ceull);
  EXPECT_EQ(dig(std::vector<uint8_t>(8, 0)), 0x9dd5914a6fc553a5ull);
  EXPECT_EQ(dig(std::vector<uint8_t>(9, 0)), 0xc3130818c4c9fdf7ull);
  EXPECT_EQ(bytes_digest64(std::string_view("abcdefgh")), 0x2334e646574188a0ull);
}

TEST(Digest64, WordBoundariesTailsAndTheParallelLoop) {
  // Every length around the 8-byte word and the serial threshold of the OpenMP loop (2^15 words).
  std::vector<size_t> sizes;
  for (size_t n = 0; n <= 33; ++n) sizes.push_back(n);
  for (size_t n : {size_t(4095), size_t(4096), size_t(4097), size_t(8) << 15, (size_t(8) << 15) + 8,
                   (size_t(8) << 15) + 13, size_t(1) << 20})
    sizes.push_back(n);
  for (const size_t n : sizes) {
    const std::vector<uint8_t> b = random_bytes(n, test_seed() + n);
    EXPECT_EQ(dig(b), ref_digest(b)) << "n " << n << ", seed " << test_seed();
  }
  // Trailing zeros, a moved word, one flipped bit anywhere: another digest.
  const std::vector<uint8_t> b = random_bytes(1001, test_seed());
  std::vector<uint8_t> z = b;
  z.push_back(0);
  EXPECT_NE(dig(z), dig(b));
  std::vector<uint8_t> swapped = b;
  std::swap_ranges(swapped.begin(), swapped.begin() + 8, swapped.begin() + 8);
  if (swapped != b) {
    EXPECT_NE(dig(swapped), dig(b));
  }
  std::set<uint64_t> seen{dig(b)};
  for (size_t i : {size_t(0), size_t(7), size_t(8), size_t(500), size_t(1000)}) {
    std::vector<uint8_t> f = b;
    f[i] ^= 0x10;
    EXPECT_TRUE(seen.insert(dig(f)).second) << "byte " << i;
  }
}

TEST(Digest64, TensorDigestsReadViewsInRowMajorOrder) {
  const std::vector<uint8_t> b = random_bytes(64, test_seed());
  const Tensor t = Tensor::from_vector<uint8_t>(b, {8, 8}, DType::kU8);
  EXPECT_EQ(tensor_digest64(t), ref_digest(b));
  // A row slice is hashed as its own bytes; a transpose through its contiguous copy.
  const Tensor rows = t.slice_rows(3, 5);
  EXPECT_EQ(tensor_digest64(rows), ref_digest({b.begin() + 24, b.begin() + 40}));
  std::vector<uint8_t> tr(64);
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 8; ++c) tr[size_t(c * 8 + r)] = b[size_t(r * 8 + c)];
  EXPECT_EQ(tensor_digest64(t.transpose()), ref_digest(tr));
  EXPECT_EQ(tensor_digest64(Tensor(DType::kF32, {0, 4})), ref_digest({}));
  EXPECT_THROW(tensor_digest64(Tensor()), std::invalid_argument);
}

TEST(PolicyChecksum, EveryFieldChangesIt) {
  const ModelConfig c = tiny_config();
  const ModelWeights w = tiny_weights(c, test_seed() + 1);
  const PolicyVersion p = export_policy(w, recipe("nvfp4_per_token"), 3);
  EXPECT_EQ(policy_checksum(p), p.checksum);
  std::set<uint64_t> seen{p.checksum};
  auto differs = [&](PolicyVersion q, const char* what) {
    EXPECT_TRUE(seen.insert(policy_checksum(q)).second) << what;
  };
  PolicyVersion q = p;
  q.version = 4;
  differs(q, "version");
  q = p;
  q.recipe.purpose += " (edited)";
  differs(q, "recipe content");
  q = p;
  q.config.rope_theta *= 2;
  differs(q, "config");
  q = p;
  q.options.fuse_scales = !q.options.fuse_scales;
  differs(q, "fuse_scales");
  q = p;
  {
    Tensor t = q.dense.at("final_norm").clone();
    t.ptr<float>()[0] += 1.0f;
    q.dense.at("final_norm") = t;
  }
  differs(q, "a dense tensor's bytes");
  q = p;
  {
    nn::Operand& o = q.operands.begin()->second;
    ASSERT_TRUE(o.quantized());
    Tensor d = o.q.rowwise.data.clone();
    static_cast<uint8_t*>(d.raw())[d.nbytes() - 1] ^= 1;
    o.q.rowwise.data = d;
  }
  differs(q, "an operand's last byte");
  q = p;
  {
    auto node = q.dense.extract("final_norm");
    node.key() = "final_norm_renamed";
    q.dense.insert(std::move(node));
  }
  differs(q, "a tensor's name");
  q = p;
  q.dense.at("final_norm") = q.dense.at("final_norm").view({2, c.hidden_size / 2});
  differs(q, "a tensor's shape");
  q = p;
  {
    const Tensor& f = q.dense.at("final_norm");
    Tensor i = Tensor::empty(DType::kI32, f.shape());
    std::memcpy(i.raw(), f.raw(), f.nbytes());
    q.dense.at("final_norm") = i;
  }
  differs(q, "a tensor's dtype");
  q = p;
  q.operands.begin()->second.q.colwise.amax = Tensor(DType::kF32, {1});
  differs(q, "a part that was absent");
}

TEST(PolicyWire, LayoutRoundTripsAndBucketsTileThePayload) {
  TinyOptions o;
  o.moe = true;
  const ModelConfig c = tiny_config(o);
  const PolicyVersion p = export_policy(tiny_weights(c, test_seed() + 2), recipe("mxfp8"), 5);
  const PolicyLayout l = policy_layout(p);
  EXPECT_EQ(l.payload.payload_bytes, p.nbytes());
  PolicySkeleton s = policy_from_header(parse_json(l.header.dump()));
  ASSERT_EQ(s.payload.parts.size(), l.payload.parts.size());
  for (const size_t B : {size_t(1), size_t(7), size_t(1000), size_t(1) << 30}) {
    std::vector<int> covered(l.payload.payload_bytes, 0);
    const size_t n = bucket_count(l.payload.payload_bytes, B);
    std::vector<uint8_t> bucket(std::min(B, l.payload.payload_bytes));
    for (size_t b = 0; b < n; ++b) {
      size_t filled = 0;
      for (const BucketCopy& k : bucket_copies(l.payload, b, B)) {
        EXPECT_EQ(k.bucket_offset, filled) << "bucket " << b << " of " << B << " bytes";
        const auto* src = static_cast<const uint8_t*>(l.payload.parts[k.part].raw());
        std::memcpy(bucket.data() + k.bucket_offset, src + k.part_offset, k.nbytes);
        // The receiver's side of the same copy, through the bucket buffer.
        auto* dst = static_cast<uint8_t*>(s.payload.parts[k.part].raw());
        std::memcpy(dst + k.part_offset, bucket.data() + k.bucket_offset, k.nbytes);
        for (size_t i = 0; i < k.nbytes; ++i) ++covered[b * B + k.bucket_offset + i];
        filled += k.nbytes;
      }
      EXPECT_EQ(filled, std::min(B, l.payload.payload_bytes - b * B));
    }
    EXPECT_EQ(std::count(covered.begin(), covered.end(), 1), int64_t(covered.size())) << B;
    EXPECT_EQ(policy_checksum(s.policy), p.checksum) << B;
  }
  EXPECT_THROW(bucket_copies(l.payload, bucket_count(l.payload.payload_bytes, 64), 64),
               std::invalid_argument);
  EXPECT_THROW(bucket_count(10, 0), std::invalid_argument);
}

TEST(PolicyWire, MalformedHeadersAreRefusedNamingTheProblem) {
  const PolicyVersion p =
      export_policy(tiny_weights(tiny_config(), test_seed() + 3), recipe("bf16"), 1);
  const Json h = policy_layout(p).header;
  auto refused = [&](Json bad, const std::string& words) {
    try {
      policy_from_header(bad);
      ADD_FAILURE() << "accepted: " << words;
    } catch (const PolicyError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  Json j = h;
  j["dense"]["final_norm"]["offset"] = j["dense"]["final_norm"]["offset"].get<size_t>() + 1;
  refused(j, "does not follow");
  j = h;
  j["dense"]["final_norm"]["dtype"] = "F33";
  refused(j, "unknown dtype 'F33'");
  j = h;
  j["payload_bytes"] = 1;
  refused(j, "payload bytes");
  j = h;
  j["checksum_version"] = 1;
  refused(j, "checksum definition 1");
  j = h;
  j.erase("config");
  refused(j, "malformed");
}

TEST(PolicyIpc, FramesRoundTripAndBrokenFramesAreRefused) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  const Json m{{"hello", kPolicyIpcProtocol}, {"n", 3}, {"text", std::string(100000, 'x')}};
  std::thread writer([&] { ipc_write_frame(sv[0], m); });
  EXPECT_EQ(ipc_read_frame(sv[1], "a test frame"), m);
  writer.join();
  // A length beyond the limit, text that is not JSON, a connection closed half way / before.
  const uint64_t huge = kPolicyIpcMaxFrame + 1;
  ASSERT_EQ(::write(sv[0], &huge, 8), 8);
  EXPECT_THROW(ipc_read_frame(sv[1], "a huge frame"), PolicyError);
  const char bad[] = "\x03\0\0\0\0\0\0\0{x}";
  ASSERT_EQ(::write(sv[0], bad, 11), 11);
  EXPECT_THROW(ipc_read_frame(sv[1], "a bad frame"), PolicyError);
  const char half[] = "\x09\0\0\0\0\0\0\0{}";
  ASSERT_EQ(::write(sv[0], half, 10), 10);
  ::close(sv[0]);
  EXPECT_THROW(ipc_read_frame(sv[1], "a truncated frame"), PolicyError);
  try {
    ipc_read_frame(sv[1], "the offer");
    ADD_FAILURE() << "read from a closed connection";
  } catch (const PolicyError& e) {
    EXPECT_NE(std::string(e.what()).find("closed the connection before the offer"),
              std::string::npos)
        << e.what();
  }
  ::close(sv[1]);
}

TEST(PolicyIpc, HandlesAsHexAndHeaderRefusals) {
  uint8_t h[64], back[64];
  for (int i = 0; i < 64; ++i) h[i] = uint8_t(i * 37 + 1);
  from_hex(to_hex(h, 64), back, 64, "a handle");
  EXPECT_EQ(std::memcmp(h, back, 64), 0);
  EXPECT_THROW(from_hex("abc", back, 2, "a handle"), PolicyError);
  EXPECT_THROW(from_hex("zz", back, 1, "a handle"), PolicyError);

  const PolicyVersion p =
      export_policy(tiny_weights(tiny_config(), test_seed() + 4), recipe("fp8_block"), 7);
  const Json hd = policy_layout(p).header;
  EXPECT_EQ(ipc_refusal(hd, std::nullopt, ""), "");
  EXPECT_EQ(ipc_refusal(hd, 6, "fp8_block"), "");
  EXPECT_NE(ipc_refusal(hd, 7, "").find("versions only move forward"), std::string::npos);
  EXPECT_NE(ipc_refusal(hd, 9, "").find("the receiver's last is 9"), std::string::npos);
  EXPECT_NE(ipc_refusal(hd, std::nullopt, "mxfp8").find("expects 'mxfp8'"), std::string::npos);
  Json old = hd;
  old["checksum_version"] = 1;
  EXPECT_NE(ipc_refusal(old, std::nullopt, "").find("checksum definition 1"), std::string::npos);
  EXPECT_NE(ipc_refusal(Json::object(), std::nullopt, "").find("malformed"), std::string::npos);
  EXPECT_NE(ipc_build_id().find("lockstep"), std::string::npos);
}

TEST(PolicyIpc, WithoutAGpuTheEndsRefuseClearly) {
  const DeviceReport r = query_devices();
  if (r.cuda_compiled && !r.gpus.empty()) GTEST_SKIP() << "a GPU is visible";
  const std::string path = "/tmp/lockstep_ipc_test_" + std::to_string(::getpid());
  for (const Device d : {Device::cuda(0), Device::cpu()}) {
    try {
      PolicyIpcReceiver rx(d);
      ADD_FAILURE() << "a receiver on " << d.str() << " was made";
    } catch (const std::exception& e) {
      const std::string what = e.what();
      EXPECT_TRUE(what.find("no CUDA backend") != std::string::npos ||
                  what.find("CUDA device") != std::string::npos ||
                  what.find("cuda") != std::string::npos)
          << what;
    }
    EXPECT_ANY_THROW(PolicyIpcSender(path, d));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}
