#include "sluice/rpc/protocol.h"

#include <unistd.h>

#include <cstdlib>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace sluice::internal {
namespace {

struct ModeName {
  const char* name;
  proto::ProcessingMode mode;
};
// The first name of a mode is its canonical one; "off" and "dynamic" are
// tf.data's names of the sharding policies behind the two epoch modes.
constexpr ModeName kModeNames[] = {
    {"parallel_epochs", proto::PARALLEL_EPOCHS}, {"distributed_epoch", proto::DISTRIBUTED_EPOCH},
    {"file", proto::FILE_SHARDING},              {"data", proto::DATA_SHARDING},
    {"file_or_data", proto::FILE_OR_DATA_SHARDING}, {"hint", proto::HINT_SHARDING},
    {"off", proto::PARALLEL_EPOCHS},             {"dynamic", proto::DISTRIBUTED_EPOCH},
};

}  // namespace

absl::StatusOr<proto::ProcessingMode> ParseProcessingMode(const std::string& name) {
  for (const ModeName& m : kModeNames) {
    if (name == m.name) return m.mode;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown processing_mode '", name,
      "'; expected parallel_epochs (off), distributed_epoch (dynamic), file, data, "
      "file_or_data or hint"));
}

std::string ProcessingModeName(proto::ProcessingMode mode) {
  for (const ModeName& m : kModeNames) {
    if (mode == m.mode) return m.name;
  }
  return "unspecified";
}

absl::StatusOr<proto::TargetWorkers> ParseTargetWorkers(const std::string& name) {
  const std::string upper = absl::AsciiStrToUpper(name);
  if (upper.empty() || upper == "AUTO") return proto::TARGET_WORKERS_AUTO;
  if (upper == "ANY") return proto::TARGET_WORKERS_ANY;
  if (upper == "LOCAL") return proto::TARGET_WORKERS_LOCAL;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown target_workers '", name, "'; expected AUTO, ANY or LOCAL"));
}

std::string TargetWorkersName(proto::TargetWorkers target) {
  switch (target) {
    case proto::TARGET_WORKERS_ANY: return "ANY";
    case proto::TARGET_WORKERS_LOCAL: return "LOCAL";
    default: return "AUTO";
  }
}

std::string LocalHostId() {
  const char* env = std::getenv("SLUICE_HOST_ID");
  if (env != nullptr && *env != '\0') return env;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

std::optional<StaticSharding> StaticShardingOf(proto::ProcessingMode mode) {
  switch (mode) {
    case proto::FILE_SHARDING: return StaticSharding::kFile;
    case proto::DATA_SHARDING: return StaticSharding::kData;
    case proto::FILE_OR_DATA_SHARDING: return StaticSharding::kFileOrData;
    case proto::HINT_SHARDING: return StaticSharding::kHint;
    default: return std::nullopt;
  }
}

namespace {

// Whether `m` nests at most `budget` embedded messages deep, as protobuf's
// parser counts them (the top message not counted); walks without a copy.
bool WithinDepth(const google::protobuf::Message& m, int budget) {
  const google::protobuf::Reflection* r = m.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const google::protobuf::FieldDescriptor* f : fields) {
    if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (budget == 0) return false;
    if (f->is_repeated()) {
      for (int i = 0; i < r->FieldSize(m, f); ++i) {
        if (!WithinDepth(r->GetRepeatedMessage(m, f, i), budget - 1)) return false;
      }
    } else if (!WithinDepth(r->GetMessage(m, f), budget - 1)) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::Status CheckWireDepth(const proto::DatasetDef& def, const char* what) {
  if (WithinDepth(def, kMaxWireDatasetDepth)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": the pipeline nests deeper than the service carries (", kMaxWireDatasetDepth,
      " nested protobuf messages: about 45 chained ops, or an expression about 90 operations "
      "deep). Fold chained Maps into one Map of a compound expression, or balance a long "
      "expression (a sum of many terms as a tree, not a chain)"));
}

}  // namespace sluice::internal
