// A UDF plugin loaded by plugin tests with LoadPlugin().
#include <sluice/sluice.h>

namespace {

// Doubles an int64 scalar.
absl::StatusOr<sluice::Element> PluginDouble(const sluice::Element& in) {
  if (in[0].dtype() != sluice::DType::kInt64) {
    return absl::InvalidArgumentError("plugin_double takes int64");
  }
  auto v = in[0].values<int64_t>();
  std::vector<int64_t> out(v.begin(), v.end());
  for (auto& x : out) x *= 2;
  auto t = sluice::Tensor::FromVector(out, in[0].shape());
  if (!t.ok()) return t.status();
  return sluice::Element{*std::move(t)};
}

}  // namespace

SLUICE_REGISTER_UDF(plugin_double, PluginDouble,
                    {.num_inputs = 1, .output_dtypes = {{sluice::DType::kInt64}}});
