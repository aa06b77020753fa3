// The parts of the _lockstep extension module, one registration function per area (each in its
// own bind_*.cpp), called by module.cpp.
#pragma once

#include <nanobind/nanobind.h>

namespace lockstep::py {

void bind_quant(nanobind::module_& m);   // quantize, dequantize, QTensor, files
void bind_gemm(nanobind::module_& m);    // qgemm, grouped_qgemm
void bind_recipe(nanobind::module_& m);  // recipes, describe, selection
void bind_rl(nanobind::module_& m);      // align_stats, TIS, TRIAGE, GRPO, the objective
void bind_nn(nanobind::module_& m);      // nn::Linear, nn::GroupedLinear handles
void bind_model(nanobind::module_& m);   // model directories, learner, sampler, policies

}  // namespace lockstep::py
