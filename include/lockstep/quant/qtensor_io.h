// QTensor <-> safetensors (CONTRACT.md section 11): a quantized tensor NAME is stored as
// NAME.qdata, NAME.block_scale, NAME.amax / NAME.scale_inv, NAME.qdata_colwise,
// NAME.block_scale_colwise, NAME.group_offsets, described by `lockstep.NAME.*` metadata.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "lockstep/quant/qtensor.h"
#include "lockstep/quant/quantize.h"
#include "lockstep/tensor/safetensors.h"

namespace lockstep {

constexpr const char* kContractVersion = "1";

// Append the tensors and metadata of `q` (quantized from a `source` tensor of dtype `source`)
// and set `lockstep.contract`.
void add_qtensor(SafetensorsFile& file, const std::string& name, const QTensor& q, DType source);

// The tensors (names, dtypes, shapes, in file order) and metadata that add_qtensor writes for a
// tensor NAME [rows, cols] of dtype `source` quantized (ungrouped) with `cfg`: known before
// quantizing, from the contract's shape rules alone, so that a file's header can be written first
// (SafetensorsStreamWriter). Appends to `specs` and sets entries of `metadata`.
void plan_qtensor(std::vector<TensorSpec>& specs, std::map<std::string, std::string>& metadata,
                  const std::string& name, int64_t rows, int64_t cols, DType source,
                  const QuantConfig& cfg);
// Writes the parts of an ungrouped q, quantized as plan_qtensor planned, through `w` in that
// order (the writer checks each name and byte count against its header).
void write_qtensor(SafetensorsStreamWriter& w, const std::string& name, const QTensor& q);

// Names of the quantized tensors described by the file's metadata, in file order.
std::vector<std::string> quantized_tensor_names(const SafetensorsFile& file);

// Rebuild a QTensor; every part's dtype and shape is checked against the metadata
// (SafetensorsError naming the tensor and the problem). `source` receives the original dtype.
QTensor read_qtensor(const SafetensorsFile& file, const std::string& name, DType* source = nullptr);

// True when `name` is one of the parts (NAME.qdata, ...) of a quantized tensor in `file`.
bool is_qtensor_part(const SafetensorsFile& file, const std::string& name);

}  // namespace lockstep
