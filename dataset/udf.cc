#include "sluice/dataset/udf.h"

#include <dlfcn.h>
#include <stdlib.h>

#include <map>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"

namespace sluice {
namespace {

struct Registry {
  absl::Mutex mu;
  // Entries never move or die once registered.
  std::map<std::string, std::unique_ptr<UdfEntry>> udfs ABSL_GUARDED_BY(mu);
  // Serializes LoadPlugin.
  absl::Mutex load_mu;
  std::set<std::string> loaded_paths ABSL_GUARDED_BY(load_mu);
};

// Set by LoadPlugin around dlopen: a plugin's registrations run inside
// dlopen on the loading thread, and their errors are collected here.
thread_local std::vector<std::string>* t_plugin_load_errors = nullptr;

Registry& GetRegistry() {
  static Registry* r = new Registry();  // never destroyed: UDFs may run at exit
  return *r;
}

}  // namespace

absl::Status RegisterUdf(std::string name, UdfSignature signature, UdfFn fn) {
  if (name.empty()) return absl::InvalidArgumentError("a UDF needs a non-empty name");
  if (!fn) return absl::InvalidArgumentError(absl::StrCat("UDF '", name, "' has no function"));
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  if (r.udfs.count(name)) {
    return absl::AlreadyExistsError(absl::StrCat("UDF '", name, "' is already registered"));
  }
  auto entry = std::make_unique<UdfEntry>();
  entry->name = name;
  entry->signature = std::move(signature);
  entry->fn = std::move(fn);
  r.udfs.emplace(std::move(name), std::move(entry));
  return absl::OkStatus();
}

absl::StatusOr<const UdfEntry*> FindUdf(const std::string& name) {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  auto it = r.udfs.find(name);
  if (it == r.udfs.end()) {
    std::vector<std::string> names;
    for (const auto& [n, e] : r.udfs) names.push_back(n);
    return absl::NotFoundError(absl::StrCat(
        "unknown function '", name, "'; register it with SLUICE_REGISTER_UDF and load its plugin",
        names.empty() ? std::string(" (no UDFs are registered)")
                      : absl::StrCat(" (registered: ", absl::StrJoin(names, ", "), ")")));
  }
  return it->second.get();
}

std::vector<std::string> RegisteredUdfNames() {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  std::vector<std::string> names;
  for (const auto& [n, e] : r.udfs) names.push_back(n);
  return names;
}

UdfRegistrar::UdfRegistrar(const char* name, UdfSignature signature, UdfFn fn) {
  absl::Status s = RegisterUdf(name, std::move(signature), std::move(fn));
  if (s.ok()) return;
  if (t_plugin_load_errors != nullptr) {
    t_plugin_load_errors->push_back(std::string(s.message()));
  } else {
    spdlog::error("sluice: {}", std::string(s.message()));
  }
}

absl::Status LoadPlugin(const std::string& path) {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.load_mu);
  char* resolved = realpath(path.c_str(), nullptr);
  if (resolved == nullptr) {
    return absl::NotFoundError(absl::StrCat("plugin '", path, "' does not exist"));
  }
  std::string canonical(resolved);
  free(resolved);
  if (r.loaded_paths.count(canonical)) return absl::OkStatus();
  std::vector<std::string> errors;
  t_plugin_load_errors = &errors;
  void* handle = dlopen(canonical.c_str(), RTLD_NOW | RTLD_LOCAL);
  t_plugin_load_errors = nullptr;
  if (handle == nullptr) {
    const char* err = dlerror();
    return absl::InvalidArgumentError(absl::StrCat("cannot load plugin '", path,
                                                   "': ", err ? err : "unknown dlopen error"));
  }
  // The handle is kept open for the life of the process: registered UDFs
  // point into it.
  r.loaded_paths.insert(canonical);
  if (!errors.empty()) {
    return absl::AlreadyExistsError(absl::StrCat("plugin '", path, "': ",
                                                 absl::StrJoin(errors, "; ")));
  }
  spdlog::info("sluice: loaded plugin {}", canonical);
  return absl::OkStatus();
}

}  // namespace sluice
