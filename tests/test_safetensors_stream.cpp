// Tests of the memory-mapped reader (map_safetensors: views of one mapping, the reader's
// validation, the copy fallback for misaligned tensors), the streaming writer
// (SafetensorsStreamWriter: the same bytes as write_safetensors, plan mismatches refused) and the
// quantized-file plan (plan_qtensor: the parts add_qtensor writes, known before quantizing).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "lockstep/quant/qtensor_io.h"
#include "lockstep/quant/quantize.h"
#include "lockstep/tensor/file_io.h"
#include "lockstep/tensor/safetensors.h"
#include "safetensors_test_util.h"
#include "temp_dir.h"
#include "test_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using test_util::TempDir;

using test_util::every_dtype_file;
using test_util::expect_same;
using test_util::patterned;
using test_util::slurp;

void spit(const std::string& p, std::string_view bytes) {
  std::ofstream(p, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

// every_dtype_file with 7 columns (tensor offsets that are and are not multiples of the element
// size) and metadata, so that the writers' metadata handling is covered too.
SafetensorsFile every_dtype_file_with_metadata() {
  SafetensorsFile f = every_dtype_file(7);
  f.metadata = {{"format", "pt"}, {"k", "v"}};
  return f;
}

// ---- map_safetensors ----------------------------------------------------------------------------

TEST(SafetensorsMap, EqualsReadAndViewsOneMapping) {
  TempDir dir;
  const std::string path = (dir / "all.safetensors").string();
  const SafetensorsFile f = every_dtype_file_with_metadata();
  write_safetensors(path, f);
  const SafetensorsFile mapped = map_safetensors(path);
  expect_same(read_safetensors(path), mapped);
  // The header is padded to 8 bytes, so a tensor whose offset is a multiple of its element size
  // is a view (it sits at its header offset from the first tensor) and any other is an aligned
  // copy. The odd shapes above give both kinds.
  const SafetensorsHeader h = read_safetensors_header(path);
  const auto* first = static_cast<const std::byte*>(mapped.tensors[0].tensor.raw());
  int views = 0, copies = 0;
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    if (h.tensors[i].end == h.tensors[i].begin) continue;
    const auto* at = static_cast<const std::byte*>(mapped.tensors[i].tensor.raw());
    const size_t es = dtype_size(h.tensors[i].dtype);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(at) % es, 0u) << h.tensors[i].name;
    if (h.tensors[i].begin % es == 0) {
      EXPECT_EQ(at - first, std::ptrdiff_t(h.tensors[i].begin)) << h.tensors[i].name;
      ++views;
    } else {
      ++copies;
    }
  }
  EXPECT_GT(views, 0);
  EXPECT_GT(copies, 0);
}

TEST(SafetensorsMap, TensorsOutliveTheFileObjectAndTheFileName) {
  TempDir dir;
  const std::string path = (dir / "w.safetensors").string();
  SafetensorsFile f;
  f.tensors.push_back({"w", patterned(DType::kBF16, {64, 64}, 5)});
  write_safetensors(path, f);
  Tensor kept;
  {
    SafetensorsFile mapped = map_safetensors(path);
    kept = mapped.tensors[0].tensor;
  }
  fs::remove(path);  // the mapping keeps the inode's bytes
  ASSERT_EQ(kept.nbytes(), f.tensors[0].tensor.nbytes());
  EXPECT_EQ(std::memcmp(kept.raw(), f.tensors[0].tensor.raw(), kept.nbytes()), 0);
  // A copy made from the view is an ordinary owned tensor.
  const Tensor copy = kept.clone();
  kept = Tensor();
  EXPECT_EQ(std::memcmp(copy.raw(), f.tensors[0].tensor.raw(), copy.nbytes()), 0);
}

TEST(SafetensorsMap, KeepsTheReadersValidation) {
  TempDir dir;
  const std::string path = (dir / "t.safetensors").string();
  SafetensorsFile f;
  f.tensors.push_back({"w", patterned(DType::kF32, {16}, 3)});
  write_safetensors(path, f);
  fs::resize_file(path, fs::file_size(path) - 1);
  try {
    map_safetensors(path);
    ADD_FAILURE() << "truncated file was mapped";
  } catch (const SafetensorsError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("tensor 'w'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("beyond the data buffer"), std::string::npos) << msg;
  }
  spit(path, "short");
  EXPECT_THROW(map_safetensors(path), SafetensorsError);
  EXPECT_THROW(map_safetensors((dir / "missing.safetensors").string()), SafetensorsError);
  EXPECT_THROW(map_safetensors(dir.path().string()), SafetensorsError);  // a directory
}

TEST(SafetensorsMap, MisalignedTensorIsCopiedAligned) {
  // A 5-byte header puts the data at file offset 13: an F32 tensor there is not 4-byte aligned in
  // the mapping, so the reader copies it into aligned storage; a U8 tensor stays a view.
  TempDir dir;
  const std::string path = (dir / "odd.safetensors").string();
  const std::string header = R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[3,11]}})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char(uint8_t(header.size() >> (8 * i)));
  bytes += header;
  const float b[2] = {1.5f, -2.25f};
  bytes += "xyz";
  bytes.append(reinterpret_cast<const char*>(b), sizeof(b));
  spit(path, bytes);
  const SafetensorsFile m = map_safetensors(path);
  ASSERT_EQ(m.tensors.size(), 2u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m.tensors[1].tensor.raw()) % 4, 0u);
  EXPECT_EQ(m.tensors[1].tensor.data<float>()[0], 1.5f);
  EXPECT_EQ(m.tensors[1].tensor.data<float>()[1], -2.25f);
  EXPECT_EQ(std::string(static_cast<const char*>(m.tensors[0].tensor.raw()), 3), "xyz");
  expect_same(read_safetensors(path), m);
}

TEST(SafetensorsMap, WrappedStorageChecksItsSize) {
  auto owner = std::make_shared<std::vector<float>>(6, 1.0f);
  auto storage = Storage::wrap_host(owner->data(), owner->size() * sizeof(float), owner);
  const Tensor t = Tensor::wrap(storage, DType::kF32, {2, 3});
  EXPECT_EQ(t.raw(), owner->data());
  EXPECT_THROW(Tensor::wrap(storage, DType::kF32, {2, 4}), std::invalid_argument);
  EXPECT_THROW(Storage::wrap_host(nullptr, 4, owner), std::invalid_argument);
  EXPECT_THROW(Storage::wrap_host(owner->data(), 4, nullptr), std::invalid_argument);
  std::weak_ptr<std::vector<float>> alive = owner;
  owner.reset();
  storage.reset();
  EXPECT_FALSE(alive.expired());  // t still holds the owner
}

// ---- SafetensorsStreamWriter --------------------------------------------------------------------

std::vector<TensorSpec> specs_of(const SafetensorsFile& f) {
  std::vector<TensorSpec> s;
  for (const NamedTensor& nt : f.tensors)
    s.push_back({nt.name, nt.tensor.dtype(), nt.tensor.shape()});
  return s;
}

TEST(SafetensorsStream, SameBytesAsWriteSafetensors) {
  TempDir dir;
  const SafetensorsFile f = every_dtype_file_with_metadata();
  const std::string whole = (dir / "whole.safetensors").string();
  const std::string streamed = (dir / "streamed.safetensors").string();
  write_safetensors(whole, f);
  SafetensorsStreamWriter w(specs_of(f), f.metadata, streamed);
  AtomicFile out(streamed);
  w.start(out);
  for (const NamedTensor& nt : f.tensors) w.write(nt.name, nt.tensor.bytes());
  w.finish();
  out.commit();
  EXPECT_EQ(slurp(whole), slurp(streamed));
  EXPECT_EQ(
      uint64_t(slurp(whole).size()), w.header_bytes() + [&] {
        uint64_t n = 0;
        for (const NamedTensor& nt : f.tensors) n += nt.tensor.nbytes();
        return n;
      }());
}

TEST(SafetensorsStream, RefusesWritesThatDoNotMatchThePlan) {
  TempDir dir;
  const std::string path = (dir / "s.safetensors").string();
  std::vector<TensorSpec> specs = {{"a", DType::kF32, {2, 3}}, {"b", DType::kU8, {5}}};
  SafetensorsStreamWriter w(specs, {}, path);
  {
    AtomicFile out(path);
    EXPECT_THROW(w.write("a", patterned(DType::kF32, {2, 3}, 1)), std::logic_error);  // no start
    w.start(out);
    EXPECT_THROW(w.write("b", patterned(DType::kU8, {5}, 1)), std::logic_error);  // out of order
    EXPECT_THROW(w.write("a", patterned(DType::kF32, {3, 2}, 1)), std::logic_error);  // shape
    EXPECT_THROW(w.write("a", patterned(DType::kI32, {2, 3}, 1)), std::logic_error);  // dtype
    EXPECT_THROW(w.write("a", std::span<const std::byte>()), std::logic_error);       // size
    w.write("a", patterned(DType::kF32, {2, 3}, 1));
    EXPECT_THROW(w.finish(), std::logic_error);  // "b" not written
  }                                              // not committed: nothing left behind
  EXPECT_EQ(dir.entries(), 0u);
  // Bad specs are refused before any file exists.
  EXPECT_THROW(SafetensorsStreamWriter({{"a", DType::kU8, {1}}, {"a", DType::kU8, {1}}}, {}, path),
               SafetensorsError);
  EXPECT_THROW(SafetensorsStreamWriter({{"", DType::kU8, {1}}}, {}, path), SafetensorsError);
  EXPECT_THROW(SafetensorsStreamWriter({{"x", DType::kF64, {int64_t(1) << 62, 4}}}, {}, path),
               SafetensorsError);
}

// ---- plan_qtensor -------------------------------------------------------------------------------

struct PlanCase {
  const char* what;
  QuantConfig cfg;
};

std::vector<PlanCase> plan_cases() {
  std::vector<PlanCase> cases;
  auto add = [&](const char* what, auto set) {
    QuantConfig c;
    c.format = Format::kNvfp4;
    set(c);
    cases.push_back({what, c});
  };
  for (bool col : {false, true}) {
    for (ScaleLayout l : {ScaleLayout::kCompact, ScaleLayout::kSwizzled}) {
      add("nvfp4 per_tensor", [&](QuantConfig& c) {
        c.scaling = Scaling::kPerTensor, c.colwise = col, c.scale_layout = l;
      });
      add("nvfp4 per_row", [&](QuantConfig& c) {
        c.scaling = Scaling::kPerRow, c.colwise = col, c.scale_layout = l;
      });
      add("nvfp4 2-D",
          [&](QuantConfig& c) { c.block2d = true, c.colwise = col, c.scale_layout = l; });
      add("mxfp8", [&](QuantConfig& c) {
        c.format = Format::kMxfp8, c.scaling = Scaling::kBlock1x32, c.colwise = col,
        c.scale_layout = l;
      });
    }
    add("mxfp8 e5m2", [&](QuantConfig& c) {
      c.format = Format::kMxfp8, c.scaling = Scaling::kBlock1x32, c.elem = ElemCodec::kE5M2,
      c.colwise = col;
    });
    for (Scaling s :
         {Scaling::kPerTensor, Scaling::kPerRow, Scaling::kBlock1x128, Scaling::kBlock128x128})
      add("fp8", [&](QuantConfig& c) { c.format = Format::kFp8, c.scaling = s, c.colwise = col; });
  }
  add("mxfp8 columnwise only", [&](QuantConfig& c) {
    c.format = Format::kMxfp8, c.scaling = Scaling::kBlock1x32, c.rowwise = false, c.colwise = true;
  });
  add("nvfp4 hadamard", [&](QuantConfig& c) { c.scaling = Scaling::kPerRow, c.hadamard = true; });
  return cases;
}

TEST(QTensorPlan, MatchesAddQtensorAndStreamsTheSameFile) {
  TempDir dir;
  const int64_t rows = 160, cols = 288;  // not a multiple of 128: partial 128-blocks and tiles
  std::mt19937 rng(uint32_t(test::test_seed()));
  std::normal_distribution<float> nd;
  std::vector<float> v(size_t(rows * cols));
  for (float& x : v) x = nd(rng);
  const Tensor x = cast(test::mat(v, rows, cols), DType::kBF16);
  for (const PlanCase& c : plan_cases()) {
    SCOPED_TRACE(std::string(c.what) + (c.cfg.colwise ? " colwise" : "") +
                 (c.cfg.scale_layout == ScaleLayout::kSwizzled ? " swizzled" : ""));
    const QTensor q = quantize(x, c.cfg, "w");
    SafetensorsFile whole;
    whole.tensors.push_back({"first", patterned(DType::kU8, {3}, 1)});
    add_qtensor(whole, "w", q, DType::kBF16);
    std::vector<TensorSpec> specs = {{"first", DType::kU8, {3}}};
    std::map<std::string, std::string> md;
    plan_qtensor(specs, md, "w", rows, cols, DType::kBF16, c.cfg);
    EXPECT_EQ(md, whole.metadata);
    ASSERT_EQ(specs.size(), whole.tensors.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      EXPECT_EQ(specs[i].name, whole.tensors[i].name);
      EXPECT_EQ(specs[i].dtype, whole.tensors[i].tensor.dtype()) << specs[i].name;
      EXPECT_EQ(specs[i].shape, whole.tensors[i].tensor.shape()) << specs[i].name;
    }
    const std::string a = (dir / "a.safetensors").string(), b = (dir / "b.safetensors").string();
    write_safetensors(a, whole);
    SafetensorsStreamWriter w(specs, md, b);
    AtomicFile out(b);
    w.start(out);
    w.write("first", whole.tensors[0].tensor);
    write_qtensor(w, "w", q);
    w.finish();
    out.commit();
    EXPECT_EQ(slurp(a), slurp(b));
  }
}

}  // namespace
}  // namespace lockstep
