// The output side of an export, private to src/convert: the folder checks and the streaming
// writer that both sources (a policy in memory, a checkpoint on disk) feed unit by unit.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "lockstep/convert/export.h"
#include "lockstep/recipe/json.h"

namespace lockstep::convert {

// ExportError unless `out_dir` can be created: a non-empty name, nothing at that path, a
// writable parent folder.
void check_out_dir(const std::string& out_dir);

// The output tensors of a unit, named, typed and shaped as unit.specs (unit_tensors).
using UnitProducer = std::function<std::vector<NamedTensor>(const ExportUnit&)>;

// Writes the export of `plan` to out_dir through a temporary folder beside it (see export.h).
// config: the config.json object to complete with torch_dtype and quantization_config.
ExportResult write_export(const ExportPlan& plan, Json config, const std::string& tokenizer_dir,
                          const std::string& out_dir, const UnitProducer& produce);

}  // namespace lockstep::convert
