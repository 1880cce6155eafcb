// sluice._sluice: the Python binding of the sluice client, dataset builder
// and in-process service (docs/python.md).
//
// Ownership and threads:
//  - Element tensors reach Python without a copy. A numpy array's base is a
//    capsule (or the sluice.Tensor it came from) that owns a copy of the
//    sluice::Tensor handle, so the tensor's shared storage (a slot of the
//    UCX receive pool, a decoded image, a FromTensors constant) stays alive
//    while any view exists. Arrays are read-only: the storage may be shared
//    with the pipeline.
//  - DLPack capsules ("dltensor") own a heap DLPackHolder with another copy
//    of the handle; its deleter needs no GIL, so a consumer may call it on
//    any thread.
//  - Calls that can block (Iterator::Next, MakeIterator, RegisterDataset,
//    server Start/Stop, iterator destruction) run with the GIL released.
//    Iterator::Next is not thread-safe, so PyIterator serializes callers
//    with its own mutex, taken after the GIL is released (never the other
//    order, so two Python threads cannot deadlock on it).
//  - Status -> exception conversion happens in one place, ThrowStatus().
//  - Log messages go to Python's logging (logging_bridge.cc).
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <array>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "sluice/client/distribute.h"
#include "sluice/control/dispatch_server.h"
#include "sluice/core/dtype.h"
#include "sluice/core/interrupt.h"
#include "sluice/core/logging.h"
#include "sluice/core/tensor.h"
#include "sluice/dataplane/element_transport.h"
#include "sluice/dataset/dataset.h"
#include "sluice/dataset/element_spec.h"
#include "sluice/dataset/expr.h"
#include "sluice/dataset/image.h"
#include "sluice/dataset/thread_pool.h"
#include "sluice/dataset/udf.h"
#include "sluice/worker/worker_server.h"
#include "python/module_internal.h"

namespace py = pybind11;

namespace sluice::python {
namespace {

// ---------------------------------------------------------------------------
// Errors: the one mapping from absl::Status to Python exceptions.
// ---------------------------------------------------------------------------

// sluice.NotFoundError: a FileNotFoundError (a missing file or glob match)
// that is also a LookupError (an unknown dataset id, job or UDF).
PyObject* g_not_found_error = nullptr;

PyObject* ExceptionTypeFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument: return PyExc_ValueError;
    case absl::StatusCode::kNotFound: return g_not_found_error;
    case absl::StatusCode::kOutOfRange: return PyExc_IndexError;
    case absl::StatusCode::kDeadlineExceeded: return PyExc_TimeoutError;
    case absl::StatusCode::kUnavailable: return PyExc_ConnectionError;
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated: return PyExc_PermissionError;
    case absl::StatusCode::kResourceExhausted: return PyExc_MemoryError;
    case absl::StatusCode::kUnimplemented: return PyExc_NotImplementedError;
    default: return PyExc_RuntimeError;
  }
}

// Raises the exception for `status` (which must not be OK) with its message.
// Call with the GIL held.
[[noreturn]] void ThrowStatus(const absl::Status& status) {
  PyErr_SetString(ExceptionTypeFor(status.code()), std::string(status.message()).c_str());
  throw py::error_already_set();
}

void Check(const absl::Status& status) {
  if (!status.ok()) ThrowStatus(status);
}

template <typename T>
T Check(absl::StatusOr<T> v) {
  if (!v.ok()) ThrowStatus(v.status());
  return *std::move(v);
}

// Builder steps never fail in C++; they carry the first error in status().
// Python raises it at the step that caused it.
Dataset Checked(Dataset ds) {
  Check(ds.status());
  return ds;
}

// ---------------------------------------------------------------------------
// dtypes
// ---------------------------------------------------------------------------

// The numpy dtype of a numeric or bool sluice dtype. bfloat16 has no numpy
// dtype: its bits come out as uint16 (docs/python.md, Limitations).
py::dtype NumpyDType(DType d) {
  // Built once; never destroyed (they would outlive the interpreter).
  static auto* cache = new std::array<py::object, 16>();
  auto& slot = (*cache)[static_cast<size_t>(d)];
  if (!slot) {
    const char* name = d == DType::kBFloat16 ? "uint16" : DTypeName(d);
    slot = py::module_::import("numpy").attr("dtype")(name);
  }
  return py::reinterpret_borrow<py::dtype>(slot);
}

// A dtype given as a numpy dtype, a numpy scalar type, a Python type
// (int, float, bool) or a name ("float32", "bfloat16", "string").
DType DTypeFromPy(py::handle h) {
  if (py::isinstance<py::str>(h)) {
    std::string name = h.cast<std::string>();
    if (name == "str" || name == "bytes") name = "string";
    return Check(DTypeFromName(name));
  }
  py::object np_dtype = py::module_::import("numpy").attr("dtype")(h);
  std::string kind = np_dtype.attr("kind").cast<std::string>();
  if (kind == "S" || kind == "U" || kind == "O") return DType::kString;
  return Check(DTypeFromName(np_dtype.attr("name").cast<std::string>()));
}

// ---------------------------------------------------------------------------
// Tensors: Python -> sluice (copies), sluice -> Python (views)
// ---------------------------------------------------------------------------

// Copies a numpy array, Python scalar, bytes/str or nested list into a
// Tensor. Strings (bytes, str as UTF-8, numpy S/U/object arrays) become
// string tensors.
Tensor TensorFromPy(py::handle obj) {
  if (py::isinstance<Tensor>(obj)) return obj.cast<Tensor>();
  py::module_ np = py::module_::import("numpy");
  if (py::isinstance<py::bytes>(obj) || py::isinstance<py::str>(obj)) {
    return Tensor::String(obj.cast<std::string>());
  }
  // asarray keeps a 0-d array (a scalar) 0-d; ascontiguousarray would make it [1].
  py::array arr = np.attr("asarray")(obj, py::arg("order") = "C");
  std::vector<int64_t> dims(arr.shape(), arr.shape() + arr.ndim());
  std::string kind = arr.dtype().attr("kind").cast<std::string>();
  if (kind == "S" || kind == "U" || kind == "O") {
    std::vector<std::string> values;
    for (py::handle item : arr.attr("ravel")().attr("tolist")()) {
      if (!py::isinstance<py::bytes>(item) && !py::isinstance<py::str>(item)) {
        throw py::type_error("from_tensors: a string array holds a " +
                             std::string(py::str(item.get_type().attr("__name__"))) +
                             "; expected bytes or str");
      }
      values.push_back(item.cast<std::string>());
    }
    return Check(Tensor::Strings(values, TensorShape(dims)));
  }
  DType dtype = DTypeFromPy(arr.dtype());
  Tensor t = Check(Tensor::Allocate(dtype, TensorShape(dims)));
  if (t.byte_size() != static_cast<size_t>(arr.nbytes())) {
    throw py::value_error("from_tensors: size mismatch converting a numpy array");
  }
  if (t.byte_size() > 0) std::memcpy(t.mutable_data(), arr.data(), t.byte_size());
  return t;
}

// Nested lists of bytes for a string tensor of rank >= 1; bytes for a scalar.
py::object StringsToPy(const Tensor& t) {
  const auto& dims = t.shape().dims();
  if (dims.empty()) return py::bytes(std::string(t.str(0)));
  int64_t next = 0;
  std::function<py::list(size_t)> build = [&](size_t axis) {
    py::list out;
    for (int64_t i = 0; i < dims[axis]; ++i) {
      if (axis + 1 == dims.size()) {
        std::string_view s = t.str(next++);
        out.append(py::bytes(s.data(), s.size()));
      } else {
        out.append(build(axis + 1));
      }
    }
    return out;
  };
  return build(0);
}

// A read-only numpy view of `t`. `base` keeps the storage alive: the
// sluice.Tensor the view came from, or (when null) a new capsule owning a
// copy of the handle. String tensors are copied into bytes objects.
py::object TensorToNumpy(const Tensor& t, py::handle base = py::handle()) {
  if (t.dtype() == DType::kString) return StringsToPy(t);
  py::dtype dt = NumpyDType(t.dtype());
  const auto& dims = t.shape().dims();
  std::vector<py::ssize_t> shape(dims.begin(), dims.end());
  std::vector<py::ssize_t> strides(dims.size());
  py::ssize_t stride = static_cast<py::ssize_t>(DTypeSize(t.dtype()));
  for (size_t i = dims.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  py::object owner;
  if (base) {
    owner = py::reinterpret_borrow<py::object>(base);
  } else {
    owner = py::capsule(new Tensor(t), [](void* p) { delete static_cast<Tensor*>(p); });
  }
  py::array arr(dt, shape, strides, t.data(), owner);
  arr.attr("setflags")(py::arg("write") = false);
  return arr;
}

// ---- DLPack (v0.6/0.7 ABI, defined here as the header prescribes) ----
struct DLDevice {
  int32_t device_type;  // kDLCPU = 1
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
static_assert(sizeof(DLDevice) == 8 && sizeof(DLDataType) == 4);
static_assert(sizeof(DLTensor) == 48 && sizeof(DLManagedTensor) == 64);
constexpr int32_t kDLCPU = 1;

// Owns what a DLManagedTensor points to. Deleted by the consumer (any
// thread, no GIL needed) or by the capsule when no consumer took it.
struct DLPackHolder {
  Tensor tensor;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DLManagedTensor managed;
};

DLDataType DLPackDType(DType d) {
  const uint8_t bits = static_cast<uint8_t>(8 * DTypeSize(d));
  if (d == DType::kBool) return {1, 8, 1};  // torch 1.13 has no kDLBool: uint8, viewed as bool
  if (d == DType::kBFloat16) return {4, 16, 1};
  if (IsSignedInteger(d)) return {0, bits, 1};
  if (IsInteger(d)) return {1, bits, 1};
  if (IsFloat(d)) return {2, bits, 1};
  throw py::type_error(std::string("DLPack cannot carry a ") + DTypeName(d) +
                       " tensor; use numpy() (strings become bytes)");
}

// A "dltensor" capsule viewing `t` (no copy).
py::capsule ToDLPack(const Tensor& t) {
  DLDataType dtype = DLPackDType(t.dtype());
  auto* h = new DLPackHolder{t, t.shape().dims(), {}, {}};
  h->strides.resize(h->shape.size());
  int64_t stride = 1;
  for (size_t i = h->shape.size(); i-- > 0;) {
    h->strides[i] = stride;
    stride *= h->shape[i];
  }
  DLTensor& dl = h->managed.dl_tensor;
  dl.data = const_cast<uint8_t*>(t.data());
  dl.device = {kDLCPU, 0};
  dl.ndim = static_cast<int32_t>(h->shape.size());
  dl.dtype = dtype;
  dl.shape = h->shape.empty() ? nullptr : h->shape.data();
  dl.strides = h->strides.empty() ? nullptr : h->strides.data();
  dl.byte_offset = 0;
  h->managed.manager_ctx = h;
  h->managed.deleter = [](DLManagedTensor* self) {
    delete static_cast<DLPackHolder*>(self->manager_ctx);
  };
  PyObject* cap = PyCapsule_New(&h->managed, "dltensor", [](PyObject* capsule) {
    // A consumer renames the capsule to "used_dltensor" and owns the
    // tensor; otherwise it is still ours to free.
    if (PyCapsule_IsValid(capsule, "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
      if (m != nullptr && m->deleter != nullptr) m->deleter(m);
    }
  });
  if (cap == nullptr) {
    delete h;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(cap);
}

// ---------------------------------------------------------------------------
// Elements
// ---------------------------------------------------------------------------

enum class Output : uint8_t { kNumpy, kTensor };

// One component: the component itself; several (or none): a tuple.
py::object ElementToPy(const Element& e, Output output) {
  auto one = [&](const Tensor& t) -> py::object {
    return output == Output::kNumpy ? TensorToNumpy(t) : py::cast(t);
  };
  if (e.size() == 1) return one(e[0]);
  py::tuple out(e.size());
  for (size_t i = 0; i < e.size(); ++i) out[i] = one(e[i]);
  return out;
}

// An element given as one array-like, or a tuple of them.
Element ElementFromPy(py::handle obj) {
  Element e;
  if (py::isinstance<py::tuple>(obj)) {
    for (py::handle c : obj) e.push_back(TensorFromPy(c));
  } else {
    e.push_back(TensorFromPy(obj));
  }
  return e;
}

py::object SpecToPy(const ElementSpec& spec) {
  if (!spec.known) return py::none();
  if (spec.components.size() == 1) return py::cast(spec.components[0]);
  py::tuple out(spec.components.size());
  for (size_t i = 0; i < spec.components.size(); ++i) out[i] = py::cast(spec.components[i]);
  return out;
}

// ---------------------------------------------------------------------------
// Expressions
// ---------------------------------------------------------------------------

// A Python-side expression: the C++ Expr, plus whether it is `x` itself
// (only `x` may be indexed).
struct PyExpr {
  expr::Expr e;
  bool placeholder = false;
};

// Operands: expressions; Python bool -> bool constant; int -> weak int64;
// float -> weak float64; anything else (numpy scalars and arrays, lists)
// -> a strong constant of its own dtype and shape.
expr::Expr ToExpr(py::handle h) {
  if (py::isinstance<PyExpr>(h)) return h.cast<const PyExpr&>().e;
  if (PyBool_Check(h.ptr())) return expr::BoolConstant(h.ptr() == Py_True);
  if (PyLong_Check(h.ptr())) return expr::WeakConstant(h.cast<int64_t>());
  if (PyFloat_Check(h.ptr())) return expr::WeakConstant(h.cast<double>());
  return expr::Expr::Constant(TensorFromPy(h));
}

PyExpr Wrap(expr::Expr e) { return PyExpr{std::move(e), false}; }

// A Map/Filter function: an expression, a tuple/list of them (tuple
// output), a sluice.Function (udf), or a Python callable, which is called
// once with `x` to build the expression (it is never called per element).
Function ToFunction(py::handle fn) {
  if (py::isinstance<Function>(fn)) return fn.cast<Function>();
  if (py::isinstance<PyExpr>(fn)) return Function(fn.cast<const PyExpr&>().e);
  if (py::isinstance<py::tuple>(fn) || py::isinstance<py::list>(fn)) {
    std::vector<expr::Expr> outputs;
    for (py::handle o : fn) outputs.push_back(ToExpr(o));
    return Function(std::move(outputs));
  }
  if (PyCallable_Check(fn.ptr())) {
    py::object traced = fn(py::cast(PyExpr{expr::Expr::Component(-1), true}));
    if (PyCallable_Check(traced.ptr()) && !py::isinstance<PyExpr>(traced)) {
      throw py::type_error("map/filter: the function returned a callable");
    }
    return ToFunction(traced);
  }
  return Function(ToExpr(fn));
}

// ---------------------------------------------------------------------------
// Keyword arguments -> config structs (DistributeOptions, DispatcherConfig,
// WorkerConfig): one table per struct, fields named as in C++.
// ---------------------------------------------------------------------------

void SetFromPy(std::string& f, py::handle v) { f = v.is_none() ? "" : v.cast<std::string>(); }
void SetFromPy(bool& f, py::handle v) { f = v.cast<bool>(); }
void SetFromPy(int& f, py::handle v) { f = v.cast<int>(); }
void SetFromPy(int64_t& f, py::handle v) { f = v.cast<int64_t>(); }
void SetFromPy(std::optional<int64_t>& f, py::handle v) {
  f = v.is_none() ? std::nullopt : std::optional<int64_t>(v.cast<int64_t>());
}
void SetFromPy(std::vector<std::string>& f, py::handle v) {
  f = v.is_none() ? std::vector<std::string>() : v.cast<std::vector<std::string>>();
}
void SetFromPy(TlsConfig& f, py::handle v) {
  if (v.is_none()) {
    f = TlsConfig();
  } else if (py::isinstance<py::dict>(v)) {
    f = TlsConfig();
    for (auto [key, value] : v.cast<py::dict>()) {
      std::string k = key.cast<std::string>();
      if (k == "cert_file") SetFromPy(f.cert_file, value);
      else if (k == "key_file") SetFromPy(f.key_file, value);
      else if (k == "ca_file") SetFromPy(f.ca_file, value);
      else throw py::type_error("tls: unknown key '" + k + "'; expected cert_file, key_file, ca_file");
    }
  } else {
    f = v.cast<TlsConfig>();
  }
}

template <typename T>
struct Field {
  const char* name;
  std::function<void(T&, py::handle)> set;
};
#define SLUICE_FIELD_(T, name) \
  Field<T> { #name, [](T& o, py::handle v) { SetFromPy(o.name, v); } }

const std::vector<Field<DistributeOptions>>& DistributeFields() {
  using O = DistributeOptions;
  static const auto* f = new std::vector<Field<O>>{
      SLUICE_FIELD_(O, processing_mode), SLUICE_FIELD_(O, service),
      SLUICE_FIELD_(O, job_name), SLUICE_FIELD_(O, max_outstanding_requests),
      SLUICE_FIELD_(O, max_elements_per_reply),
      SLUICE_FIELD_(O, target_workers), SLUICE_FIELD_(O, data_transfer_protocol),
      SLUICE_FIELD_(O, fallback_to_grpc), SLUICE_FIELD_(O, numa_node),
      SLUICE_FIELD_(O, cpu_list), SLUICE_FIELD_(O, gpu_pci_bus_id),
      SLUICE_FIELD_(O, consumer_index), SLUICE_FIELD_(O, num_consumers),
      SLUICE_FIELD_(O, dispatcher_timeout_ms), SLUICE_FIELD_(O, tls),
      SLUICE_FIELD_(O, auth_token), SLUICE_FIELD_(O, max_element_bytes),
      SLUICE_FIELD_(O, stall_warning_ms), SLUICE_FIELD_(O, cuda_pinned),
      SLUICE_FIELD_(O, compression)};
  return *f;
}

const std::vector<Field<DispatcherConfig>>& DispatcherFields() {
  using O = DispatcherConfig;
  static const auto* f = new std::vector<Field<O>>{
      SLUICE_FIELD_(O, port), SLUICE_FIELD_(O, bind_address), SLUICE_FIELD_(O, work_dir),
      SLUICE_FIELD_(O, fault_tolerant_mode), SLUICE_FIELD_(O, worker_addresses),
      SLUICE_FIELD_(O, range_split_elements), SLUICE_FIELD_(O, file_split_files),
      SLUICE_FIELD_(O, job_gc_check_interval_ms),
      SLUICE_FIELD_(O, job_gc_timeout_ms), SLUICE_FIELD_(O, worker_timeout_ms),
      SLUICE_FIELD_(O, client_timeout_ms), SLUICE_FIELD_(O, metrics_port),
      SLUICE_FIELD_(O, tls), SLUICE_FIELD_(O, auth_token),
      SLUICE_FIELD_(O, max_request_bytes), SLUICE_FIELD_(O, max_dataset_def_bytes)};
  return *f;
}

const std::vector<Field<WorkerConfig>>& WorkerFields() {
  using O = WorkerConfig;
  static const auto* f = new std::vector<Field<O>>{
      SLUICE_FIELD_(O, dispatcher_address), SLUICE_FIELD_(O, worker_address),
      SLUICE_FIELD_(O, bind_address), SLUICE_FIELD_(O, port),
      SLUICE_FIELD_(O, data_transfer_protocol), SLUICE_FIELD_(O, data_transfer_address),
      SLUICE_FIELD_(O, heartbeat_interval_ms), SLUICE_FIELD_(O, dispatcher_timeout_ms),
      SLUICE_FIELD_(O, plugins), SLUICE_FIELD_(O, worker_threads),
      SLUICE_FIELD_(O, task_buffer_elements), SLUICE_FIELD_(O, numa_node),
      SLUICE_FIELD_(O, cpu_list), SLUICE_FIELD_(O, metrics_port), SLUICE_FIELD_(O, tls),
      SLUICE_FIELD_(O, auth_token), SLUICE_FIELD_(O, host_id),
      SLUICE_FIELD_(O, max_request_bytes)};
  return *f;
}
#undef SLUICE_FIELD_

// Applies `kwargs` to `out`; an unknown name or a value of the wrong type
// is a TypeError naming the function and the field.
template <typename T>
void ApplyKwargs(const char* what, const std::vector<Field<T>>& fields, const py::kwargs& kwargs,
                 T& out) {
  for (auto item : kwargs) {
    std::string k = py::cast<std::string>(item.first);
    py::handle value = item.second;
    const Field<T>* field = nullptr;
    for (const auto& f : fields) {
      if (k == f.name) field = &f;
    }
    if (field == nullptr) {
      std::string valid;
      for (const auto& f : fields) valid += std::string(valid.empty() ? "" : ", ") + f.name;
      throw py::type_error(std::string(what) + "() got an unexpected keyword argument '" + k +
                           "'; valid: " + valid);
    }
    try {
      field->set(out, value);
    } catch (const py::cast_error&) {
      throw py::type_error(std::string(what) + "(): " + k + " cannot be a " +
                           std::string(py::str(value.get_type().attr("__name__"))));
    }
  }
}

DistributeOptions MakeDistributeOptions(const char* what, const std::string& processing_mode,
                                        const std::string& service, const py::kwargs& kwargs) {
  DistributeOptions o;
  o.processing_mode = processing_mode;
  o.service = service;
  ApplyKwargs(what, DistributeFields(), kwargs, o);
  return o;
}

// ---------------------------------------------------------------------------
// Iterator
// ---------------------------------------------------------------------------

class PyIterator {
 public:
  PyIterator(std::unique_ptr<Iterator> it, Output output) : it_(std::move(it)), output_(output) {}
  ~PyIterator() { Close(); }

  // The next element; StopIteration at the end. The GIL is released while
  // the pipeline (or the service) produces it.
  //
  // Ctrl-C: a wait on the service polls the interpreter's signal handlers
  // (core/interrupt.h) with the GIL taken back for the call; a handler's
  // exception (KeyboardInterrupt) stops the wait and is raised here. The
  // iterator is then done (later calls raise RuntimeError saying so: an op
  // after Distribute may have held part of a batch) and can be closed.
  py::object Next() {
    absl::StatusOr<std::optional<Element>> r;
    bool closed = false;
    bool signalled = false;
    {
      py::gil_scoped_release release;
      absl::MutexLock lock(&mu_);
      if (it_ == nullptr) {
        closed = true;
      } else {
        ScopedInterruptCheck check([&signalled]() -> absl::Status {
          py::gil_scoped_acquire gil;
          if (PyErr_CheckSignals() == 0) return absl::OkStatus();
          signalled = true;  // the handler's exception is set
          return absl::CancelledError(
              "this iterator was interrupted (Ctrl-C) while it waited for an element; "
              "close it and make a new one");
        });
        r = it_->Next();
      }
    }
    if (signalled) throw py::error_already_set();
    if (closed) throw py::stop_iteration();
    if (!r.ok()) ThrowStatus(r.status());
    if (!r->has_value()) throw py::stop_iteration();
    return ElementToPy(**r, output_);
  }

  // The position after the last next(), as bytes (Iterator::Save);
  // Dataset.make_iterator(checkpoint=...) resumes there.
  py::bytes Save() {
    absl::StatusOr<std::string> saved;
    {
      py::gil_scoped_release release;
      absl::MutexLock lock(&mu_);
      if (it_ == nullptr) {
        saved = absl::FailedPreconditionError("save: the iterator is closed");
      } else {
        saved = it_->Save();
      }
    }
    return py::bytes(Check(std::move(saved)));
  }

  // Releases the pipeline (and a service iteration) now; later next()
  // calls raise StopIteration. Views already taken stay valid.
  void Close() {
    std::unique_ptr<Iterator> it;
    {
      py::gil_scoped_release release;
      absl::MutexLock lock(&mu_);
      it = std::move(it_);
      it.reset();  // may join threads and call the dispatcher: no GIL
    }
  }

 private:
  absl::Mutex mu_;
  std::unique_ptr<Iterator> it_ ABSL_GUARDED_BY(mu_);
  const Output output_;
};

std::unique_ptr<PyIterator> MakeIterator(const Dataset& ds, const std::string& output,
                                         py::object checkpoint = py::none()) {
  Output o;
  if (output == "numpy") o = Output::kNumpy;
  else if (output == "tensor") o = Output::kTensor;
  else throw py::value_error("make_iterator: output must be 'numpy' or 'tensor'; got '" + output + "'");
  std::optional<std::string> saved;
  if (!checkpoint.is_none()) saved = py::cast<std::string>(py::bytes(checkpoint));
  absl::StatusOr<std::unique_ptr<Iterator>> it;
  {
    py::gil_scoped_release release;
    it = saved ? ds.MakeIterator(*saved) : ds.MakeIterator();
  }
  return std::make_unique<PyIterator>(Check(std::move(it)), o);
}

// ---------------------------------------------------------------------------
// Servers
// ---------------------------------------------------------------------------

// Holds a started server; stop() (or leaving a `with` block, or garbage
// collection) stops it.
template <typename Server>
struct PyServer {
  std::unique_ptr<Server> server;

  Server& get() {
    if (server == nullptr) throw py::value_error("the server has been stopped");
    return *server;
  }
  void Stop() {
    std::unique_ptr<Server> s = std::move(server);
    if (s == nullptr) return;
    py::gil_scoped_release release;
    s->Stop();
    s.reset();
  }
  ~PyServer() {
    if (server != nullptr) Stop();
  }
};
using PyDispatchServer = PyServer<DispatchServer>;
using PyWorkerServer = PyServer<WorkerServer>;

std::unique_ptr<PyDispatchServer> StartDispatcher(const py::kwargs& kwargs) {
  DispatcherConfig config;
  ApplyKwargs("DispatchServer", DispatcherFields(), kwargs, config);
  absl::StatusOr<std::unique_ptr<DispatchServer>> s;
  {
    py::gil_scoped_release release;
    s = DispatchServer::Start(config);
  }
  auto out = std::make_unique<PyDispatchServer>();
  out->server = Check(std::move(s));
  return out;
}

std::unique_ptr<PyWorkerServer> StartWorker(const py::kwargs& kwargs) {
  WorkerConfig config;
  ApplyKwargs("WorkerServer", WorkerFields(), kwargs, config);
  if (config.dispatcher_address.empty()) {
    throw py::type_error("WorkerServer() needs dispatcher_address (a DispatchServer's .address)");
  }
  absl::StatusOr<std::unique_ptr<WorkerServer>> s;
  {
    py::gil_scoped_release release;
    s = WorkerServer::Start(config);
  }
  auto out = std::make_unique<PyWorkerServer>();
  out->server = Check(std::move(s));
  return out;
}

// ---------------------------------------------------------------------------
// Module
// ---------------------------------------------------------------------------

std::vector<std::string> Extensions(const py::object& v) {
  if (v.is_none()) return image::DefaultImageExtensions();
  return v.cast<std::vector<std::string>>();
}

void DefineExpressions(py::module_& m) {
  py::class_<PyExpr> e(m, "Expr", R"doc(
An expression over the element `x`, built with Python operators:
`x * x + 1`, `x[0].cast("float32")`, `(x > 2) & (x < 8)`. It serializes into
the dataset definition and runs on workers without Python.)doc");
  auto bin = [&](const char* name, int code, bool reflected) {
    if (reflected) {
      e.def(name, [code](const PyExpr& a, py::object b) {
        return Wrap(expr::Binary(code, ToExpr(b), a.e));
      });
    } else {
      e.def(name, [code](const PyExpr& a, py::object b) {
        return Wrap(expr::Binary(code, a.e, ToExpr(b)));
      });
    }
  };
  bin("__add__", 1, false), bin("__radd__", 1, true);
  bin("__sub__", 2, false), bin("__rsub__", 2, true);
  bin("__mul__", 3, false), bin("__rmul__", 3, true);
  bin("__truediv__", 4, false), bin("__rtruediv__", 4, true);
  bin("__mod__", 5, false), bin("__rmod__", 5, true);
  bin("__eq__", 10, false), bin("__ne__", 11, false);
  bin("__lt__", 12, false), bin("__le__", 13, false);
  bin("__gt__", 14, false), bin("__ge__", 15, false);
  bin("__and__", 20, false), bin("__rand__", 20, true);
  bin("__or__", 21, false), bin("__ror__", 21, true);
  e.def("__neg__", [](const PyExpr& a) { return Wrap(expr::Unary(1, a.e)); });
  e.def("__invert__", [](const PyExpr& a) { return Wrap(expr::Unary(2, a.e)); });
  e.def("__abs__", [](const PyExpr& a) { return Wrap(expr::Abs(a.e)); });
  e.def("__floordiv__", [](const PyExpr&, py::object) -> PyExpr {
    throw py::type_error("sluice expressions have no '//': '/' divides (integers truncate "
                         "toward zero, as in C++)");
  });
  e.def("__bool__", [](const PyExpr&) -> bool {
    throw py::type_error("a sluice expression has no truth value: use & | ~ instead of "
                         "and/or/not, and (a < x) & (x < b) instead of a < x < b");
  });
  e.def("__getitem__", [](const PyExpr& a, int index) {
    if (!a.placeholder) throw py::type_error("only x can be indexed: x[i] is component i");
    if (index < 0) throw py::index_error("x[i]: component index must be >= 0");
    return Wrap(expr::Expr::Component(index));
  });
  e.def("cast", [](const PyExpr& a, py::object dtype) {
    return Wrap(expr::Cast(a.e, DTypeFromPy(dtype)));
  }, py::arg("dtype"), "Converts to `dtype` (a numpy dtype, type or name, e.g. 'float32').");
  e.attr("__hash__") = py::none();
  e.def("__repr__", [](const PyExpr& a) {
    return a.placeholder ? std::string("sluice.x") : std::string("<sluice.Expr>");
  });

  m.attr("x") = py::cast(PyExpr{expr::Expr::Component(-1), true});
  m.def("min", [](py::object a, py::object b) { return Wrap(expr::Min(ToExpr(a), ToExpr(b))); },
        "Elementwise minimum (NaN if either is NaN).");
  m.def("max", [](py::object a, py::object b) { return Wrap(expr::Max(ToExpr(a), ToExpr(b))); },
        "Elementwise maximum (NaN if either is NaN).");
  m.def("abs", [](py::object a) { return Wrap(expr::Abs(ToExpr(a))); }, "Elementwise |a|.");
  m.def("constant", [](py::object v) { return Wrap(expr::Expr::Constant(TensorFromPy(v))); },
        "A strong constant: keeps the value's dtype and shape.");

  py::class_<Function>(m, "Function", "A named C++ UDF for map/filter (see sluice.udf).");
  m.def("udf", [](std::string name) { return Function::Udf(std::move(name)); }, py::arg("name"),
        "A registered C++ UDF, by name (plugins: sluice.load_plugin).");
  m.def("load_plugin", [](const std::string& path) { Check(LoadPlugin(path)); }, py::arg("path"));

  py::module_ io = m.def_submodule("io", "File access as expressions.");
  io.def("read_file", [](py::object path) { return Wrap(io::ReadFile(ToExpr(path))); },
         py::arg("path"), "A file's contents (string scalar); `path` is a string scalar.");

  py::module_ img = m.def_submodule("image", "Image decoding and augmentation (image.h).");
  img.def("decode", [](py::object b) { return Wrap(image::Decode(ToExpr(b))); },
          py::arg("bytes"), "JPEG or PNG bytes -> uint8 [H, W, 3].");
  img.def("random_resized_crop",
          [](py::object i, int64_t h, int64_t w, std::array<double, 2> scale,
             std::array<double, 2> ratio) {
            return Wrap(image::RandomResizedCrop(ToExpr(i), h, w, scale, ratio));
          },
          py::arg("image"), py::arg("height"), py::arg("width"),
          py::arg("scale") = std::array<double, 2>{0.08, 1.0},
          py::arg("ratio") = std::array<double, 2>{3.0 / 4.0, 4.0 / 3.0});
  img.def("resize", [](py::object i, int64_t s) { return Wrap(image::Resize(ToExpr(i), s)); },
          py::arg("image"), py::arg("shorter_side"));
  img.def("center_crop",
          [](py::object i, int64_t h, int64_t w) {
            return Wrap(image::CenterCrop(ToExpr(i), h, w));
          },
          py::arg("image"), py::arg("height"), py::arg("width"));
  img.def("random_horizontal_flip",
          [](py::object i, double p) { return Wrap(image::RandomHorizontalFlip(ToExpr(i), p)); },
          py::arg("image"), py::arg("p") = 0.5);
  img.def("normalize",
          [](py::object i, std::array<float, 3> mean, std::array<float, 3> stddev) {
            return Wrap(image::Normalize(ToExpr(i), mean, stddev));
          },
          py::arg("image"), py::arg("mean"), py::arg("stddev"),
          "uint8 [H, W, 3] -> float32 [3, H, W]: (x / 255 - mean) / stddev.");
  img.def("folder_classes", [](const std::string& root) { return Check(image::FolderClasses(root)); },
          py::arg("root"));
  img.def("folder_label",
          [](py::object path, std::vector<std::string> classes, py::object extensions,
             std::string root) {
            return Wrap(image::FolderLabel(ToExpr(path), classes, Extensions(extensions), root));
          },
          py::arg("path"), py::arg("classes"), py::arg("extensions") = py::none(),
          py::arg("root") = "");
  img.def("image_folder",
          [](const std::string& root, py::object extensions) {
            return Checked(image::ImageFolder(root, Extensions(extensions)));
          },
          py::arg("root"), py::arg("extensions") = py::none(),
          "(path, label) for every image root/<class>/<file>, as torchvision's ImageFolder.");
}

void DefineTensor(py::module_& m) {
  py::class_<Tensor>(m, "Tensor", R"doc(
One component of an element, without a copy: its storage (for example a slot
of the UCX receive pool) stays alive while this object or a view of it exists.
numpy(), np.asarray(t) and __dlpack__() view it without copying.)doc")
      .def_property_readonly("dtype", [](const Tensor& t) { return DTypeName(t.dtype()); })
      .def_property_readonly("shape", [](const Tensor& t) {
        py::tuple s(t.shape().rank());
        for (int i = 0; i < t.shape().rank(); ++i) s[i] = t.shape().dim(i);
        return s;
      })
      .def_property_readonly("nbytes", &Tensor::byte_size)
      .def_property_readonly("data_ptr", [](const Tensor& t) {
        return reinterpret_cast<uintptr_t>(t.data());
      }, "The address of the first byte (for checking that views do not copy).")
      .def("numpy", [](py::object self) { return TensorToNumpy(self.cast<const Tensor&>(), self); },
           "A read-only numpy view (bytes or lists of bytes for strings).")
      .def("__array__", [](py::object self, py::object dtype) {
        py::object a = TensorToNumpy(self.cast<const Tensor&>(), self);
        if (!dtype.is_none()) a = a.attr("astype")(dtype, py::arg("copy") = false);
        return a;
      }, py::arg("dtype") = py::none())
      .def("__dlpack__", [](const Tensor& t, py::object stream) { return ToDLPack(t); },
           py::arg("stream") = py::none(),
           "A DLPack capsule viewing this tensor (bool travels as uint8).")
      .def("__dlpack_device__", [](const Tensor&) { return py::make_tuple(kDLCPU, 0); })
      .def("__repr__", [](const Tensor& t) { return "sluice.Tensor(" + t.DebugString() + ")"; });
  m.def("to_dlpack", [](const Tensor& t) { return ToDLPack(t); }, py::arg("tensor"),
        "A 'dltensor' capsule viewing `tensor`; its deleter releases the tensor.");

  py::class_<ComponentSpec>(m, "TensorSpec", "What is known statically about one component.")
      .def_property_readonly("dtype", [](const ComponentSpec& c) -> py::object {
        if (!c.dtype) return py::none();
        return py::str(DTypeName(*c.dtype));
      })
      .def_property_readonly("shape", [](const ComponentSpec& c) -> py::object {
        if (!c.shape) return py::none();
        py::tuple s(c.shape->size());
        for (size_t i = 0; i < c.shape->size(); ++i) {
          s[i] = (*c.shape)[i] < 0 ? py::object(py::none()) : py::int_((*c.shape)[i]);
        }
        return s;
      })
      .def("__repr__", [](const ComponentSpec& c) { return "TensorSpec(" + c.ToString() + ")"; });
}

void DefineDataset(py::module_& m) {
  py::class_<PyIterator>(m, "Iterator", "A pass over a dataset; next() releases the GIL.")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &PyIterator::Next)
      .def("save", &PyIterator::Save,
           "The position after the last next(), as bytes: make_iterator(checkpoint=...) of the "
           "same dataset resumes there. NotImplementedError naming an op that cannot save.")
      .def("close", &PyIterator::Close)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyIterator& it, py::args) { it.Close(); });

  py::class_<Dataset> d(m, "Dataset", R"doc(
An immutable pipeline definition. Builder steps raise (ValueError with the
library's message) when the step is invalid. Iterating starts a new pass.)doc");
  // ---- sources ----
  d.def_static("range", [](int64_t a, std::optional<int64_t> b, int64_t step) {
    return Checked(b ? Dataset::Range(a, *b, step) : Dataset::Range(0, a, step));
  }, py::arg("start_or_stop"), py::arg("stop") = py::none(), py::arg("step") = 1,
     "range(stop) or range(start, stop, step=1): int64 scalars, as Python's range.");
  d.def_static("from_tensors", [](py::iterable elements) {
    std::vector<Element> v;
    for (py::handle e : elements) v.push_back(ElementFromPy(e));
    return Checked(Dataset::FromTensors(std::move(v)));
  }, py::arg("elements"),
     "The given elements (each an array-like, or a tuple of them), copied in.");
  d.def_static("list_files", [](std::string p, bool recursive) {
    return Checked(Dataset::ListFiles(std::move(p), recursive));
  }, py::arg("pattern"), py::arg("recursive") = false,
     "Files matching a glob pattern, sorted; recursive: a matching directory stands for the "
     "files under it at any depth.");
  d.def_static("read_records", [](py::object files) {
    if (py::isinstance<Dataset>(files)) return Checked(Dataset::ReadRecords(files.cast<Dataset>()));
    return Checked(Dataset::ReadRecords(files.cast<std::vector<std::string>>()));
  }, py::arg("files"), "TFRecord records of `files` (a list of paths or a dataset of them).");
  d.def_static("webdataset", [](py::object shards, std::vector<std::string> fields,
                               bool skip_incomplete) {
    if (py::isinstance<Dataset>(shards)) {
      return Checked(Dataset::WebDataset(shards.cast<Dataset>(), std::move(fields), skip_incomplete));
    }
    py::object fspath = py::module_::import("os").attr("fspath");
    if (py::isinstance<py::str>(shards) || py::hasattr(shards, "__fspath__")) {
      return Checked(Dataset::WebDataset(fspath(shards).cast<std::string>(), std::move(fields),
                                         skip_incomplete));
    }
    std::vector<std::string> paths;
    for (py::handle p : shards.cast<py::iterable>()) paths.push_back(fspath(p).cast<std::string>());
    return Checked(Dataset::WebDataset(std::move(paths), std::move(fields), skip_incomplete));
  }, py::arg("shards"), py::arg("fields"), py::arg("skip_incomplete") = false,
     "WebDataset tar shards -- a glob pattern, a list of paths or a dataset of them -- as one "
     "element per sample: the requested fields ('jpg', 'cls', 'jpg;png' for the first present, "
     "'__key__') as bytes scalars, in the order asked. A sample lacking a field raises "
     "ValueError naming the shard and key unless skip_incomplete.");
  d.def_static("read_fixed_length_records",
               [](py::object files, int64_t record_bytes, int64_t header, int64_t footer) {
                 if (py::isinstance<Dataset>(files)) {
                   return Checked(Dataset::ReadFixedLengthRecords(files.cast<Dataset>(),
                                                                  record_bytes, header, footer));
                 }
                 return Checked(Dataset::ReadFixedLengthRecords(
                     files.cast<std::vector<std::string>>(), record_bytes, header, footer));
               },
               py::arg("files"), py::arg("record_bytes"), py::arg("header_bytes") = 0,
               py::arg("footer_bytes") = 0);
  d.def_static("zip", [](py::args args) {
    std::vector<Dataset> inputs;
    py::object seq = args;
    if (args.size() == 1 && !py::isinstance<Dataset>(args[0])) seq = args[0];
    for (py::handle h : seq) inputs.push_back(h.cast<Dataset>());
    return Checked(Dataset::Zip(std::move(inputs)));
  }, "zip(a, b, ...) or zip((a, b, ...)): tuples of the inputs' components.");
  d.def_static("deserialize", [](py::bytes b) { return Check(Dataset::Deserialize(b)); });
  d.def_static("from_dataset_id",
               [](const std::string& processing_mode, const std::string& service,
                  const std::string& dataset_id, py::kwargs kwargs) {
                 DistributeOptions o =
                     MakeDistributeOptions("from_dataset_id", processing_mode, service, kwargs);
                 return Checked(FromDatasetId(o.processing_mode, o.service, dataset_id, o));
               },
               py::arg("processing_mode"), py::arg("service"), py::arg("dataset_id"),
               "Reads a dataset registered with sluice.register_dataset (keyword arguments: "
               "the DistributeOptions fields).");

  // ---- transforms ----
  d.def("map", [](const Dataset& ds, py::object fn, py::object num_parallel_calls,
                  py::object deterministic) {
    Function f = ToFunction(fn);
    if (num_parallel_calls.is_none()) return Checked(ds.Map(f));
    bool det = deterministic.is_none() ? true : deterministic.cast<bool>();
    return Checked(ds.Map(f, num_parallel_calls.cast<int64_t>(), det));
  }, py::arg("fn"), py::arg("num_parallel_calls") = py::none(),
     py::arg("deterministic") = py::none(),
     "Applies an expression (or tuple of them, or a callable traced once with x, or a udf).");
  d.def("filter", [](const Dataset& ds, py::object pred) {
    return Checked(ds.Filter(ToFunction(pred)));
  }, py::arg("predicate"));
  d.def("batch", [](const Dataset& ds, int64_t n, bool drop, py::object npc) {
    return Checked(ds.Batch(n, drop, npc.is_none() ? 1 : npc.cast<int64_t>()));
  }, py::arg("batch_size"), py::arg("drop_remainder") = false,
     py::arg("num_parallel_calls") = py::none());
  d.def("unbatch", [](const Dataset& ds) { return Checked(ds.Unbatch()); });
  d.def("shuffle", [](const Dataset& ds, int64_t n, py::object seed, py::object reshuffle) {
    std::optional<uint64_t> s;
    if (!seed.is_none()) s = seed.cast<uint64_t>();
    return Checked(ds.Shuffle(n, s, reshuffle.is_none() ? true : reshuffle.cast<bool>()));
  }, py::arg("buffer_size"), py::arg("seed") = py::none(),
     py::arg("reshuffle_each_iteration") = py::none());
  d.def("repeat", [](const Dataset& ds, py::object count) {
    return Checked(ds.Repeat(count.is_none() ? -1 : count.cast<int64_t>()));
  }, py::arg("count") = py::none());
  d.def("take", [](const Dataset& ds, int64_t n) { return Checked(ds.Take(n)); }, py::arg("count"));
  d.def("skip", [](const Dataset& ds, int64_t n) { return Checked(ds.Skip(n)); }, py::arg("count"));
  d.def("shard", [](const Dataset& ds, int64_t n, int64_t i) { return Checked(ds.Shard(n, i)); },
        py::arg("num_shards"), py::arg("index"));
  d.def("prefetch", [](const Dataset& ds, int64_t n) { return Checked(ds.Prefetch(n)); },
        py::arg("buffer_size"));
  d.def("enumerate", [](const Dataset& ds, int64_t start) { return Checked(ds.Enumerate(start)); },
        py::arg("start") = 0);
  d.def("with_seed", [](const Dataset& ds, uint64_t seed) { return Checked(ds.WithSeed(seed)); },
        py::arg("seed"));
  d.def("interleave", [](const Dataset& ds, py::object fn, int64_t cycle_length,
                         int64_t block_length, py::object npc) {
    // fn runs now, once, on a placeholder dataset; a Python exception it
    // raises is kept and re-raised after the C++ call returns.
    std::optional<py::error_already_set> error;
    auto call = [&](const Dataset& placeholder) -> Dataset {
      if (error) return placeholder;
      try {
        return fn(placeholder).cast<Dataset>();
      } catch (py::error_already_set& e) {
        error = std::move(e);
      } catch (const py::cast_error&) {
        PyErr_SetString(PyExc_TypeError, "interleave: the function must return a sluice.Dataset");
        error = py::error_already_set();
      }
      return placeholder;
    };
    Dataset out = ds.Interleave(call, cycle_length, block_length,
                                npc.is_none() ? 1 : npc.cast<int64_t>());
    if (error) throw std::move(*error);
    return Checked(out);
  }, py::arg("fn"), py::arg("cycle_length"), py::arg("block_length") = 1,
     py::arg("num_parallel_calls") = py::none(),
     "fn(Dataset) -> Dataset, applied to a one-element dataset per input element.");
  d.def("distribute", [](const Dataset& ds, const std::string& processing_mode,
                         const std::string& service, py::kwargs kwargs) {
    DistributeOptions o = MakeDistributeOptions("distribute", processing_mode, service, kwargs);
    return Checked(ds.Apply(Distribute(std::move(o))));
  }, py::arg("processing_mode") = "parallel_epochs", py::arg("service") = "",
     "Runs the pipeline so far on the service's workers. Keyword arguments: the fields of "
     "C++ DistributeOptions (job_name, max_outstanding_requests, target_workers, "
     "data_transfer_protocol, fallback_to_grpc, numa_node, cpu_list, gpu_pci_bus_id, "
     "consumer_index, num_consumers, dispatcher_timeout_ms, tls, auth_token, "
     "max_element_bytes, stall_warning_ms, cuda_pinned, compression).");

  // ---- inspection ----
  d.def("cardinality", &Dataset::Cardinality,
        "The number of elements, INFINITE_CARDINALITY (-1) or UNKNOWN_CARDINALITY (-2).");
  d.def_property_readonly("element_spec", [](const Dataset& ds) { return SpecToPy(ds.element_spec()); });
  d.def("fingerprint", &Dataset::Fingerprint);
  d.def("serialize", [](const Dataset& ds) { return py::bytes(Check(ds.Serialize())); });
  d.def("__repr__", &Dataset::DebugString);
  d.def("make_iterator", &MakeIterator, py::arg("output") = "numpy",
        py::arg("checkpoint") = py::none(),
        "A new pass. output='numpy': numpy arrays (bytes for strings); 'tensor': sluice.Tensor. "
        "checkpoint: bytes from Iterator.save() of this dataset: resume there.");
  d.def("__iter__", [](const Dataset& ds) { return MakeIterator(ds, "numpy"); });

  m.def("register_dataset",
        [](const std::string& service, const Dataset& ds, py::object dataset_id,
           py::kwargs kwargs) {
          DistributeOptions o = MakeDistributeOptions("register_dataset", "", service, kwargs);
          std::string id = dataset_id.is_none() ? "" : dataset_id.cast<std::string>();
          absl::StatusOr<std::string> r;
          {
            py::gil_scoped_release release;
            r = RegisterDataset(ds, o, id);
          }
          return Check(std::move(r));
        },
        py::arg("service"), py::arg("dataset"), py::arg("dataset_id") = py::none(),
        "Registers `dataset` with the service; returns its id.");
  m.def("merge_checkpoints",
        [](const std::vector<py::bytes>& checkpoints) {
          std::vector<std::string> in;
          for (const py::bytes& b : checkpoints) in.push_back(std::string(b));
          return py::bytes(Check(MergeCheckpoints(in)));
        },
        py::arg("checkpoints"),
        "One checkpoint from the Iterator.save() bytes of every consumer of a distributed_epoch "
        "job, saved at the same step: each consumer of the resumed job restores it "
        "(make_iterator(checkpoint=...)), with any number of consumers and workers "
        "(docs/checkpointing.md). ValueError for checkpoints of different pipelines or "
        "iterations, or when an op after distribute holds elements.");
}

void DefineServers(py::module_& m) {
  py::class_<TlsConfig>(m, "TlsConfig")
      .def(py::init([](std::string cert_file, std::string key_file, std::string ca_file) {
             return TlsConfig{std::move(cert_file), std::move(key_file), std::move(ca_file)};
           }),
           py::arg("cert_file") = "", py::arg("key_file") = "", py::arg("ca_file") = "")
      .def_readwrite("cert_file", &TlsConfig::cert_file)
      .def_readwrite("key_file", &TlsConfig::key_file)
      .def_readwrite("ca_file", &TlsConfig::ca_file);

  py::class_<PyDispatchServer>(m, "DispatchServer", R"doc(
An in-process dispatcher, started by the constructor; keyword arguments are the
fields of C++ DispatcherConfig (port=0 picks a free port).)doc")
      .def(py::init(&StartDispatcher))
      .def_static("start", &StartDispatcher)
      .def_property_readonly("target", [](PyDispatchServer& s) { return s.get().target(); })
      .def_property_readonly("address", [](PyDispatchServer& s) { return s.get().address(); })
      .def_property_readonly("port", [](PyDispatchServer& s) { return s.get().port(); })
      .def_property_readonly("metrics_port",
                             [](PyDispatchServer& s) { return s.get().metrics_port(); })
      .def("stop", &PyDispatchServer::Stop)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyDispatchServer& s, py::args) { s.Stop(); });

  py::class_<PyWorkerServer>(m, "WorkerServer", R"doc(
An in-process worker, started by the constructor; keyword arguments are the
fields of C++ WorkerConfig (dispatcher_address is required).)doc")
      .def(py::init(&StartWorker))
      .def_static("start", &StartWorker)
      .def_property_readonly("address", [](PyWorkerServer& s) { return s.get().address(); })
      .def_property_readonly("transfer_address",
                             [](PyWorkerServer& s) { return s.get().transfer_address(); })
      .def_property_readonly("port", [](PyWorkerServer& s) { return s.get().port(); })
      .def_property_readonly("metrics_port",
                             [](PyWorkerServer& s) { return s.get().metrics_port(); })
      .def_property_readonly("num_tasks", [](PyWorkerServer& s) { return s.get().num_tasks(); })
      .def("stop", &PyWorkerServer::Stop)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyWorkerServer& s, py::args) { s.Stop(); });

  m.def("transport_stats", [] {
    TransportStats s = GetTransportStats();
    py::dict d;
#define SLUICE_STAT_(f) d[#f] = s.f
    SLUICE_STAT_(ucx_elements_received); SLUICE_STAT_(ucx_bytes_received);
    SLUICE_STAT_(ucx_endpoints_connected); SLUICE_STAT_(ucx_consumer_driven_passes);
    SLUICE_STAT_(client_payload_bytes_copied); SLUICE_STAT_(dedicated_buffer_allocations);
    SLUICE_STAT_(pool_buffers_in_use); SLUICE_STAT_(pool_high_water_mark);
    SLUICE_STAT_(worker_frames_in_registered_memory); SLUICE_STAT_(worker_zero_copy_payloads);
    SLUICE_STAT_(worker_batched_replies); SLUICE_STAT_(worker_ucx_send_errors);
    SLUICE_STAT_(receive_pool_registered_bytes); SLUICE_STAT_(receive_pool_over_cap);
    SLUICE_STAT_(pool_arenas_verified_on_node); SLUICE_STAT_(pool_arenas_misplaced);
    SLUICE_STAT_(receive_pool_cuda_pinned_bytes); SLUICE_STAT_(cuda_pin_failures);
    SLUICE_STAT_(ucx_lanes);
#undef SLUICE_STAT_
    return d;
  }, "The process's data-plane counters (C++ TransportStats) as a dict.");
  m.def("data_service_stats", [] {
    DataServiceStats s = GetDataServiceStats();
    py::dict d;
#define SLUICE_STAT_(f) d[#f] = s.f
    SLUICE_STAT_(elements_received); SLUICE_STAT_(bytes_received); SLUICE_STAT_(lost_tasks);
    SLUICE_STAT_(worker_errors); SLUICE_STAT_(iterations_started);
    SLUICE_STAT_(iterations_released); SLUICE_STAT_(duplicates_dropped);
    SLUICE_STAT_(rounds_skipped);
#undef SLUICE_STAT_
    return d;
  }, "The process's data-service client counters (C++ DataServiceStats) as a dict.");
  m.def("set_log_level", [](const std::string& level) { Check(SetLogLevel(level)); },
        py::arg("level"), "'trace', 'debug', 'info', 'warn', 'error', 'critical' or 'off'.");
  m.def("configure_thread_pool", [](int threads) {
    if (threads < 1) throw py::value_error("configure_thread_pool: threads must be >= 1");
    ConfigureThreadPool(threads);
  }, py::arg("threads"));
}

}  // namespace
}  // namespace sluice::python

PYBIND11_MODULE(_sluice, m) {
  using namespace sluice::python;
  m.doc() = "sluice: ML input pipelines, locally or on a data service (docs/python.md).";
  py::tuple bases = py::make_tuple(py::handle(PyExc_FileNotFoundError),
                                   py::handle(PyExc_LookupError));
  g_not_found_error = PyErr_NewException("sluice.NotFoundError", bases.ptr(), nullptr);
  if (g_not_found_error == nullptr) throw py::error_already_set();
  m.attr("NotFoundError") = py::handle(g_not_found_error);  // the module keeps a reference

  m.attr("AUTOTUNE") = sluice::kAutotune;
  m.attr("INFINITE_CARDINALITY") = sluice::kInfiniteCardinality;
  m.attr("UNKNOWN_CARDINALITY") = sluice::kUnknownCardinality;
  m.attr("SHARD_HINT") = sluice::kShardHint;

  DefineTensor(m);
  DefineExpressions(m);
  DefineDataset(m);
  DefineServers(m);
  sluice::InitLoggingFromEnv("sluice-python");
  DefineLogging(m);
}
