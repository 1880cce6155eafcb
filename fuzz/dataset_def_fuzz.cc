// Fuzzes what the service does with a dataset definition that arrives from
// the network (RegisterDataset, GetDatasetDef, a worker's task): the input is
// parsed as a sluice.proto.DatasetDef; the dispatcher fingerprints it
// (CanonicalBytes / DefFingerprint) before anything validates it, and
// Dataset::FromDef rebuilds and validates it (analysis: argument checks,
// element specs, cardinality, expression compilation, decoding of
// FromTensors elements) as workers and GetDatasetDef do.
//
// Pipelines are not run: an arbitrary definition can read any file, filter
// forever or buffer without bound, so running one is not a bounded test.
//
// Invariants beyond "never crash":
//   - the canonical bytes are a fixed point: they parse, and the parsed
//     definition has the same canonical bytes (so the dispatcher's
//     deduplication is stable across a store/forward round trip);
//   - that round trip validates the same way (a worker receiving the def
//     the dispatcher stored agrees with the dispatcher), with the same
//     fingerprint, cardinality and element spec.
#include <cstddef>
#include <cstdint>
#include <string>

#include "dataset/dataset.pb.h"
#include "google/protobuf/stubs/logging.h"
#include "fuzz/fuzz_check.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/dataset_internal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Protobuf logs every string field that is not UTF-8; random inputs have many.
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  sluice::proto::DatasetDef def;
  if (size > static_cast<size_t>(INT32_MAX) || !def.ParseFromArray(data, static_cast<int>(size))) {
    return 0;
  }
  const std::string canonical = sluice::internal::CanonicalBytes(def);
  sluice::proto::DatasetDef stored;
  SLUICE_FUZZ_CHECK(stored.ParseFromString(canonical));
  SLUICE_FUZZ_CHECK(sluice::internal::CanonicalBytes(stored) == canonical);

  auto ds = sluice::Dataset::FromDef(def);
  auto forwarded = sluice::Dataset::FromDef(stored);
  SLUICE_FUZZ_CHECK(ds.ok() == forwarded.ok());
  if (!ds.ok()) {
    SLUICE_FUZZ_CHECK(ds.status() == forwarded.status());
    return 0;
  }
  SLUICE_FUZZ_CHECK(ds->status().ok());
  SLUICE_FUZZ_CHECK(ds->Fingerprint() == sluice::internal::DefFingerprint(def));
  SLUICE_FUZZ_CHECK(forwarded->Fingerprint() == ds->Fingerprint());
  SLUICE_FUZZ_CHECK(forwarded->Cardinality() == ds->Cardinality());
  SLUICE_FUZZ_CHECK(forwarded->element_spec().ToString() == ds->element_spec().ToString());
  auto serialized = ds->Serialize();
  SLUICE_FUZZ_CHECK(serialized.ok() && *serialized == canonical);
  (void)ds->DebugString();
  return 0;
}
