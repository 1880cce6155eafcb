// Starts an in-process dispatcher and workers on loopback, for examples
// and single-machine users. Production runs sluice-dispatcher and
// sluice-worker processes instead.
#pragma once

#include <cstdio>
#include <memory>
#include <vector>

#include <sluice/sluice.h>

namespace sluice_examples {

struct EmbeddedService {
  std::unique_ptr<sluice::DispatchServer> dispatcher;
  std::vector<std::unique_ptr<sluice::WorkerServer>> workers;

  // Returns false (after printing why) if anything fails to start.
  bool Start(int num_workers) {
    sluice::InitLoggingFromEnv();
    auto d = sluice::DispatchServer::Start({});
    if (!d.ok()) {
      std::fprintf(stderr, "dispatcher: %s\n", d.status().ToString().c_str());
      return false;
    }
    dispatcher = *std::move(d);
    for (int i = 0; i < num_workers; ++i) {
      sluice::WorkerConfig wc;
      wc.dispatcher_address = dispatcher->address();
      auto w = sluice::WorkerServer::Start(wc);
      if (!w.ok()) {
        std::fprintf(stderr, "worker: %s\n", w.status().ToString().c_str());
        return false;
      }
      workers.push_back(*std::move(w));
    }
    std::printf("service: dispatcher %s with %d worker(s)\n", dispatcher->target().c_str(),
                num_workers);
    return true;
  }

  ~EmbeddedService() {
    for (auto& w : workers) w->Stop();
    if (dispatcher) dispatcher->Stop();
  }
};

// Reads `it` to its end as int64 scalars; false (after printing) on error.
inline bool DrainInt64(sluice::Iterator& it, std::vector<int64_t>* out) {
  while (true) {
    auto e = it.Next();
    if (!e.ok()) {
      std::fprintf(stderr, "error: %s\n", e.status().ToString().c_str());
      return false;
    }
    if (!e->has_value()) return true;
    out->push_back((**e)[0].at<int64_t>(0));
  }
}

// One pass over `ds` as int64 scalars; false (after printing) on error.
inline bool DrainInt64(const sluice::Dataset& ds, std::vector<int64_t>* out) {
  auto it = ds.MakeIterator();
  if (!it.ok()) {
    std::fprintf(stderr, "error: %s\n", it.status().ToString().c_str());
    return false;
  }
  return DrainInt64(**it, out);
}

inline std::string Sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  std::string s;
  for (int64_t x : v) s += std::to_string(x) + " ";
  return s;
}

}  // namespace sluice_examples
