// Output helpers of sluice-perf: sizes, one-line JSON objects, the machine
// description, the progress line and gnuplot.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sluice::perf {

// "64", "4K"/"4KiB", "1M", "16MiB", "1G" (binary multiples).
absl::StatusOr<int64_t> ParseSize(const std::string& text);
// "64 B", "4 KiB", "16 MiB".
std::string SizeLabel(int64_t bytes);

// Builds one JSON object on one line: {"k":v,...}. Non-finite numbers are null.
class JsonObject {
 public:
  JsonObject& Add(const std::string& key, const std::string& value);
  JsonObject& Add(const std::string& key, const char* value) { return Add(key, std::string(value)); }
  JsonObject& Add(const std::string& key, double value);
  JsonObject& Add(const std::string& key, int64_t value);
  JsonObject& Add(const std::string& key, int value) { return Add(key, int64_t{value}); }
  JsonObject& Add(const std::string& key, bool value);
  // `json` is already-formatted JSON (an object or an array).
  JsonObject& AddRaw(const std::string& key, const std::string& json);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  void Key(const std::string& key);
  std::string body_;
};
std::string JsonQuote(const std::string& s);
// "[\n  a,\n  b\n]" with one element per line.
std::string JsonArrayLines(const std::vector<std::string>& elements, const std::string& indent);

// This machine, for the report header and the JSON.
struct MachineInfo {
  int nproc = 0;
  std::string cpu_model;
  double mem_gib = 0;
  std::string kernel;
  std::string ucx_version;  // from `ucx_info -v`, or "unknown"
  // /proc/loadavg's 1-minute figure when described: other processes
  // competing for the cpus perturb every figure.
  double load_average_1m = 0;
  std::string Describe() const;
  std::string Json() const;
};
MachineInfo DescribeMachine();
// /proc/loadavg's 1-minute figure (-1 when unreadable).
double LoadAverage1m();

// The absolute path of `name` on $PATH, or "" when absent.
std::string FindOnPath(const std::string& name);
// Runs `command` through /bin/sh and returns its stdout (first `max` bytes).
std::string CaptureCommand(const std::string& command, size_t max = 1 << 16);

// A progress line on stderr: "\r"-updated when stderr is a terminal, one
// line per step otherwise.
class Progress {
 public:
  Progress(std::string what, int total_steps);
  ~Progress();  // ends the line
  void Step(const std::string& text);
  // Reports the total time and ends the line.
  void Finish();

 private:
  std::string what_;
  int total_;
  int done_ = 0;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
};

// gnuplot lines that select a PNG terminal (pngcairo, else png) of this
// size writing to `png`.
std::string GnuplotPngHeader(const std::string& png, int width, int height);

// Writes `script` next to `png` and runs gnuplot on it. A note (not an
// error) when gnuplot is missing.
absl::Status RunGnuplot(const std::string& script, const std::string& png, std::string* note);

}  // namespace sluice::perf
