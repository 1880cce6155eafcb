// A fixture for the module-order check (tests/CMakeLists.txt): the data
// plane reaching into the dispatcher, which the order forbids.
#include "sluice/core/status.h"
#include "sluice/control/dispatcher_impl.h"
