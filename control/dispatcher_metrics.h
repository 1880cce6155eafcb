// The dispatcher's Prometheus metrics (GET /metrics on --metrics_port).
// Internal; the names are listed in docs/observability.md.
#pragma once

#include <string>

#include "sluice/control/dispatcher_impl.h"

namespace sluice::internal {

// The exposition (text format 0.0.4) of one stats snapshot.
std::string RenderDispatcherMetrics(const DispatcherImpl::Stats& stats);

}  // namespace sluice::internal
