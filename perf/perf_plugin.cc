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
//  perf_ints, perf_text, perf_noise: int64 scalar S -> S bytes, built once
//    per size as perf_payload is, for `sluice-perf compression`: int64
//    counters (int64[S/8]), English text (uint8[S]) and random bytes
//    (uint8[S], as incompressible as JPEG data).
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include <sluice/sluice.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace {

// The payloads' bytes: (kind, size) -> its bytes, built once.
enum Kind { kPattern, kInts, kText, kNoise };
ABSL_CONST_INIT absl::Mutex g_payloads_mu(absl::kConstInit);
std::map<std::pair<Kind, int64_t>, std::shared_ptr<uint8_t>>* g_payloads
    ABSL_GUARDED_BY(g_payloads_mu) = nullptr;

void Fill(Kind kind, uint8_t* p, int64_t size) {
  switch (kind) {
    case kPattern:
      for (int64_t i = 0; i < size; ++i) p[i] = static_cast<uint8_t>(i * 131 + 7);
      break;
    case kInts:
      for (int64_t i = 0; i + 8 <= size; i += 8) {
        const int64_t v = i / 8;
        std::memcpy(p + i, &v, 8);
      }
      break;
    case kText: {
      static const char kWords[] =
          "Training jobs starve when input pipelines run on the trainer's own cpus: decode, "
          "augment and batch move to a fleet of workers, and elements stream to the client. ";
      for (int64_t i = 0; i < size; ++i) p[i] = static_cast<uint8_t>(kWords[i % (sizeof(kWords) - 1)]);
      break;
    }
    case kNoise: {
      uint64_t h = 0x243f6a8885a308d3ull;
      for (int64_t i = 0; i < size; ++i) {
        h ^= h << 13;
        h ^= h >> 7;
        h ^= h << 17;
        p[i] = static_cast<uint8_t>(h >> 56);
      }
      break;
    }
  }
}

absl::StatusOr<sluice::Element> Payload(Kind kind, const char* name, const sluice::Element& in) {
  if (in.size() != 1 || in[0].dtype() != sluice::DType::kInt64 || !in[0].shape().is_scalar()) {
    return absl::InvalidArgumentError(std::string(name) +
                                      " takes one int64 scalar (the payload size)");
  }
  int64_t size = in[0].at<int64_t>(0);
  if (size < 0) return absl::InvalidArgumentError(std::string(name) + ": negative size");
  if (kind == kInts) size = size / 8 * 8;
  std::shared_ptr<uint8_t> bytes;
  {
    absl::MutexLock l(&g_payloads_mu);
    if (g_payloads == nullptr) {
      g_payloads = new std::map<std::pair<Kind, int64_t>, std::shared_ptr<uint8_t>>;
    }
    auto& b = (*g_payloads)[{kind, size}];
    if (b == nullptr) {
      b = sluice::AllocateAligned(static_cast<size_t>(size) + 1);
      Fill(kind, b.get(), size);
    }
    bytes = b;
  }
  const sluice::DType dtype = kind == kInts ? sluice::DType::kInt64 : sluice::DType::kUInt8;
  const int64_t n = kind == kInts ? size / 8 : size;
  auto t = sluice::Tensor::View(dtype, sluice::TensorShape({n}), bytes.get(),
                                static_cast<size_t>(size), bytes);
  if (!t.ok()) return t.status();
  return sluice::Element{*std::move(t)};
}

absl::StatusOr<sluice::Element> PerfPayload(const sluice::Element& in) {
  return Payload(kPattern, "perf_payload", in);
}
absl::StatusOr<sluice::Element> PerfInts(const sluice::Element& in) {
  return Payload(kInts, "perf_ints", in);
}
absl::StatusOr<sluice::Element> PerfText(const sluice::Element& in) {
  return Payload(kText, "perf_text", in);
}
absl::StatusOr<sluice::Element> PerfNoise(const sluice::Element& in) {
  return Payload(kNoise, "perf_noise", in);
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
SLUICE_REGISTER_UDF(perf_ints, PerfInts,
                    {.num_inputs = 1, .output_dtypes = {{sluice::DType::kInt64}}});
SLUICE_REGISTER_UDF(perf_text, PerfText,
                    {.num_inputs = 1, .output_dtypes = {{sluice::DType::kUInt8}}});
SLUICE_REGISTER_UDF(perf_noise, PerfNoise,
                    {.num_inputs = 1, .output_dtypes = {{sluice::DType::kUInt8}}});
SLUICE_REGISTER_UDF(perf_burn, PerfBurn,
                    {.num_inputs = 1, .output_dtypes = {{sluice::DType::kInt64}}});
