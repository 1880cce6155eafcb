// ElementTransport::GetElement (waiting on GetElementAsync) and the fallback
// wrapper (UCX until it fails before ever delivering a reply, then gRPC for
// good).
#include <algorithm>
#include <atomic>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "sluice/core/event_fd.h"
#include "sluice/dataplane/element_transport.h"
#include "sluice/dataplane/transport_registry.h"
#include "spdlog/spdlog.h"

namespace sluice {
namespace {

// See MakeFallbackTransport.
class FallbackTransport final : public ElementTransport {
 public:
  FallbackTransport(std::unique_ptr<ElementTransport> primary,
                    std::unique_ptr<ElementTransport> fallback, std::string peer, bool allow)
      : fallback_(std::move(fallback)), primary_(std::move(primary)), peer_(std::move(peer)),
        allow_(allow) {}

  void GetElementAsync(const ElementRequest& request, ElementCallback done) override {
    if (switched_.load()) return fallback_->GetElementAsync(request, std::move(done));
    primary_->GetElementAsync(request, [this, done = std::move(done)](
                                           absl::StatusOr<ElementResult> r) mutable {
      if (r.ok()) {
        worked_ = true;
        unanswered_ = 0;
        return done(std::move(r));
      }
      const bool transport_failure =
          absl::IsUnavailable(r.status()) || absl::IsDeadlineExceeded(r.status());
      if (!transport_failure) return done(std::move(r));
      if (worked_.load()) {
        // A peer that answered before: a reset means it died (its task is
        // lost; switching would not help). Requests it leaves unanswered,
        // kUnansweredBeforeSwitch in a row while it lives, mean this path
        // went silent (seen with UCX after churn): the fallback may work.
        if (!allow_ || !absl::IsDeadlineExceeded(r.status()) ||
            ++unanswered_ < kUnansweredBeforeSwitch) {
          return done(std::move(r));
        }
      }
      if (!allow_) {
        return done(absl::UnavailableError(absl::StrCat(
            "cannot reach worker ", peer_, " over ", primary_->protocol(), " and fallback to ",
            fallback_->protocol(), " is disabled: ", r.status().message())));
      }
      if (!switched_.exchange(true)) {
        spdlog::warn("sluice client: {} to worker {} failed ({}); falling back to {}",
                     primary_->protocol(), peer_, std::string(r.status().message()),
                     fallback_->protocol());
      }
      // Not sent again as it was: the worker may have handed out this
      // request's elements in a reply that was lost. The caller's retry
      // (over the fallback now) asks for what it lacks.
      done(std::move(r));
    });
  }
  void Cancel() override {
    primary_->Cancel();
    fallback_->Cancel();
  }
  std::string protocol() const override {
    return switched_.load() ? fallback_->protocol() : primary_->protocol();
  }

 private:
  // The primary is declared last, so it is destroyed first: a callback of
  // its may still send on the fallback.
  std::unique_ptr<ElementTransport> fallback_;
  std::unique_ptr<ElementTransport> primary_;
  static constexpr int kUnansweredBeforeSwitch = 2;
  const std::string peer_;
  const bool allow_;
  std::atomic<bool> switched_{false}, worked_{false};
  std::atomic<int> unanswered_{0};  // primary requests timed out in a row
};

}  // namespace

absl::StatusOr<ElementResult> ElementTransport::GetElement(const ElementRequest& request) {
  struct Outcome {
    absl::Notification done;
    internal::EventFd wake;  // written with the outcome, for a waiter driving UCX
    absl::StatusOr<ElementResult> result = absl::UnknownError("no outcome");
  };
  auto outcome = std::make_shared<Outcome>();
  GetElementAsync(request, [outcome](absl::StatusOr<ElementResult> r) {
    outcome->result = std::move(r);
    outcome->done.Notify();
    outcome->wake.Signal();
  });
  // Over a protocol that lets a waiter drive its progress, this thread
  // does, as the data-service iterator does (TransportProtocol::drive_client).
  auto by_name = internal::FindTransportProtocol(protocol(), "GetElement");
  while (!outcome->done.HasBeenNotified()) {
    if (!by_name.ok() || !(*by_name)->drive_client ||
        !(*by_name)->drive_client(absl::Milliseconds(100), outcome->wake.fd())) {
      outcome->done.WaitForNotification();
    }
  }
  return std::move(outcome->result);
}

std::unique_ptr<ElementTransport> MakeFallbackTransport(std::unique_ptr<ElementTransport> primary,
                                                       std::unique_ptr<ElementTransport> fallback,
                                                       std::string peer, bool allow_fallback) {
  return std::unique_ptr<ElementTransport>(new FallbackTransport(
      std::move(primary), std::move(fallback), std::move(peer), allow_fallback));
}

bool UcxRendezvousCopies(absl::string_view lanes) {
  bool any_lane = false;
  // Lanes are "tl/device(role role ...)", space-separated.
  for (absl::string_view lane : absl::StrSplit(lanes, ')', absl::SkipWhitespace())) {
    lane = absl::StripAsciiWhitespace(lane);
    const size_t open = lane.find('(');
    if (open == absl::string_view::npos) continue;
    any_lane = true;
    const absl::string_view tl = lane.substr(0, std::min(lane.find('/'), open));
    const std::vector<absl::string_view> roles =
        absl::StrSplit(lane.substr(open + 1), ' ', absl::SkipEmpty());
    if (std::find(roles.begin(), roles.end(), "rma_bw") != roles.end() && tl != "tcp") {
      return false;
    }
  }
  return any_lane;
}

absl::StatusOr<EagerReplies> ParseEagerReplies(const char* value) {
  if (value == nullptr) return EagerReplies::kAuto;
  const std::string v(value);
  if (v == "auto" || v.empty()) return EagerReplies::kAuto;
  if (v == "0") return EagerReplies::kNever;
  if (v == "1") return EagerReplies::kAlways;
  return absl::InvalidArgumentError(absl::StrCat(
      "SLUICE_UCX_EAGER_REPLIES must be 0 (never), 1 (always) or auto (where the rendezvous "
      "would copy anyway: tcp); got '", v, "'"));
}

}  // namespace sluice
