#include "sluice/core/interrupt.h"

namespace sluice {
namespace {
thread_local const std::function<absl::Status()>* t_check = nullptr;
}  // namespace

ScopedInterruptCheck::ScopedInterruptCheck(std::function<absl::Status()> check)
    : check_(std::move(check)), outer_(t_check) {
  t_check = &check_;
}

ScopedInterruptCheck::~ScopedInterruptCheck() { t_check = outer_; }

absl::Status CheckInterrupt() {
  if (t_check == nullptr || !*t_check) return absl::OkStatus();
  return (*t_check)();
}

}  // namespace sluice
