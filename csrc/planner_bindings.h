// pybind11 bindings of the checkpoint planner (csrc/planner), added to memsave._C by csrc/bindings.cpp.
#pragma once

#include <pybind11/pybind11.h>

namespace memsave {

// Defines planner_solve, planner_simulate, planner_min_peak and planner_strategies on `m`.
void bind_planner(pybind11::module_& m);

}  // namespace memsave
