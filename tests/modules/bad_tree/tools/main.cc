// A fixture for the module-order check: a binary may link the dispatcher,
// but through control/dispatch_server.h, not its private state machine.
#include "sluice/control/dispatch_server.h"
#include "sluice/control/dispatcher_impl.h"
