// The CUDA runtime, loaded at run time when present (dlopen of libcudart):
// sluice builds and runs without CUDA, and uses it only to page-lock
// (cudaHostRegister) the client's receive arenas, so that copies from them
// to a GPU run at the link rate instead of through the driver's staging
// buffers. Internal.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace sluice::internal {

// The entry points sluice uses (cudaError_t is an int; 0 is success).
struct CudaRuntime {
  int (*get_device_count)(int* count) = nullptr;
  int (*host_register)(void* ptr, size_t bytes, unsigned int flags) = nullptr;
  int (*host_unregister)(void* ptr) = nullptr;
  const char* (*get_error_string)(int error) = nullptr;
  // cudaMemcpyAsync(dst, src, bytes, kind, stream), cudaLaunchHostFunc,
  // cudaStreamSynchronize (streams are opaque cudaStream_t).
  int (*memcpy_async)(void* dst, const void* src, size_t bytes, int kind, void* stream) = nullptr;
  int (*launch_host_func)(void* stream, void (*fn)(void*), void* arg) = nullptr;
  int (*stream_synchronize)(void* stream) = nullptr;
  std::string library;  // where it was loaded from
};
inline constexpr unsigned int kCudaHostRegisterPortable = 1;  // cudaHostRegisterPortable
inline constexpr int kCudaMemcpyHostToDevice = 1;             // cudaMemcpyHostToDevice

// The process's runtime, loaded once: $SLUICE_CUDART if set, else
// libcudart.so (and its versioned names) from the loader's path, else
// /usr/local/cuda/lib64. NotFound saying what was tried when none loads.
absl::StatusOr<const CudaRuntime*> LoadCudaRuntime();

// Tests: LoadCudaRuntime() returns `runtime` (not owned; null: NotFound).
void SetCudaRuntimeForTesting(const CudaRuntime* runtime);

// The runtime, if it reports at least one device; FailedPrecondition
// saying why not otherwise.
absl::StatusOr<const CudaRuntime*> UsableCudaRuntime();

}  // namespace sluice::internal
