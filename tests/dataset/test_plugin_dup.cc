// A plugin that registers a name the first test plugin already owns.
#include <sluice/sluice.h>

namespace {
absl::StatusOr<sluice::Element> Identity(const sluice::Element& in) { return in; }
}  // namespace

SLUICE_REGISTER_UDF(plugin_double, Identity, {});
