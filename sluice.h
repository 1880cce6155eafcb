// Umbrella header: everything a trainer or a plugin needs.
#pragma once

#include "sluice/core/dtype.h"
#include "sluice/core/frame.h"
#include "sluice/core/half.h"
#include "sluice/core/logging.h"
#include "sluice/core/status.h"
#include "sluice/core/tensor.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/element_spec.h"
#include "sluice/dataset/expr.h"
#include "sluice/dataset/image.h"
#include "sluice/dataset/tfrecord.h"
#include "sluice/dataset/udf.h"
#include "sluice/control/dispatch_server.h"
#include "sluice/worker/worker_server.h"
#include "sluice/client/distribute.h"
#include "sluice/dataplane/element_transport.h"  // TransportStats
#include "sluice/topology/topology.h"
