#include "sluice/dataplane/cuda_runtime.h"

#include <dlfcn.h>

#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "sluice/core/status.h"
#include "sluice/core/tensor.h"

namespace sluice::internal {
namespace {

absl::Mutex g_mu;
bool g_testing ABSL_GUARDED_BY(g_mu) = false;
const CudaRuntime* g_test_runtime ABSL_GUARDED_BY(g_mu) = nullptr;

absl::StatusOr<const CudaRuntime*> Load() {
  std::vector<std::string> names;
  if (const char* env = std::getenv("SLUICE_CUDART"); env != nullptr && *env != '\0') {
    names.push_back(env);
  } else {
    names = {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
             "/usr/local/cuda/lib64/libcudart.so"};
  }
  std::vector<std::string> errors;
  for (const std::string& name : names) {
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* e = dlerror();
      errors.push_back(e != nullptr ? e : name);
      continue;
    }
    auto* rt = new CudaRuntime();  // lives for the process, as the library
    rt->get_device_count = reinterpret_cast<int (*)(int*)>(dlsym(h, "cudaGetDeviceCount"));
    rt->host_register =
        reinterpret_cast<int (*)(void*, size_t, unsigned int)>(dlsym(h, "cudaHostRegister"));
    rt->host_unregister = reinterpret_cast<int (*)(void*)>(dlsym(h, "cudaHostUnregister"));
    rt->get_error_string =
        reinterpret_cast<const char* (*)(int)>(dlsym(h, "cudaGetErrorString"));
    rt->memcpy_async = reinterpret_cast<int (*)(void*, const void*, size_t, int, void*)>(
        dlsym(h, "cudaMemcpyAsync"));
    rt->launch_host_func = reinterpret_cast<int (*)(void*, void (*)(void*), void*)>(
        dlsym(h, "cudaLaunchHostFunc"));
    rt->stream_synchronize = reinterpret_cast<int (*)(void*)>(dlsym(h, "cudaStreamSynchronize"));
    rt->library = name;
    if (rt->get_device_count == nullptr || rt->host_register == nullptr ||
        rt->host_unregister == nullptr || rt->get_error_string == nullptr ||
        rt->memcpy_async == nullptr || rt->launch_host_func == nullptr ||
        rt->stream_synchronize == nullptr) {
      errors.push_back(absl::StrCat(name, ": not a CUDA runtime (a cuda* symbol is missing)"));
      delete rt;
      dlclose(h);
      continue;
    }
    return rt;
  }
  return absl::NotFoundError(absl::StrCat("no CUDA runtime could be loaded (",
                                          absl::StrJoin(errors, "; "),
                                          "); set SLUICE_CUDART to libcudart's path"));
}

}  // namespace

absl::StatusOr<const CudaRuntime*> LoadCudaRuntime() {
  {
    absl::MutexLock l(&g_mu);
    if (g_testing) {
      if (g_test_runtime == nullptr) return absl::NotFoundError("no CUDA runtime (test)");
      return g_test_runtime;
    }
  }
  static const absl::StatusOr<const CudaRuntime*>* loaded =
      new absl::StatusOr<const CudaRuntime*>(Load());
  return *loaded;
}

void SetCudaRuntimeForTesting(const CudaRuntime* runtime) {
  absl::MutexLock l(&g_mu);
  g_testing = true;
  g_test_runtime = runtime;
}

absl::StatusOr<const CudaRuntime*> UsableCudaRuntime() {
  auto rt = LoadCudaRuntime();
  if (!rt.ok()) return absl::FailedPreconditionError(rt.status().message());
  int count = 0;
  const int err = (*rt)->get_device_count(&count);
  if (err != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the CUDA runtime (", (*rt)->library, ") finds no usable GPU: ",
                     (*rt)->get_error_string(err), " (cudaError ", err, ")"));
  }
  if (count <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the CUDA runtime (", (*rt)->library, ") reports no GPU"));
  }
  return *rt;
}

}  // namespace sluice::internal

namespace sluice {

absl::Status CopyToDeviceAsync(const Tensor& tensor, void* device_dst, void* stream) {
  if (tensor.dtype() == DType::kString) {
    return absl::InvalidArgumentError("CopyToDeviceAsync: a string tensor has no device layout");
  }
  SLUICE_ASSIGN_OR_RETURN(const internal::CudaRuntime* rt, internal::UsableCudaRuntime());
  const size_t bytes = tensor.byte_size();
  if (bytes == 0) return absl::OkStatus();
  int err = rt->memcpy_async(device_dst, tensor.data(), bytes, internal::kCudaMemcpyHostToDevice,
                             stream);
  if (err != 0) {
    return absl::InternalError(absl::StrCat("cudaMemcpyAsync of ", bytes, " bytes: ",
                                            rt->get_error_string(err), " (cudaError ", err, ")"));
  }
  // The tensor (and so its arena slot) lives until the stream reaches this
  // point, after the copy: then a CUDA thread drops it. No CUDA call there.
  auto* keep = new Tensor(tensor);
  err = rt->launch_host_func(
      stream, [](void* arg) { delete static_cast<Tensor*>(arg); }, keep);
  if (err != 0) {
    // Could not enqueue the release: wait for the copy instead.
    const int sync = rt->stream_synchronize(stream);
    delete keep;
    if (sync != 0) {
      return absl::InternalError(absl::StrCat("cudaStreamSynchronize: ",
                                              rt->get_error_string(sync), " (cudaError ", sync,
                                              ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace sluice
