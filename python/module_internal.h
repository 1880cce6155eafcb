// Pieces of the sluice._sluice module defined in their own files.
#pragma once

#include <pybind11/pybind11.h>

namespace sluice::python {

// logging_bridge.cc: sluice's messages go to Python's logging ("sluice").
void DefineLogging(pybind11::module_& m);

}  // namespace sluice::python
