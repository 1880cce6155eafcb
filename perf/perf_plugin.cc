// UDFs used by sluice-perf, loaded by its workers (`--plugin`) and by the
// sluice-perf client process (so the pipeline type-checks where it is built).
//
//  perf_payload: int64 scalar S -> uint8[S]. The bytes are built once per
//    size and shared by every element (a view, no allocation or fill per
//    element), so the worker spends almost nothing producing an element and
//    the transport is what is measured. The worker still encodes each frame
//    (one copy of S bytes into its send buffer): that is part of serving.
//  perf_burn: int64 scalar N -> int64 scalar. N rounds of an integer mix, a
//    fixed amount of CPU per element that the compiler cannot elide.
#include <cstdint>
#include <map>
#include <memory>

#include <sluice/sluice.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace {

// perf_payload's bytes: size -> its bytes, built once.
ABSL_CONST_INIT absl::Mutex g_payloads_mu(absl::kConstInit);
std::map<int64_t, std::shared_ptr<uint8_t>>* g_payloads ABSL_GUARDED_BY(g_payloads_mu) = nullptr;

absl::StatusOr<sluice::Element> PerfPayload(const sluice::Element& in) {
  if (in.size() != 1 || in[0].dtype() != sluice::DType::kInt64 || !in[0].shape().is_scalar()) {
    return absl::InvalidArgumentError("perf_payload takes one int64 scalar (the payload size)");
  }
  const int64_t size = in[0].at<int64_t>(0);
  if (size < 0) return absl::InvalidArgumentError("perf_payload: negative size");
  std::shared_ptr<uint8_t> bytes;
  {
    absl::MutexLock l(&g_payloads_mu);
    if (g_payloads == nullptr) g_payloads = new std::map<int64_t, std::shared_ptr<uint8_t>>;
    auto& b = (*g_payloads)[size];
    if (b == nullptr) {
      b = sluice::AllocateAligned(static_cast<size_t>(size) + 1);
      for (int64_t i = 0; i < size; ++i) b.get()[i] = static_cast<uint8_t>(i * 131 + 7);
    }
    bytes = b;
  }
  auto t = sluice::Tensor::View(sluice::DType::kUInt8, sluice::TensorShape({size}), bytes.get(),
                                static_cast<size_t>(size), bytes);
  if (!t.ok()) return t.status();
  return sluice::Element{*std::move(t)};
}

absl::StatusOr<sluice::Element> PerfBurn(const sluice::Element& in) {
  if (in.size() != 1 || in[0].dtype() != sluice::DType::kInt64 || !in[0].shape().is_scalar()) {
    return absl::InvalidArgumentError("perf_burn takes one int64 scalar (the rounds of work)");
  }
  const int64_t rounds = in[0].at<int64_t>(0);
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (int64_t i = 0; i < rounds; ++i) {  // splitmix64 steps: a serial dependency chain
    h += 0x9e3779b97f4a7c15ull;
    uint64_t z = h;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    h ^= z ^ (z >> 31);
  }
  return sluice::Element{sluice::Tensor::Scalar<int64_t>(static_cast<int64_t>(h))};
}

}  // namespace

SLUICE_REGISTER_UDF(perf_payload, PerfPayload,
                    {.num_inputs = 1, .output_dtypes = {{sluice::DType::kUInt8}}});
SLUICE_REGISTER_UDF(perf_burn, PerfBurn,
                    {.num_inputs = 1, .output_dtypes = {{sluice::DType::kInt64}}});
