// A fixture for the module-order check: core must include nothing of ours.
#include "dataset/dataset.pb.h"
