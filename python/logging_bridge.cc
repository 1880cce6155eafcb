// sluice's log messages into Python's `logging` (logger "sluice").
//
// A spdlog sink on the default logger queues each message; it never waits
// for the GIL, so a C++ thread that logs while holding one of its own locks
// cannot deadlock with a Python thread that holds the GIL and wants that
// lock. One forwarder thread (owned here, joined by Stop) takes the GIL and
// hands the queued messages to logging.getLogger("sluice"), so handlers,
// levels and formats configured in Python apply; with none configured,
// Python prints warnings and errors to stderr (its "last resort" handler).
// Stop runs at interpreter exit (atexit); messages after it, and while the
// queue is full, go to stderr, formatted by sluice (SLUICE_LOG_FORMAT).
//
// Which messages are produced at all is sluice's level: "warn" by default,
// sluice.set_log_level() or $SLUICE_LOG_LEVEL to change it.
#include <pybind11/pybind11.h>

#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "python/module_internal.h"
#include "spdlog/sinks/base_sink.h"
#include "spdlog/spdlog.h"

namespace sluice::python {
namespace {

namespace py = pybind11;

constexpr size_t kMaxQueued = 10000;

int PythonLevel(spdlog::level::level_enum l) {
  switch (l) {
    case spdlog::level::trace: return 5;
    case spdlog::level::debug: return 10;
    case spdlog::level::info: return 20;
    case spdlog::level::warn: return 30;
    case spdlog::level::err: return 40;
    default: return 50;
  }
}

class Forwarder {
 public:
  static Forwarder& Get() {
    static Forwarder* f = new Forwarder();  // outlives every logging thread
    return *f;
  }

  // With the GIL.
  void Start() {
    logger_ = py::module_::import("logging").attr("getLogger")("sluice");
    absl::MutexLock l(&mu_);
    running_ = true;
    thread_ = std::thread([this] { Loop(); });
  }

  // With the GIL (released while joining: the forwarder may be waiting
  // for it). Later messages go to stderr.
  void Stop() {
    {
      absl::MutexLock l(&mu_);
      if (!running_) return;
      running_ = false;
    }
    {
      py::gil_scoped_release release;
      if (thread_.joinable()) thread_.join();
    }
    logger_ = py::object();
  }

  // False when not running or full: the caller writes to stderr instead.
  bool Push(int level, std::string message) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    if (!running_ || queue_.size() >= kMaxQueued) return false;
    queue_.emplace_back(level, std::move(message));
    return true;
  }

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_) {
    while (true) {
      std::deque<std::pair<int, std::string>> batch;
      bool running;
      {
        absl::MutexLock l(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return !running_ || !queue_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        batch.swap(queue_);
        running = running_;
      }
      if (!batch.empty()) {
        py::gil_scoped_acquire gil;
        for (auto& [level, message] : batch) {
          try {
            logger_.attr("log")(level, message);
          } catch (py::error_already_set& e) {
            e.discard_as_unraisable("sluice logging");
          }
        }
      }
      if (!running) return;
    }
  }

  absl::Mutex mu_;
  std::deque<std::pair<int, std::string>> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
  py::object logger_;  // used with the GIL only
};

class PythonLoggingSink final : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (Forwarder::Get().Push(PythonLevel(msg.level),
                              std::string(msg.payload.data(), msg.payload.size()))) {
      return;
    }
    spdlog::memory_buf_t out;
    formatter_->format(msg, out);
    std::fwrite(out.data(), 1, out.size(), stderr);
  }
  void flush_() override { std::fflush(stderr); }
};

}  // namespace

void DefineLogging(py::module_& m) {
  // The default logger is replaced once, at import, and never again: a
  // thread may be using it at any time later.
  auto logger = std::make_shared<spdlog::logger>("sluice", std::make_shared<PythonLoggingSink>());
  logger->set_level(spdlog::get_level());
  spdlog::set_default_logger(std::move(logger));
  Forwarder::Get().Start();
  py::module_::import("atexit").attr("register")(
      py::cpp_function([] { Forwarder::Get().Stop(); }));
}

}  // namespace sluice::python
