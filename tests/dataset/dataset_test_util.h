// Helpers for dataset tests: drain a dataset, read scalar values.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "sluice/dataset/dataset.h"
#include "tests/test_util.h"

namespace sluice_test {

// All elements of one pass, or the first error.
inline absl::StatusOr<std::vector<sluice::Element>> Collect(const sluice::Dataset& ds,
                                                            size_t limit = 1000000) {
  auto it = ds.MakeIterator();
  if (!it.ok()) return it.status();
  std::vector<sluice::Element> out;
  while (out.size() < limit) {
    auto e = (*it)->Next();
    if (!e.ok()) return e.status();
    if (!e->has_value()) break;
    out.push_back(std::move(**e));
  }
  return out;
}

// Component `c` of every element, each a scalar of type T.
template <typename T>
absl::StatusOr<std::vector<T>> CollectScalars(const sluice::Dataset& ds, size_t c = 0) {
  auto elements = Collect(ds);
  if (!elements.ok()) return elements.status();
  std::vector<T> out;
  for (const auto& e : *elements) {
    if (c >= e.size() || !e[c].shape().is_scalar() || e[c].dtype() != sluice::DTypeOf<T>()) {
      return absl::InternalError("element is not a scalar of the expected dtype: " +
                                 sluice::ElementDebugString(e));
    }
    out.push_back(e[c].at<T>(0));
  }
  return out;
}

// A fresh directory under the test temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "sluice_ds_XXXXXX";
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace sluice_test
