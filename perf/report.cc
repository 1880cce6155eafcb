#include "perf/report.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "perf/child_process.h"

namespace sluice::perf {

absl::StatusOr<int64_t> ParseSize(const std::string& text) {
  std::string t = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(text));
  absl::string_view v(t);
  absl::ConsumeSuffix(&v, "B");
  absl::ConsumeSuffix(&v, "I");
  int64_t mult = 1;
  if (absl::ConsumeSuffix(&v, "K")) mult = int64_t{1} << 10;
  else if (absl::ConsumeSuffix(&v, "M")) mult = int64_t{1} << 20;
  else if (absl::ConsumeSuffix(&v, "G")) mult = int64_t{1} << 30;
  int64_t n = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(v), &n) || n <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad size '", text, "': use a positive count of bytes like 64, 4K, 16MiB"));
  }
  return n * mult;
}

std::string SizeLabel(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30) && bytes % (int64_t{1} << 30) == 0) {
    return absl::StrCat(bytes >> 30, " GiB");
  }
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return absl::StrCat(bytes >> 20, " MiB");
  if (bytes >= (1 << 10) && bytes % (1 << 10) == 0) return absl::StrCat(bytes >> 10, " KiB");
  return absl::StrCat(bytes, " B");
}

std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

void JsonObject::Key(const std::string& key) {
  if (!body_.empty()) body_ += ",";
  body_ += JsonQuote(key) + ":";
}
JsonObject& JsonObject::Add(const std::string& key, const std::string& value) {
  Key(key);
  body_ += JsonQuote(value);
  return *this;
}
JsonObject& JsonObject::Add(const std::string& key, double value) {
  Key(key);
  body_ += std::isfinite(value) ? absl::StrFormat("%.6g", value) : "null";
  return *this;
}
JsonObject& JsonObject::Add(const std::string& key, int64_t value) {
  Key(key);
  body_ += absl::StrCat(value);
  return *this;
}
JsonObject& JsonObject::Add(const std::string& key, bool value) {
  Key(key);
  body_ += value ? "true" : "false";
  return *this;
}
JsonObject& JsonObject::AddRaw(const std::string& key, const std::string& json) {
  Key(key);
  body_ += json;
  return *this;
}

std::string JsonArrayLines(const std::vector<std::string>& elements, const std::string& indent) {
  if (elements.empty()) return "[]";
  std::string out = "[\n";
  for (size_t i = 0; i < elements.size(); ++i) {
    absl::StrAppend(&out, indent, "  ", elements[i], i + 1 < elements.size() ? ",\n" : "\n");
  }
  return out + indent + "]";
}

std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
    std::string p = absl::StrCat(dir, "/", name);
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

std::string CaptureCommand(const std::string& command, size_t max) {
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(command.c_str(), "r"), pclose);
  if (p == nullptr) return "";
  std::string out;
  char buf[4096];
  size_t n;
  while (out.size() < max && (n = fread(buf, 1, sizeof(buf), p.get())) > 0) out.append(buf, n);
  return out;
}

double LoadAverage1m() {
  std::vector<std::string> fields = absl::StrSplit(ReadWholeFile("/proc/loadavg"), ' ');
  double v = 0;
  return !fields.empty() && absl::SimpleAtod(fields[0], &v) ? v : -1;
}

MachineInfo DescribeMachine() {
  MachineInfo m;
  m.nproc = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  for (absl::string_view line : absl::StrSplit(ReadWholeFile("/proc/cpuinfo"), '\n')) {
    if (absl::ConsumePrefix(&line, "model name")) {
      m.cpu_model = std::string(absl::StripAsciiWhitespace(absl::StripPrefix(
          absl::StripAsciiWhitespace(line), ":")));
      break;
    }
  }
  for (absl::string_view line : absl::StrSplit(ReadWholeFile("/proc/meminfo"), '\n')) {
    int64_t kib = 0;
    if (absl::ConsumePrefix(&line, "MemTotal:") &&
        absl::SimpleAtoi(absl::StripSuffix(absl::StripAsciiWhitespace(line), " kB"), &kib)) {
      m.mem_gib = static_cast<double>(kib) / (1 << 20);
    }
  }
  m.load_average_1m = LoadAverage1m();
  utsname u{};
  if (uname(&u) == 0) m.kernel = absl::StrCat(u.sysname, " ", u.release, " ", u.machine);
  m.ucx_version = "unknown";
  if (!FindOnPath("ucx_info").empty()) {
    std::string v = CaptureCommand("ucx_info -v 2>/dev/null", 4096);
    std::vector<std::string> lines = absl::StrSplit(v, '\n');
    if (!lines.empty()) {
      absl::string_view first = absl::StripAsciiWhitespace(lines[0]);
      absl::ConsumePrefix(&first, "# Version ");
      if (!first.empty()) m.ucx_version = std::string(first);
    }
  }
  return m;
}

std::string MachineInfo::Describe() const {
  return absl::StrFormat("%d cpus (%s), %.1f GiB RAM, %s, UCX %s; load average %.2f at start",
                         nproc, cpu_model, mem_gib, kernel, ucx_version, load_average_1m);
}

std::string MachineInfo::Json() const {
  return JsonObject()
      .Add("nproc", nproc)
      .Add("cpu_model", cpu_model)
      .Add("mem_gib", mem_gib)
      .Add("kernel", kernel)
      .Add("ucx_version", ucx_version)
      .Add("load_average_1m_at_start", load_average_1m)
      .str();
}

Progress::Progress(std::string what, int total_steps)
    : what_(std::move(what)), total_(total_steps), tty_(isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() {
  if (tty_ && done_ > 0) std::fprintf(stderr, "\n");
}

void Progress::Finish() {
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::fprintf(stderr, "%s[%s] done: %d steps in %.1fs\n", tty_ ? "\r\033[K" : "", what_.c_str(),
               done_, s);
  done_ = 0;  // the line is ended
}

void Progress::Step(const std::string& text) {
  ++done_;
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::fprintf(stderr, "%s[%s %d/%d %5.1fs] %s%s", tty_ ? "\r\033[K" : "", what_.c_str(), done_,
               total_, s, text.c_str(), tty_ ? "" : "\n");
  std::fflush(stderr);
}

std::string GnuplotPngHeader(const std::string& png, int width, int height) {
  return absl::StrFormat(
      "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) "
      "{ set terminal pngcairo size %d,%d noenhanced } "
      "else { set terminal png size %d,%d noenhanced }\nset output %s\n",
      width, height, width, height, JsonQuote(png));
}

absl::Status RunGnuplot(const std::string& script, const std::string& png, std::string* note) {
  const std::string gnuplot = FindOnPath("gnuplot");
  if (gnuplot.empty()) {
    *note = absl::StrCat("gnuplot is not installed: no plot written to ", png,
                         " (apt-get install gnuplot-nox)");
    return absl::OkStatus();
  }
  const std::string path = png + ".gp";
  {
    std::ofstream f(path);
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", path));
    f << script;
  }
  std::string out = CaptureCommand(absl::StrCat("'", gnuplot, "' '", path, "' 2>&1; echo rc=$?"));
  if (out.find("rc=0") == std::string::npos) {
    return absl::InternalError(absl::StrCat("gnuplot failed on ", path, ": ", out));
  }
  *note = absl::StrCat("plot: ", png, " (gnuplot script ", path, ")");
  return absl::OkStatus();
}

}  // namespace sluice::perf
