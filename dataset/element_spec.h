// What is known statically about a dataset's elements.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sluice/core/dtype.h"

namespace sluice {

struct ComponentSpec {
  std::optional<DType> dtype;                 // nullopt: unknown
  std::optional<std::vector<int64_t>> shape;  // nullopt: unknown rank; -1: unknown dim

  bool is_scalar() const { return shape.has_value() && shape->empty(); }
  std::string ToString() const;
};

struct ElementSpec {
  // False when the component count itself is unknown (after an untyped UDF).
  bool known = true;
  std::vector<ComponentSpec> components;

  static ElementSpec Unknown() { return ElementSpec{false, {}}; }
  std::string ToString() const;
};

}  // namespace sluice
