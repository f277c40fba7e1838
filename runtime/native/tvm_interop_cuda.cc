// tvm-interop's native CUDA runtime extension.
//
// Why it exists: the PyPI TVM wheel has neither cuDNN nor cuBLAS, and TVM's only stream-sync global
// (runtime.Device_StreamSyncFromTo) creates and destroys a CUDA event on every call. This file adds:
//
//   tvm_interop.cuda.events_create(device_id, n) -> handle     a pool of n cudaEventDisableTiming events
//   tvm_interop.cuda.events_free(handle)
//   tvm_interop.cuda.event_sync(handle, k, src_stream, dst_stream)
//   tvm_interop.cuda.timing_create(device_id, n) -> handle     a pool of n timing events (in-context stage times)
//   tvm_interop.cuda.timing_record(handle, k, stream)          record timing event k on stream
//   tvm_interop.cuda.timing_read(handle, n) -> [ms]            elapsed time between events k-1 and k, k = 1..n-1
//   tvm_interop.cuda.timing_free(handle)
//   tvm_interop.cuda.stream_hold(device_id, stream, timeout_ms) -> handle   hold a stream until released
//   tvm_interop.cuda.stream_release(handle) -> held            release, synchronise; false if the hold timed out
//   tvm_interop.cudnn.conv2d(params, x, w, [bias], [z], out)   out = act(conv(x, w) + bias + z)
//   tvm_interop.cublas.dense(params, x, w, [bias], out)        out = act(x . w(^T) + bias)
//   tvm_interop.native.info() -> str                           JSON: version, functions, libraries
//   tvm_interop.native.call_stats(reset) -> str                JSON: host time per library call, by phase
//
// The output tensor is the LAST argument (destination-passing style: Relax's call_dps_packed appends it).
//
// Build and deployment (passes/native_build.py): compiled as host C++ (no device code) into an object that
// TVM's export_library(addons=[obj]) links into an exported model, and into a shared library for in-process
// runs. The globals register from a static initialiser when the library is loaded.
//
// No link-time dependency on any CUDA library: libcudart.so.13, libcudnn.so.9 and libcublasLt.so.13 are
// dlopen'ed on first use, and every function is resolved with dlsym into a pointer typed from the headers
// (decltype(&cudnnCreate)), so the headers are needed at compile time only. Loading this extension on a machine
// with no GPU and no CUDA libraries succeeds; only the calls fail, with an error naming what is missing.
//
// Every call validates its arguments (arity, params, dtypes, shapes, devices) BEFORE loading any library, so a
// malformed call is refused the same way on every machine.

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <dlfcn.h>
#include <tvm/ffi/any.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace tvm_interop {
namespace {

namespace ffi = ::tvm::ffi;

constexpr const char* kVersion = "0.1.0";

constexpr const char* kEventsCreate = "tvm_interop.cuda.events_create";
constexpr const char* kEventsFree = "tvm_interop.cuda.events_free";
constexpr const char* kEventSync = "tvm_interop.cuda.event_sync";
constexpr const char* kTimingCreate = "tvm_interop.cuda.timing_create";
constexpr const char* kTimingRecord = "tvm_interop.cuda.timing_record";
constexpr const char* kTimingRead = "tvm_interop.cuda.timing_read";
constexpr const char* kTimingFree = "tvm_interop.cuda.timing_free";
constexpr const char* kStreamHold = "tvm_interop.cuda.stream_hold";
constexpr const char* kStreamRelease = "tvm_interop.cuda.stream_release";
constexpr const char* kConv2d = "tvm_interop.cudnn.conv2d";
constexpr const char* kSetEnginePolicy = "tvm_interop.cudnn.set_engine_policy";
constexpr const char* kConvChoices = "tvm_interop.cudnn.conv_choices";
constexpr const char* kConvEngines = "tvm_interop.cudnn.conv_engines";
constexpr const char* kDense = "tvm_interop.cublas.dense";
constexpr const char* kInfo = "tvm_interop.native.info";
constexpr const char* kCallStats = "tvm_interop.native.call_stats";
constexpr std::array<const char*, 16> kFunctionNames = {
    kEventsCreate, kEventsFree,   kEventSync,       kTimingCreate, kTimingRecord, kTimingRead,
    kTimingFree,   kStreamHold,   kStreamRelease,   kConv2d,       kSetEnginePolicy, kConvChoices,
    kConvEngines,  kDense,        kInfo,            kCallStats};

// ---------------------------------------------------------------------------------------------------------------
// Lazily loaded CUDA libraries.
// ---------------------------------------------------------------------------------------------------------------

// The functions of each library we call. The X-macro gives one typed pointer per function (the type comes from
// the header, so a signature can never be guessed wrong) and its dlsym name (the literal name: none of these is
// renamed by a macro in the headers; a missing symbol is reported by name at load time, never silently null).
#define TVM_INTEROP_CUDART_FUNCS(X)  \
  X(cudaGetErrorName)                \
  X(cudaGetErrorString)              \
  X(cudaGetDevice)                   \
  X(cudaSetDevice)                   \
  X(cudaGetDeviceCount)              \
  X(cudaRuntimeGetVersion)           \
  X(cudaDriverGetVersion)            \
  X(cudaEventCreateWithFlags)        \
  X(cudaEventDestroy)                \
  X(cudaEventRecord)                 \
  X(cudaEventSynchronize)            \
  X(cudaEventElapsedTime)            \
  X(cudaLaunchHostFunc)              \
  X(cudaStreamWaitEvent)             \
  X(cudaStreamSynchronize)           \
  X(cudaStreamIsCapturing)           \
  X(cudaThreadExchangeStreamCaptureMode) \
  X(cudaMalloc)                      \
  X(cudaMemcpyAsync)                 \
  X(cudaFree)                        \
  X(cudaGetLastError)

#define TVM_INTEROP_CUDNN_FUNCS(X)            \
  X(cudnnGetVersion)                          \
  X(cudnnGetErrorString)                      \
  X(cudnnGetLastErrorString)                  \
  X(cudnnCreate)                              \
  X(cudnnSetStream)                           \
  X(cudnnCreateTensorDescriptor)              \
  X(cudnnSetTensor4dDescriptor)               \
  X(cudnnDestroyTensorDescriptor)             \
  X(cudnnCreateFilterDescriptor)              \
  X(cudnnSetFilter4dDescriptor)               \
  X(cudnnDestroyFilterDescriptor)             \
  X(cudnnCreateConvolutionDescriptor)         \
  X(cudnnSetConvolution2dDescriptor)          \
  X(cudnnSetConvolutionGroupCount)            \
  X(cudnnSetConvolutionMathType)              \
  X(cudnnDestroyConvolutionDescriptor)        \
  X(cudnnCreateActivationDescriptor)          \
  X(cudnnSetActivationDescriptor)             \
  X(cudnnDestroyActivationDescriptor)         \
  X(cudnnGetConvolutionForwardAlgorithmMaxCount) \
  X(cudnnFindConvolutionForwardAlgorithmEx)   \
  X(cudnnGetConvolutionForwardAlgorithm_v7)   \
  X(cudnnGetConvolutionForwardWorkspaceSize)  \
  X(cudnnConvolutionForward)                  \
  X(cudnnConvolutionBiasActivationForward)    \
  X(cudnnAddTensor)                           \
  X(cudnnActivationForward)                   \
  X(cudnnBackendCreateDescriptor)             \
  X(cudnnBackendDestroyDescriptor)            \
  X(cudnnBackendSetAttribute)                 \
  X(cudnnBackendGetAttribute)                 \
  X(cudnnBackendFinalize)                     \
  X(cudnnBackendExecute)

#define TVM_INTEROP_CUBLASLT_FUNCS(X)        \
  X(cublasLtGetVersion)                      \
  X(cublasLtGetStatusName)                   \
  X(cublasLtGetStatusString)                 \
  X(cublasLtCreate)                          \
  X(cublasLtMatmulDescCreate)                \
  X(cublasLtMatmulDescDestroy)               \
  X(cublasLtMatmulDescSetAttribute)          \
  X(cublasLtMatrixLayoutCreate)              \
  X(cublasLtMatrixLayoutDestroy)             \
  X(cublasLtMatmulPreferenceCreate)          \
  X(cublasLtMatmulPreferenceDestroy)         \
  X(cublasLtMatmulPreferenceSetAttribute)    \
  X(cublasLtMatmulAlgoGetHeuristic)          \
  X(cublasLtMatmul)

#define TVM_INTEROP_DECLARE_PTR(name) decltype(&::name) name = nullptr;
#define TVM_INTEROP_RESOLVE_PTR(name)                                              \
  name = reinterpret_cast<decltype(&::name)>(dlsym(handle, #name));                \
  if (name == nullptr) missing += (missing.empty() ? "" : ", ") + std::string(#name);

struct CudartApi {
  static constexpr const char* kSoname = "libcudart.so.13";
  static constexpr const char* kProbeSymbol = "cudaGetErrorString";
  static constexpr const char* kRemedy =
      "install the CUDA 13 runtime (pip install nvidia-cuda-runtime, or a CUDA 13 toolkit) and make it findable: "
      "tvm_interop.runtime.native_libs.preload_cuda_libraries() in Python, or its lib folder on LD_LIBRARY_PATH";
  TVM_INTEROP_CUDART_FUNCS(TVM_INTEROP_DECLARE_PTR)
  std::string Resolve(void* handle) {
    std::string missing;
    TVM_INTEROP_CUDART_FUNCS(TVM_INTEROP_RESOLVE_PTR)
    return missing;
  }
};

struct CudnnApi {
  static constexpr const char* kSoname = "libcudnn.so.9";
  static constexpr const char* kProbeSymbol = "cudnnGetVersion";
  static constexpr const char* kRemedy =
      "install cuDNN 9 for CUDA 13 (pip install nvidia-cudnn-cu13) and make it findable: "
      "tvm_interop.runtime.native_libs.preload_cuda_libraries() in Python, or its lib folder "
      "(site-packages/nvidia/cudnn/lib) on LD_LIBRARY_PATH";
  TVM_INTEROP_CUDNN_FUNCS(TVM_INTEROP_DECLARE_PTR)
  std::string Resolve(void* handle) {
    std::string missing;
    TVM_INTEROP_CUDNN_FUNCS(TVM_INTEROP_RESOLVE_PTR)
    return missing;
  }
};

struct CublasLtApi {
  static constexpr const char* kSoname = "libcublasLt.so.13";
  static constexpr const char* kProbeSymbol = "cublasLtGetVersion";
  static constexpr const char* kRemedy =
      "install cuBLAS for CUDA 13 (pip install nvidia-cublas) and make it findable: "
      "tvm_interop.runtime.native_libs.preload_cuda_libraries() in Python, or its lib folder "
      "(site-packages/nvidia/cu13/lib) on LD_LIBRARY_PATH";
  TVM_INTEROP_CUBLASLT_FUNCS(TVM_INTEROP_DECLARE_PTR)
  std::string Resolve(void* handle) {
    std::string missing;
    TVM_INTEROP_CUBLASLT_FUNCS(TVM_INTEROP_RESOLVE_PTR)
    return missing;
  }
};

// One library, loaded on first use. A failed load is retried on the next use (the user may have fixed the
// environment meanwhile, e.g. by calling preload_cuda_libraries()); a success is final and lock-free to read.
template <typename Api>
class LazyLibrary {
 public:
  // The table, or nullptr with *error set. Never throws.
  const Api* TryGet(std::string* error) {
    if (const Api* api = api_.load(std::memory_order_acquire)) return api;
    std::lock_guard<std::mutex> lock(mu_);
    if (const Api* api = api_.load(std::memory_order_acquire)) return api;
    dlerror();  // clear a stale message
    void* handle = dlopen(Api::kSoname, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      *error = std::string("cannot load ") + Api::kSoname + " (" + (why ? why : "unknown dlopen error") + "); " +
               Api::kRemedy;
      return nullptr;
    }
    auto* table = new Api();  // lives as long as the process: its pointers are used by every later call
    std::string missing = table->Resolve(handle);
    if (!missing.empty()) {
      delete table;
      *error = std::string(Api::kSoname) + " was loaded but lacks " + missing +
               " (a library of another major version first on the search path?); " + Api::kRemedy;
      return nullptr;
    }
    handle_ = handle;
    api_.store(table, std::memory_order_release);
    return table;
  }

  // The table, or a RuntimeError naming the caller, the library, dlerror's text and the remedy.
  const Api& Get(const char* caller) {
    std::string error;
    const Api* api = TryGet(&error);
    if (api == nullptr) TVM_FFI_THROW(RuntimeError) << caller << ": " << error;
    return *api;
  }

  // The file the library was loaded from (for info()), found through one of its symbols.
  std::string Path() const {
    if (handle_ == nullptr) return "";
    void* sym = dlsym(handle_, Api::kProbeSymbol);
    Dl_info dl;
    if (sym != nullptr && dladdr(sym, &dl) != 0 && dl.dli_fname != nullptr) return dl.dli_fname;
    return "";
  }

 private:
  std::atomic<const Api*> api_{nullptr};
  void* handle_ = nullptr;
  std::mutex mu_;
};

LazyLibrary<CudartApi>& Cudart() {
  static auto* lib = new LazyLibrary<CudartApi>();  // never destroyed: no teardown-order hazards at exit
  return *lib;
}
LazyLibrary<CudnnApi>& Cudnn() {
  static auto* lib = new LazyLibrary<CudnnApi>();
  return *lib;
}
LazyLibrary<CublasLtApi>& CublasLt() {
  static auto* lib = new LazyLibrary<CublasLtApi>();
  return *lib;
}

// ---------------------------------------------------------------------------------------------------------------
// Status checks: every call is checked and reported with the caller, the function and the library's message.
// ---------------------------------------------------------------------------------------------------------------

void CheckCuda(const CudartApi& rt, cudaError_t status, const char* func, const char* caller) {
  if (status == cudaSuccess) return;
  const bool no_device = status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver ||
                         status == cudaErrorInvalidDevice;
  TVM_FFI_THROW(RuntimeError) << caller << ": " << func << " failed: " << rt.cudaGetErrorName(status) << " ("
                              << rt.cudaGetErrorString(status) << ")"
                              << (no_device ? "; no usable CUDA device: this needs an NVIDIA GPU and its driver"
                                            : "");
}

void CheckCudnn(const CudnnApi& dnn, cudnnStatus_t status, const char* func, const char* caller) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  char detail[512] = {0};
  dnn.cudnnGetLastErrorString(detail, sizeof(detail));
  TVM_FFI_THROW(RuntimeError) << caller << ": " << func << " failed: " << dnn.cudnnGetErrorString(status)
                              << (detail[0] ? std::string(" (") + detail + ")" : std::string());
}

void CheckCublas(const CublasLtApi& lt, cublasStatus_t status, const char* func, const char* caller) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  TVM_FFI_THROW(RuntimeError) << caller << ": " << func << " failed: " << lt.cublasLtGetStatusName(status)
                              << " (" << lt.cublasLtGetStatusString(status) << ")";
}

#define TVM_INTEROP_CUDA_CALL(rt, caller, func, ...) CheckCuda(rt, rt.func(__VA_ARGS__), #func, caller)
#define TVM_INTEROP_CUDNN_CALL(dnn, caller, func, ...) CheckCudnn(dnn, dnn.func(__VA_ARGS__), #func, caller)
#define TVM_INTEROP_CUBLAS_CALL(lt, caller, func, ...) CheckCublas(lt, lt.func(__VA_ARGS__), #func, caller)

// Makes `device` current for the scope and restores the caller's device after (TVM's runtime and other
// libraries on this thread may rely on their own choice).
class DeviceGuard {
 public:
  DeviceGuard(const CudartApi& rt, int device, const char* caller) : rt_(rt), device_(device) {
    TVM_INTEROP_CUDA_CALL(rt_, caller, cudaGetDevice, &previous_);
    if (previous_ != device_) TVM_INTEROP_CUDA_CALL(rt_, caller, cudaSetDevice, device_);
  }
  ~DeviceGuard() {
    if (previous_ != device_) rt_.cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  const CudartApi& rt_;
  int device_;
  int previous_ = -1;
};

// Whether `stream` is being captured into a CUDA graph. An error (e.g. cudaErrorStreamCaptureImplicit: the
// legacy stream queried while another stream captures in global mode) counts as capturing: then nothing that
// would break a capture (algorithm search, synchronising frees) may run.
bool IsCapturing(const CudartApi& rt, cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaError_t err = rt.cudaStreamIsCapturing(stream, &status);
  if (err != cudaSuccess) {
    rt.cudaGetLastError();  // not sticky, but do not leave it for TVM's next check
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

// Runs `fn` with this thread's capture mode relaxed when `capturing`: allocations and handle creation are
// "unsafe" calls that the default (global) capture mode refuses during a capture; relaxed mode permits them. They
// do not enter the graph: the memory is ours for the process's life.
template <typename Fn>
void WithRelaxedCapture(const CudartApi& rt, bool capturing, const char* caller, Fn&& fn) {
  if (!capturing) {
    fn();
    return;
  }
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  TVM_INTEROP_CUDA_CALL(rt, caller, cudaThreadExchangeStreamCaptureMode, &mode);
  try {
    fn();
  } catch (...) {
    rt.cudaThreadExchangeStreamCaptureMode(&mode);
    throw;
  }
  TVM_INTEROP_CUDA_CALL(rt, caller, cudaThreadExchangeStreamCaptureMode, &mode);
}

// ---------------------------------------------------------------------------------------------------------------
// Argument validation (no library needed).
// ---------------------------------------------------------------------------------------------------------------

std::string ShapeStr(const DLTensor* t) {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < t->ndim; ++i) os << (i ? ", " : "") << t->shape[i];
  os << "]";
  return os.str();
}

int64_t Numel(const DLTensor* t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

void* DataPtr(const DLTensor* t) { return static_cast<char*>(t->data) + t->byte_offset; }

// Largest power of two, at most `cap` and at least 4 (a float's own), dividing the address: cuBLASLt picks
// kernels by pointer alignment (cap 256), a cuDNN graph-API tensor declares it (cap 16).
uint32_t Alignment(const void* ptr, uint32_t cap = 256) {
  auto addr = reinterpret_cast<uintptr_t>(ptr);
  uint32_t align = cap;
  while (align > 4 && addr % align != 0) align /= 2;
  return align;
}

const char* DeviceTypeName(int32_t type) {
  switch (type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda";
    case kDLCUDAHost: return "cuda_host";
    case kDLCUDAManaged: return "cuda_managed";
    default: return "non-CUDA device";
  }
}

// The i-th argument as a tensor (an ffi::Tensor or a raw DLTensor*), or a TypeError.
DLTensor* TensorArg(ffi::PackedArgs args, int i, const char* caller, const char* name) {
  std::optional<DLTensor*> t = args[i].try_cast<DLTensor*>();
  if (!t.has_value() || *t == nullptr) {
    TVM_FFI_THROW(TypeError) << caller << ": argument " << i << " (" << name << ") must be a tensor, got "
                             << args[i].GetTypeKey();
  }
  return *t;
}

// float32, dense row-major, non-empty: what every kernel here reads and writes.
void CheckTensor(const DLTensor* t, const char* caller, const char* name) {
  if (t->dtype.code != kDLFloat || t->dtype.bits != 32 || t->dtype.lanes != 1) {
    TVM_FFI_THROW(TypeError) << caller << ": " << name << " must be float32, got dtype code "
                             << int(t->dtype.code) << " bits " << int(t->dtype.bits) << " lanes "
                             << int(t->dtype.lanes) << " (only float32 is supported)";
  }
  for (int i = 0; i < t->ndim; ++i) {
    if (t->shape[i] <= 0 || t->shape[i] > std::numeric_limits<int32_t>::max()) {
      TVM_FFI_THROW(ValueError) << caller << ": " << name << " has shape " << ShapeStr(t)
                                << "; every dimension must be in [1, 2^31)";
    }
  }
  if (t->strides != nullptr) {
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; --i) {
      if (t->shape[i] != 1 && t->strides[i] != expect) {
        TVM_FFI_THROW(ValueError) << caller << ": " << name << " of shape " << ShapeStr(t)
                                  << " is not contiguous (row-major); pass a compact tensor";
      }
      expect *= t->shape[i];
    }
  }
}

// Every tensor on one CUDA device. Checked after the shapes, so a malformed call is refused for its shapes on any
// machine (and tests can build it from CPU tensors).
void CheckCudaDevice(const std::vector<std::pair<const DLTensor*, const char*>>& ts, const char* caller) {
  for (const auto& [t, name] : ts) {
    if (t->device.device_type != kDLCUDA) {
      TVM_FFI_THROW(ValueError) << caller << ": " << name << " is on " << DeviceTypeName(t->device.device_type)
                                << ":" << t->device.device_id << "; it must be on a CUDA device (cuda:N)";
    }
  }
  for (const auto& [t, name] : ts) {
    if (t->device.device_id != ts[0].first->device.device_id) {
      TVM_FFI_THROW(ValueError) << caller << ": " << name << " is on cuda:" << t->device.device_id << " but "
                                << ts[0].second << " is on cuda:" << ts[0].first->device.device_id
                                << "; all tensors must be on one device";
    }
  }
}

void CheckNdim(const DLTensor* t, int ndim, const char* caller, const char* name) {
  if (t->ndim != ndim) {
    TVM_FFI_THROW(ValueError) << caller << ": " << name << " must be " << ndim << "-D, got shape " << ShapeStr(t);
  }
}

// params: an ffi::Shape (R.shape([...])) or an array of ints, of exactly `expected` entries.
std::vector<int64_t> ParamsArg(ffi::PackedArgs args, const char* caller, size_t expected, const char* layout) {
  if (args.size() == 0) {
    TVM_FFI_THROW(ValueError) << caller << ": no arguments; expected params " << layout << " first";
  }
  std::optional<ffi::Shape> shape = args[0].try_cast<ffi::Shape>();
  if (!shape.has_value()) {
    TVM_FFI_THROW(TypeError) << caller << ": argument 0 (params) must be a shape of ints " << layout << ", got "
                             << args[0].GetTypeKey();
  }
  std::vector<int64_t> params(shape->begin(), shape->end());
  if (params.size() != expected) {
    TVM_FFI_THROW(ValueError) << caller << ": params must have " << expected << " entries " << layout << ", got "
                              << params.size();
  }
  return params;
}

void CheckFlag(int64_t v, const char* caller, const char* name) {
  if (v != 0 && v != 1) TVM_FFI_THROW(ValueError) << caller << ": params." << name << " must be 0 or 1, got " << v;
}

void CheckArity(ffi::PackedArgs args, int expected, const char* caller, const char* signature) {
  if (args.size() != expected) {
    TVM_FFI_THROW(ValueError) << caller << ": expected " << expected << " arguments " << signature
                              << " for these params, got " << args.size();
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Per (device, stream) state: library handles bound to the stream, and a workspace.
// ---------------------------------------------------------------------------------------------------------------

struct ConvPlan;
struct DensePlan;

// One per (device, stream) that ever ran a cuDNN/cuBLAS call, created on first use and kept for the process's
// life. Concurrent groups run on different streams, so they never share a handle or a workspace; calls on one
// stream are ordered by the stream, so cuDNN and cuBLASLt can share its workspace.
struct StreamContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  std::mutex mu;  // a handle is not thread-safe: one host thread at a time per stream
  cudnnHandle_t cudnn = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  size_t workspace_size = 0;
  void* bias_copy = nullptr;  // a 256-byte aligned copy of a dense bias that is not 16-byte aligned (see Dense)
  size_t bias_copy_size = 0;
  // Outgrown workspaces are never freed: a CUDA graph captured earlier may still name them in its nodes and
  // replay later, and cudaFree would synchronise the device (forbidden during capture). Growth is geometric, so
  // the retired ones add up to less than the live one.
  std::vector<void*> retired;
  std::map<std::vector<int64_t>, std::unique_ptr<ConvPlan>> conv_plans;
  std::map<std::vector<int64_t>, std::unique_ptr<DensePlan>> dense_plans;
};

StreamContext& GetStreamContext(int device, cudaStream_t stream) {
  static auto* mu = new std::mutex();
  static auto* contexts = new std::map<std::pair<int, cudaStream_t>, std::unique_ptr<StreamContext>>();
  std::lock_guard<std::mutex> lock(*mu);
  auto& slot = (*contexts)[{device, stream}];
  if (!slot) {
    slot = std::make_unique<StreamContext>();
    slot->device = device;
    slot->stream = stream;
  }
  return *slot;
}

cudaStream_t CurrentStream(int device) {
  // The scheduled program switches the current stream with runtime.Device_SetStream before each group.
  return static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device));
}

// Makes one of the context's buffers (`buffer`, `buffer_size`) at least `bytes` long (never shrinks; see
// StreamContext::retired).
void* EnsureBuffer(const CudartApi& rt, StreamContext& ctx, void*& buffer, size_t& buffer_size, size_t bytes,
                   bool capturing, const char* caller) {
  if (bytes <= buffer_size) return buffer;
  constexpr size_t kGranule = size_t(1) << 20;
  size_t size = std::max(bytes, buffer_size * 2);
  size = (size + kGranule - 1) / kGranule * kGranule;
  void* ptr = nullptr;
  WithRelaxedCapture(rt, capturing, caller, [&] { TVM_INTEROP_CUDA_CALL(rt, caller, cudaMalloc, &ptr, size); });
  if (buffer != nullptr) ctx.retired.push_back(buffer);
  buffer = ptr;
  buffer_size = size;
  return ptr;
}

// Makes the context's workspace at least `bytes` long.
void* EnsureWorkspace(const CudartApi& rt, StreamContext& ctx, size_t bytes, bool capturing, const char* caller) {
  return EnsureBuffer(rt, ctx, ctx.workspace, ctx.workspace_size, bytes, capturing, caller);
}

// One cuDNN handle per device, pointed at the calling stream before every call; CudnnCallMutex() is held around
// the whole call, so two host threads never re-point it under each other. Not one per stream: a CUDA-graph capture runs on a
// fresh capture stream, and a handle made during a capture would call cudnnCreate there; with one per device, the
// handle exists from the direct run that comes before the first capture (runtime/model.py warms up that way).
std::mutex& CudnnCallMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}

cudnnHandle_t EnsureCudnnHandle(const CudartApi& rt, const CudnnApi& dnn, StreamContext& ctx, bool capturing,
                                const char* caller) {
  static auto* mu = new std::mutex();
  static auto* handles = new std::map<int, cudnnHandle_t>();
  cudnnHandle_t handle = nullptr;
  {
    std::lock_guard<std::mutex> lock(*mu);
    cudnnHandle_t& slot = (*handles)[ctx.device];
    if (slot == nullptr) {
      WithRelaxedCapture(rt, capturing, caller, [&] { TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnCreate, &slot); });
    }
    handle = slot;
  }
  TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnSetStream, handle, ctx.stream);
  ctx.cudnn = handle;
  return handle;
}

cublasLtHandle_t EnsureLtHandle(const CudartApi& rt, const CublasLtApi& lt, StreamContext& ctx, bool capturing,
                                const char* caller) {
  if (ctx.lt != nullptr) return ctx.lt;
  cublasLtHandle_t handle = nullptr;
  WithRelaxedCapture(rt, capturing, caller, [&] { TVM_INTEROP_CUBLAS_CALL(lt, caller, cublasLtCreate, &handle); });
  ctx.lt = handle;  // cuBLASLt takes the stream per call, not per handle
  return handle;
}

// ---------------------------------------------------------------------------------------------------------------
// Events.
// ---------------------------------------------------------------------------------------------------------------

// The handle returned to Relax. A plain struct with a magic number, not a per-library registry: two exported
// models loaded in one process each carry a copy of this extension and the last one loaded owns the globals, so a
// pool created through one copy may be used and freed through another; the layout is fixed by kEventPoolMagic.
constexpr uint64_t kEventPoolMagic = 0x7476'6d69'6576'0001ULL;  // "tvmiev" + layout version 1
constexpr uint64_t kEventPoolFreed = 0x7476'6d69'6576'dead;

struct EventPool {
  uint64_t magic;
  int32_t device;
  int32_t count;
  cudaEvent_t* events;
};

EventPool* PoolFromHandle(int64_t handle, const char* caller) {
  auto* pool = reinterpret_cast<EventPool*>(static_cast<intptr_t>(handle));
  if (handle == 0 || handle % alignof(EventPool) != 0) {
    TVM_FFI_THROW(ValueError) << caller << ": " << handle << " is not an event pool handle (from "
                              << kEventsCreate << ")";
  }
  if (pool->magic == kEventPoolFreed) {
    TVM_FFI_THROW(ValueError) << caller << ": the event pool was already freed";
  }
  if (pool->magic != kEventPoolMagic) {
    TVM_FFI_THROW(ValueError) << caller << ": " << handle << " is not an event pool handle (from "
                              << kEventsCreate << ")";
  }
  return pool;
}

// A pool of n events on device_id, created with `flags`, tagged `magic` (n checked against [min_n, 2^20]).
int64_t CreatePool(int64_t device_id, int64_t n, int64_t min_n, unsigned flags, uint64_t magic, const char* caller,
                   const char* why_min = "") {
  if (device_id < 0 || device_id > std::numeric_limits<int32_t>::max()) {
    TVM_FFI_THROW(ValueError) << caller << ": device_id must be >= 0, got " << device_id;
  }
  if (n < min_n || n > (int64_t(1) << 20)) {
    TVM_FFI_THROW(ValueError) << caller << ": n must be in [" << min_n << ", 2^20]" << why_min << ", got " << n;
  }
  const CudartApi& rt = Cudart().Get(caller);
  DeviceGuard guard(rt, static_cast<int>(device_id), caller);
  auto events = std::make_unique<cudaEvent_t[]>(n);
  for (int64_t k = 0; k < n; ++k) {
    cudaError_t err = rt.cudaEventCreateWithFlags(&events[k], flags);
    if (err != cudaSuccess) {
      for (int64_t j = 0; j < k; ++j) rt.cudaEventDestroy(events[j]);
      CheckCuda(rt, err, "cudaEventCreateWithFlags", caller);
    }
  }
  auto* pool = new EventPool{magic, static_cast<int32_t>(device_id), static_cast<int32_t>(n), events.release()};
  return static_cast<int64_t>(reinterpret_cast<intptr_t>(pool));
}

// Destroys a pool's events and marks it freed. cudaEventDestroy on an event still pending is legal: its resources
// are released once it completes. The struct itself is kept (a few bytes), so a second free or a late use is
// reported, not a crash.
void FreePool(EventPool* pool, const char* caller) {
  const CudartApi& rt = Cudart().Get(caller);
  DeviceGuard guard(rt, pool->device, caller);
  cudaError_t first = cudaSuccess;
  for (int32_t k = 0; k < pool->count; ++k) {
    cudaError_t err = rt.cudaEventDestroy(pool->events[k]);
    if (first == cudaSuccess) first = err;
  }
  pool->magic = kEventPoolFreed;
  delete[] pool->events;
  CheckCuda(rt, first, "cudaEventDestroy", caller);
}

// Timing disabled: such events are the cheapest to record and wait on.
int64_t EventsCreate(int64_t device_id, int64_t n) {
  return CreatePool(device_id, n, 1, cudaEventDisableTiming, kEventPoolMagic, kEventsCreate);
}

void EventsFree(int64_t handle) { FreePool(PoolFromHandle(handle, kEventsFree), kEventsFree); }

// A stream handle as Relax passes it: an int (runtime.Device_StreamCreate's result), an opaque pointer, or None
// (the legacy default stream).
cudaStream_t StreamArg(ffi::AnyView value, const char* caller, const char* name) {
  if (std::optional<int64_t> v = value.try_cast<int64_t>()) {
    return reinterpret_cast<cudaStream_t>(static_cast<intptr_t>(*v));
  }
  if (std::optional<void*> p = value.try_cast<void*>()) return static_cast<cudaStream_t>(*p);
  TVM_FFI_THROW(TypeError) << caller << ": " << name << " must be a stream handle (int or opaque pointer), got "
                           << value.GetTypeKey();
}

// Makes dst_stream wait for everything enqueued on src_stream so far.
//
// Reusing event k across calls and runs is safe: cudaStreamWaitEvent binds the wait to the most recent
// cudaEventRecord of the event *at the time of the wait call*; a later re-record of the same event changes
// neither the waits already enqueued nor their completion condition. Since the record and the wait are issued
// back to back here, every slot is always consistent, whatever k the lowering picks. Both calls are legal under
// CUDA-graph stream capture (they become a cross-stream dependency of the graph).
void EventSync(int64_t handle, int64_t k, ffi::AnyView src_stream, ffi::AnyView dst_stream) {
  const char* caller = kEventSync;
  EventPool* pool = PoolFromHandle(handle, caller);
  if (k < 0 || k >= pool->count) {
    TVM_FFI_THROW(ValueError) << caller << ": event index " << k << " out of range [0, " << pool->count << ")";
  }
  const cudaStream_t src = StreamArg(src_stream, caller, "src_stream");
  const cudaStream_t dst = StreamArg(dst_stream, caller, "dst_stream");
  if (src == dst) return;  // one stream is already ordered
  const CudartApi& rt = Cudart().Get(caller);
  DeviceGuard guard(rt, pool->device, caller);
  TVM_INTEROP_CUDA_CALL(rt, caller, cudaEventRecord, pool->events[k], src);
  TVM_INTEROP_CUDA_CALL(rt, caller, cudaStreamWaitEvent, dst, pool->events[k], 0);
}

// ---------------------------------------------------------------------------------------------------------------
// Timing events: in-context stage times.
// ---------------------------------------------------------------------------------------------------------------

// Why: a stage timed alone (the cost tables) does not cost what it costs inside the program (launch gaps, host
// work, neighbours), so the stage costs of a scheduler do not add up to the program. A program lowered with
// stage timing (passes.lower_streams, ``stage_timing``) records timing event k on the caller's stream when
// stage k begins; every stage has been joined into that stream by then, so event k - 1 -> k spans exactly the
// device time stage k - 1 occupied in context, host gaps included, and the times add up to the program.
// The pool is an EventPool with its own magic: its events keep timing enabled, and a handle of one kind is
// never accepted as the other.
constexpr uint64_t kTimingPoolMagic = 0x7476'6d69'7469'0001ULL;  // "tvmiti" + layout version 1

EventPool* TimingPoolFromHandle(int64_t handle, const char* caller) {
  auto* pool = reinterpret_cast<EventPool*>(static_cast<intptr_t>(handle));
  if (handle == 0 || handle % alignof(EventPool) != 0 ||
      (pool->magic != kTimingPoolMagic && pool->magic != kEventPoolFreed)) {
    TVM_FFI_THROW(ValueError) << caller << ": " << handle << " is not a timing pool handle (from "
                              << kTimingCreate << ")";
  }
  if (pool->magic == kEventPoolFreed) {
    TVM_FFI_THROW(ValueError) << caller << ": the timing pool was already freed";
  }
  return pool;
}

int64_t TimingCreate(int64_t device_id, int64_t n) {
  return CreatePool(device_id, n, 2, cudaEventDefault, kTimingPoolMagic, kTimingCreate, " (a time needs two events)");
}

void TimingRecord(int64_t handle, int64_t k, ffi::AnyView stream) {
  const char* caller = kTimingRecord;
  EventPool* pool = TimingPoolFromHandle(handle, caller);
  if (k < 0 || k >= pool->count) {
    TVM_FFI_THROW(ValueError) << caller << ": event index " << k << " out of range [0, " << pool->count << ")";
  }
  const cudaStream_t s = StreamArg(stream, caller, "stream");
  const CudartApi& rt = Cudart().Get(caller);
  DeviceGuard guard(rt, pool->device, caller);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  TVM_INTEROP_CUDA_CALL(rt, caller, cudaStreamIsCapturing, s, &status);
  if (status != cudaStreamCaptureStatusNone) {
    // inside a captured graph a timing event would become a graph node timed at capture, not at replay
    TVM_FFI_THROW(RuntimeError) << caller << ": stage timing cannot run inside a CUDA-graph capture; time the "
                                << "program's direct (uncaptured) function";
  }
  TVM_INTEROP_CUDA_CALL(rt, caller, cudaEventRecord, pool->events[k], s);
}

// Waits for event n - 1, then returns the n - 1 times (milliseconds) between consecutive events.
ffi::Array<double> TimingRead(int64_t handle, int64_t n) {
  const char* caller = kTimingRead;
  EventPool* pool = TimingPoolFromHandle(handle, caller);
  if (n < 2 || n > pool->count) {
    TVM_FFI_THROW(ValueError) << caller << ": n must be in [2, " << pool->count << "], got " << n;
  }
  const CudartApi& rt = Cudart().Get(caller);
  DeviceGuard guard(rt, pool->device, caller);
  TVM_INTEROP_CUDA_CALL(rt, caller, cudaEventSynchronize, pool->events[n - 1]);
  ffi::Array<double> out;
  for (int64_t k = 1; k < n; ++k) {
    float ms = 0.0f;
    cudaError_t err = rt.cudaEventElapsedTime(&ms, pool->events[k - 1], pool->events[k]);
    if (err != cudaSuccess) {
      rt.cudaGetLastError();
      TVM_FFI_THROW(RuntimeError) << caller << ": no time between events " << (k - 1) << " and " << k
                                  << " (were both recorded by a finished call of the timed program?): "
                                  << rt.cudaGetErrorName(err) << " (" << rt.cudaGetErrorString(err) << ")";
    }
    out.push_back(static_cast<double>(ms));
  }
  return out;
}

void TimingFree(int64_t handle) { FreePool(TimingPoolFromHandle(handle, kTimingFree), kTimingFree); }

// ---------------------------------------------------------------------------------------------------------------
// Held streams: device time, not the host's issue rate.
// ---------------------------------------------------------------------------------------------------------------

// Why: timing N calls back to back with events (TVM's time_evaluator) measures device time only when the device
// is the bottleneck. A call with tens of microseconds of host work (a legacy cuDNN call: ~40 us, measured on the
// H100 run of 2026-11-26) keeps the device waiting between kernels, so its short convolutions were timed at the
// host's issue rate. In a CUDA graph that host work is gone: a unit table that drives graph programs needs the
// device time. A held stream waits at a host function until the host has queued every call to time (or the
// timeout passed), so the calls then run back to back and events around them measure the device alone. The
// timeout keeps a call that synchronises internally (or a caller that never releases) from waiting for ever;
// whether it fired is reported, so a time that was not held is never taken for a device time.
struct StreamGate {
  explicit StreamGate(std::chrono::milliseconds t) : timeout(t) {}
  const std::chrono::milliseconds timeout;
  std::atomic<bool> open{false};
  std::atomic<bool> timed_out{false};
  static void CUDART_CB Wait(void* self) {
    auto* gate = static_cast<StreamGate*>(self);
    const auto until = std::chrono::steady_clock::now() + gate->timeout;
    while (!gate->open.load(std::memory_order_acquire)) {
      if (std::chrono::steady_clock::now() >= until) {
        gate->timed_out.store(true, std::memory_order_release);
        return;
      }
      std::this_thread::yield();
    }
  }
};

// A hold handed to Python: the gate, and where it waits. Live holds are kept in a set, so a handle that is not
// one (or was already released) is refused by name instead of being dereferenced.
struct StreamHold {
  StreamHold(int32_t d, cudaStream_t s, std::chrono::milliseconds t) : device(d), stream(s), gate(t) {}
  int32_t device;
  cudaStream_t stream;
  StreamGate gate;
};

std::mutex& HoldsMutex() {
  static std::mutex m;
  return m;
}

std::set<StreamHold*>& LiveHolds() {
  static std::set<StreamHold*> holds;
  return holds;
}

int64_t StreamHoldCreate(int64_t device_id, ffi::AnyView stream, int64_t timeout_ms) {
  const char* caller = kStreamHold;
  if (device_id < 0) TVM_FFI_THROW(ValueError) << caller << ": device_id must be >= 0, got " << device_id;
  if (timeout_ms < 1 || timeout_ms > 60000) {
    TVM_FFI_THROW(ValueError) << caller << ": timeout_ms must be in [1, 60000], got " << timeout_ms;
  }
  const cudaStream_t s = StreamArg(stream, caller, "stream");
  const CudartApi& rt = Cudart().Get(caller);
  DeviceGuard guard(rt, static_cast<int>(device_id), caller);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  TVM_INTEROP_CUDA_CALL(rt, caller, cudaStreamIsCapturing, s, &status);
  if (status != cudaStreamCaptureStatusNone) {
    // a host function in a captured graph would hold every replay of the graph, not this measurement
    TVM_FFI_THROW(RuntimeError) << caller << ": a stream cannot be held inside a CUDA-graph capture";
  }
  auto hold = std::make_unique<StreamHold>(static_cast<int32_t>(device_id), s, std::chrono::milliseconds(timeout_ms));
  TVM_INTEROP_CUDA_CALL(rt, caller, cudaLaunchHostFunc, s, &StreamGate::Wait, &hold->gate);
  std::lock_guard<std::mutex> lock(HoldsMutex());
  StreamHold* raw = hold.release();
  LiveHolds().insert(raw);
  return static_cast<int64_t>(reinterpret_cast<intptr_t>(raw));
}

// Opens the gate and waits for the stream (so the host function has returned before the hold is freed): true when
// the stream was held until now, false when the timeout had released it earlier (the calls queued after that
// point ran at the host's pace, and a time around them is not a device time).
bool StreamHoldRelease(int64_t handle) {
  const char* caller = kStreamRelease;
  StreamHold* hold = reinterpret_cast<StreamHold*>(static_cast<intptr_t>(handle));
  {
    std::lock_guard<std::mutex> lock(HoldsMutex());
    if (LiveHolds().erase(hold) == 0) {
      TVM_FFI_THROW(ValueError) << caller << ": " << handle << " is not a held stream (from " << kStreamHold
                                << "), or it was already released";
    }
  }
  std::unique_ptr<StreamHold> owned(hold);
  owned->gate.open.store(true, std::memory_order_release);
  const CudartApi& rt = Cudart().Get(caller);
  DeviceGuard guard(rt, owned->device, caller);
  const cudaError_t err = rt.cudaStreamSynchronize(owned->stream);
  if (err != cudaSuccess) {
    // the host function may not have run (a stream in error): keep the gate alive rather than free what it reads
    owned.release();
    CheckCuda(rt, err, "cudaStreamSynchronize", caller);
  }
  return !owned->gate.timed_out.load(std::memory_order_acquire);
}

// ---------------------------------------------------------------------------------------------------------------
// Host time of library calls.
// ---------------------------------------------------------------------------------------------------------------

// Where the host time of a steady-state library call goes (one whose plan and algorithm already existed, outside a
// capture): "prepare" is everything of ours before the library's compute call (argument checks, library and
// context lookups, device guard, capture query, locks, handle and stream binding, workspace), "library" the
// compute call(s) themselves (cuDNN / cuBLASLt host work and the launches). Without a CUDA graph a call's host
// time is on the critical path of small kernels: this tells whether it is ours to cut or the library's.
struct CallStats {
  std::atomic<int64_t> calls{0}, prepare_ns{0}, library_ns{0};
};
enum StatsSlot { kConvStats = 0, kDenseStats = 1 };

CallStats& Stats(StatsSlot slot) {
  static auto* stats = new std::array<CallStats, 2>();
  return (*stats)[slot];
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void RecordCall(StatsSlot slot, int64_t start, int64_t library_start, int64_t end) {
  CallStats& s = Stats(slot);
  s.calls.fetch_add(1, std::memory_order_relaxed);
  s.prepare_ns.fetch_add(library_start - start, std::memory_order_relaxed);
  s.library_ns.fetch_add(end - library_start, std::memory_order_relaxed);
}

// {"conv2d": {"calls": n, "prepare_us": mean, "library_us": mean}, "dense": {...}}; `reset` zeroes the counters
// after reading them (so a caller can attribute calls to one program).
std::string CallStatsJson(bool reset) {
  std::ostringstream os;
  const char* names[] = {"conv2d", "dense"};
  os << "{";
  for (int i = 0; i < 2; ++i) {
    CallStats& s = Stats(static_cast<StatsSlot>(i));
    const int64_t n = reset ? s.calls.exchange(0) : s.calls.load();
    const int64_t prep = reset ? s.prepare_ns.exchange(0) : s.prepare_ns.load();
    const int64_t lib = reset ? s.library_ns.exchange(0) : s.library_ns.load();
    const double d = n > 0 ? 1e3 * static_cast<double>(n) : 1.0;  // ns totals -> us means
    os << (i ? ", " : "") << "\"" << names[i] << "\": {\"calls\": " << n << ", \"prepare_us\": " << prep / d
       << ", \"library_us\": " << lib / d << "}";
  }
  os << "}";
  return os.str();
}

// ---------------------------------------------------------------------------------------------------------------
// cuDNN conv2d.
// ---------------------------------------------------------------------------------------------------------------

constexpr const char* kConvLayout =
    "[stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, has_bias, has_z, relu, tf32]";

struct ConvArgs {
  int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups;
  bool has_bias, has_z, relu, tf32;
  DLTensor *x, *w, *bias = nullptr, *z = nullptr, *out;
  int device;
};

// Parses and validates everything; throws before any library is touched.
ConvArgs ParseConvArgs(ffi::PackedArgs args) {
  const char* caller = kConv2d;
  std::vector<int64_t> p = ParamsArg(args, caller, 11, kConvLayout);
  ConvArgs a;
  a.stride_h = p[0], a.stride_w = p[1], a.pad_h = p[2], a.pad_w = p[3], a.dil_h = p[4], a.dil_w = p[5];
  a.groups = p[6];
  const char* flag_names[] = {"has_bias", "has_z", "relu", "tf32"};
  for (int i = 0; i < 4; ++i) CheckFlag(p[7 + i], caller, flag_names[i]);
  a.has_bias = p[7], a.has_z = p[8], a.relu = p[9], a.tf32 = p[10];
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (a.stride_h < 1 || a.stride_w < 1 || a.dil_h < 1 || a.dil_w < 1 || a.pad_h < 0 || a.pad_w < 0 ||
      a.groups < 1 || std::max({a.stride_h, a.stride_w, a.dil_h, a.dil_w, a.pad_h, a.pad_w, a.groups}) > kMax) {
    TVM_FFI_THROW(ValueError) << caller << ": invalid params " << kConvLayout << ": strides and dilations must be "
                              << ">= 1, pads >= 0, groups >= 1 (got stride " << a.stride_h << "x" << a.stride_w
                              << ", pad " << a.pad_h << "x" << a.pad_w << ", dilation " << a.dil_h << "x"
                              << a.dil_w << ", groups " << a.groups << ")";
  }
  CheckArity(args, 4 + a.has_bias + a.has_z, caller, "(params, x, w, [bias if has_bias], [z if has_z], out)");
  int i = 1;
  a.x = TensorArg(args, i++, caller, "x");
  a.w = TensorArg(args, i++, caller, "w");
  if (a.has_bias) a.bias = TensorArg(args, i++, caller, "bias");
  if (a.has_z) a.z = TensorArg(args, i++, caller, "z");
  a.out = TensorArg(args, i++, caller, "out");

  CheckNdim(a.x, 4, caller, "x (NCHW)");
  CheckNdim(a.w, 4, caller, "w (OIHW)");
  CheckNdim(a.out, 4, caller, "out (NCHW)");
  std::vector<std::pair<const DLTensor*, const char*>> all = {{a.x, "x"}, {a.w, "w"}, {a.out, "out"}};
  if (a.bias) all.push_back({a.bias, "bias"});
  if (a.z) all.push_back({a.z, "z"});
  for (const auto& [t, name] : all) CheckTensor(t, caller, name);

  const int64_t N = a.x->shape[0], C = a.x->shape[1], H = a.x->shape[2], W = a.x->shape[3];
  const int64_t O = a.w->shape[0], CG = a.w->shape[1], KH = a.w->shape[2], KW = a.w->shape[3];
  if (C % a.groups != 0 || O % a.groups != 0 || CG * a.groups != C) {
    TVM_FFI_THROW(ValueError) << caller << ": x " << ShapeStr(a.x) << " and w " << ShapeStr(a.w) << " do not fit "
                              << "groups=" << a.groups << ": need C % groups == 0, O % groups == 0 and "
                              << "w.shape[1] * groups == C";
  }
  const int64_t OH = (H + 2 * a.pad_h - a.dil_h * (KH - 1) - 1) / a.stride_h + 1;
  const int64_t OW = (W + 2 * a.pad_w - a.dil_w * (KW - 1) - 1) / a.stride_w + 1;
  const int64_t want[4] = {N, O, OH, OW};
  if (H + 2 * a.pad_h < a.dil_h * (KH - 1) + 1 || W + 2 * a.pad_w < a.dil_w * (KW - 1) + 1 ||
      !std::equal(want, want + 4, a.out->shape)) {
    TVM_FFI_THROW(ValueError) << caller << ": out has shape " << ShapeStr(a.out) << " but x " << ShapeStr(a.x)
                              << " convolved with w " << ShapeStr(a.w) << " (stride " << a.stride_h << "x"
                              << a.stride_w << ", pad " << a.pad_h << "x" << a.pad_w << ", dilation " << a.dil_h
                              << "x" << a.dil_w << ") gives [" << N << ", " << O << ", " << OH << ", " << OW << "]";
  }
  if (a.bias && Numel(a.bias) != O) {
    TVM_FFI_THROW(ValueError) << caller << ": bias has shape " << ShapeStr(a.bias) << " (" << Numel(a.bias)
                              << " elements); it must have O = " << O << " elements";
  }
  if (a.z && !std::equal(a.out->shape, a.out->shape + 4, a.z->shape, a.z->shape + a.z->ndim)) {
    TVM_FFI_THROW(ValueError) << caller << ": z has shape " << ShapeStr(a.z) << "; it must match out "
                              << ShapeStr(a.out);
  }
  CheckCudaDevice(all, caller);
  a.device = a.x->device.device_id;
  return a;
}

// The algorithm chosen for one convolution: found once per key, process-wide.
struct ConvAlgo {
  cudnnConvolutionFwdAlgo_t algo;
  cudnnMathType_t math;
  size_t workspace;
};

std::vector<int64_t> ConvKey(const ConvArgs& a) {
  return {a.device,      a.x->shape[0], a.x->shape[1], a.x->shape[2], a.x->shape[3], a.w->shape[0],
          a.w->shape[2], a.w->shape[3], a.stride_h,    a.stride_w,    a.pad_h,       a.pad_w,
          a.dil_h,       a.dil_w,       a.groups,      a.tf32};
}

std::mutex& ConvAlgoMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::map<std::vector<int64_t>, ConvAlgo>& ConvAlgoCache() {
  static auto* cache = new std::map<std::vector<int64_t>, ConvAlgo>();
  return *cache;
}

// Fused configurations (ConvKey + relu + algorithm) that cuDNN refused once: the unfused path from then on.
// Process-wide (guarded by ConvAlgoMutex), not per stream: a CUDA-graph capture runs on a fresh stream, and a
// per-stream record would make the capture retry (and so re-plan inside cuDNN) a call the warm-up run already
// saw refused.
std::set<std::vector<int64_t>>& FusedRefused() {
  static auto* refused = new std::set<std::vector<int64_t>>();
  return *refused;
}

// Descriptors of one convolution on one stream (host objects; creating them per call would cost microseconds).
struct ConvPlan {
  const CudnnApi* dnn = nullptr;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnActivationDescriptor_t relu = nullptr, identity = nullptr;
  bool have_algo = false;
  ConvAlgo algo{};
  ~ConvPlan() {
    if (!dnn) return;
    if (x) dnn->cudnnDestroyTensorDescriptor(x);
    if (y) dnn->cudnnDestroyTensorDescriptor(y);
    if (bias) dnn->cudnnDestroyTensorDescriptor(bias);
    if (w) dnn->cudnnDestroyFilterDescriptor(w);
    if (conv) dnn->cudnnDestroyConvolutionDescriptor(conv);
    if (relu) dnn->cudnnDestroyActivationDescriptor(relu);
    if (identity) dnn->cudnnDestroyActivationDescriptor(identity);
  }
};

cudnnMathType_t BaseMath(const ConvArgs& a) {
  // FMA_MATH forbids tensor cores and so TF32; DEFAULT_MATH permits TF32 for float32 data.
  return a.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

std::unique_ptr<ConvPlan> MakeConvPlan(const CudnnApi& dnn, const ConvArgs& a) {
  const char* caller = kConv2d;
  auto p = std::make_unique<ConvPlan>();
  p->dnn = &dnn;
  auto i32 = [](int64_t v) { return static_cast<int>(v); };
  const int64_t* xs = a.x->shape;
  const int64_t* ws = a.w->shape;
  const int64_t* ys = a.out->shape;
  TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnCreateTensorDescriptor, &p->x);
  TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnSetTensor4dDescriptor, p->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                         i32(xs[0]), i32(xs[1]), i32(xs[2]), i32(xs[3]));
  TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnCreateTensorDescriptor, &p->y);
  TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnSetTensor4dDescriptor, p->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                         i32(ys[0]), i32(ys[1]), i32(ys[2]), i32(ys[3]));
  TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnCreateTensorDescriptor, &p->bias);
  TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnSetTensor4dDescriptor, p->bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1,
                         i32(ws[0]), 1, 1);
  TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnCreateFilterDescriptor, &p->w);
  TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnSetFilter4dDescriptor, p->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                         i32(ws[0]), i32(ws[1]), i32(ws[2]), i32(ws[3]));
  TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnCreateConvolutionDescriptor, &p->conv);
  // Relax's conv2d is a cross-correlation (no kernel flip).
  TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnSetConvolution2dDescriptor, p->conv, i32(a.pad_h), i32(a.pad_w),
                         i32(a.stride_h), i32(a.stride_w), i32(a.dil_h), i32(a.dil_w), CUDNN_CROSS_CORRELATION,
                         CUDNN_DATA_FLOAT);
  TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnSetConvolutionGroupCount, p->conv, i32(a.groups));
  TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnSetConvolutionMathType, p->conv, BaseMath(a));
  TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnCreateActivationDescriptor, &p->relu);
  TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnSetActivationDescriptor, p->relu, CUDNN_ACTIVATION_RELU,
                         CUDNN_NOT_PROPAGATE_NAN, 0.0);
  TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnCreateActivationDescriptor, &p->identity);
  TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnSetActivationDescriptor, p->identity, CUDNN_ACTIVATION_IDENTITY,
                         CUDNN_NOT_PROPAGATE_NAN, 0.0);
  return p;
}

// An environment switch: set to "1".
bool EnvFlag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == "1";
}

// A positive integer from the environment, else `fallback`.
int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  long long n = v ? std::atoll(v) : 0;
  return n > 0 ? n : fallback;
}

// Upper bound of the workspace any algorithm may use (TVM_INTEROP_CUDNN_WORKSPACE_MB, default 1024 MiB).
size_t WorkspaceLimit() {
  static const size_t limit = static_cast<size_t>(EnvInt("TVM_INTEROP_CUDNN_WORKSPACE_MB", 1024)) << 20;
  return limit;
}

// A temporary device buffer of `size` bytes for an algorithm search, halved while the device is out of memory
// (the candidates needing more then drop out); `size` is set to what was allocated (0: nothing).
void* AllocateScratch(const CudartApi& rt, size_t& size) {
  void* buffer = nullptr;
  while (size > 0 && rt.cudaMalloc(&buffer, size) != cudaSuccess) {
    rt.cudaGetLastError();
    buffer = nullptr;
    size /= 2;
  }
  return buffer;
}

// The best algorithm by measurement (cudnnFindConvolutionForwardAlgorithmEx): runs every algorithm on the real
// buffers (out is overwritten; the call that follows writes it again), so never during a capture. Its scratch
// memory is a temporary allocation, freed right after: only the winner's workspace is kept per stream.
ConvAlgo FindConvAlgo(const CudartApi& rt, const CudnnApi& dnn, cudnnHandle_t handle, const ConvPlan& p,
                      const ConvArgs& a) {
  const char* caller = kConv2d;
  size_t scratch = 0;
  for (int algo = 0; algo < CUDNN_CONVOLUTION_FWD_ALGO_COUNT; ++algo) {
    size_t need = 0;
    if (dnn.cudnnGetConvolutionForwardWorkspaceSize(handle, p.x, p.w, p.conv, p.y,
                                                    static_cast<cudnnConvolutionFwdAlgo_t>(algo),
                                                    &need) == CUDNN_STATUS_SUCCESS &&
        need <= WorkspaceLimit()) {
      scratch = std::max(scratch, need);
    }
  }
  void* buffer = AllocateScratch(rt, scratch);  // out of memory: big-workspace algorithms drop out
  int max_count = 0;
  TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnGetConvolutionForwardAlgorithmMaxCount, handle, &max_count);
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(std::max(max_count, 1));
  int returned = 0;
  cudnnStatus_t status = dnn.cudnnFindConvolutionForwardAlgorithmEx(
      handle, p.x, DataPtr(a.x), p.w, DataPtr(a.w), p.conv, p.y, DataPtr(a.out), static_cast<int>(perf.size()),
      &returned, perf.data(), buffer, scratch);
  if (buffer != nullptr) rt.cudaFree(buffer);
  CheckCudnn(dnn, status, "cudnnFindConvolutionForwardAlgorithmEx", caller);
  for (int i = 0; i < returned; ++i) {  // sorted by time: the first that ran is the fastest
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= scratch) {
      return {perf[i].algo, a.tf32 ? perf[i].mathType : CUDNN_FMA_MATH, perf[i].memory};
    }
  }
  TVM_FFI_THROW(RuntimeError) << caller << ": cudnnFindConvolutionForwardAlgorithmEx found no algorithm that runs "
                              << "x " << ShapeStr(a.x) << " * w " << ShapeStr(a.w) << " (groups " << a.groups << ")";
}

// cuDNN's heuristic choice (cudnnGetConvolutionForwardAlgorithm_v7): host-only, so usable during a capture.
ConvAlgo HeuristicConvAlgo(const CudnnApi& dnn, cudnnHandle_t handle, const ConvPlan& p, const ConvArgs& a) {
  const char* caller = kConv2d;
  int max_count = 0;
  TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnGetConvolutionForwardAlgorithmMaxCount, handle, &max_count);
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(std::max(max_count, 1));
  int returned = 0;
  TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnGetConvolutionForwardAlgorithm_v7, handle, p.x, p.w, p.conv, p.y,
                         static_cast<int>(perf.size()), &returned, perf.data());
  for (int i = 0; i < returned; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    size_t need = 0;  // ask for the exact size rather than trusting the heuristic's estimate
    if (dnn.cudnnGetConvolutionForwardWorkspaceSize(handle, p.x, p.w, p.conv, p.y, perf[i].algo, &need) !=
            CUDNN_STATUS_SUCCESS ||
        need > WorkspaceLimit()) {
      continue;
    }
    return {perf[i].algo, a.tf32 ? perf[i].mathType : CUDNN_FMA_MATH, need};
  }
  TVM_FFI_THROW(RuntimeError) << caller << ": cudnnGetConvolutionForwardAlgorithm_v7 proposed no usable algorithm "
                              << "for x " << ShapeStr(a.x) << " * w " << ShapeStr(a.w);
}

// The algorithm for this convolution: the process-wide cache, else a search (measured outside a capture and
// cached; heuristic and uncached during a capture, since measuring would run kernels inside the graph).
ConvAlgo ChooseConvAlgo(const CudartApi& rt, const CudnnApi& dnn, cudnnHandle_t handle, const ConvPlan& p,
                        const ConvArgs& a, bool capturing) {
  const std::vector<int64_t> key = ConvKey(a);
  {
    std::lock_guard<std::mutex> lock(ConvAlgoMutex());
    auto it = ConvAlgoCache().find(key);
    if (it != ConvAlgoCache().end()) return it->second;
  }
  if (capturing) return HeuristicConvAlgo(dnn, handle, p, a);
  // The search runs under the lock: two streams meeting a new shape at once measure it once, and concurrent
  // searches would disturb each other's timings.
  std::lock_guard<std::mutex> lock(ConvAlgoMutex());
  auto it = ConvAlgoCache().find(key);
  if (it != ConvAlgoCache().end()) return it->second;
  ConvAlgo found = FindConvAlgo(rt, dnn, handle, p, a);
  ConvAlgoCache().emplace(key, found);
  return found;
}

// out = act(out + z + bias), in place, as separate cuDNN calls (after a convolution that wrote out alone).
void RunConvEpilogue(const CudnnApi& dnn, cudnnHandle_t handle, const ConvPlan& p, const ConvArgs& a) {
  const char* caller = kConv2d;
  const float one = 1.0f, zero = 0.0f;
  if (a.has_z) {
    TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnAddTensor, handle, &one, p.y, DataPtr(a.z), &one, p.y, DataPtr(a.out));
  }
  if (a.has_bias) {  // [1, O, 1, 1] broadcast over N, H, W
    TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnAddTensor, handle, &one, p.bias, DataPtr(a.bias), &one, p.y,
                           DataPtr(a.out));
  }
  if (a.relu) {  // in place is allowed
    TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnActivationForward, handle, p.relu, &one, p.y, DataPtr(a.out), &zero,
                           p.y, DataPtr(a.out));
  }
}

void RunConvUnfused(const CudnnApi& dnn, cudnnHandle_t handle, const ConvPlan& p, const ConvArgs& a, void* ws,
                    size_t ws_size) {
  const char* caller = kConv2d;
  const float one = 1.0f, zero = 0.0f;
  TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnConvolutionForward, handle, &one, p.x, DataPtr(a.x), p.w, DataPtr(a.w),
                         p.conv, p.algo.algo, ws, ws_size, &zero, p.y, DataPtr(a.out));
  RunConvEpilogue(dnn, handle, p, a);
}

// cudnnConvolutionBiasActivationForward: y = act(alpha1 * conv(x, w) + alpha2 * z + bias). cuDNN requires a bias,
// and allows the identity activation only with IMPLICIT_PRECOMP_GEMM. Returns false when cuDNN refuses the
// configuration (a CUDNN_STATUS_NOT_SUPPORTED* status), so the caller falls back to the unfused path.
bool RunConvFused(const CudnnApi& dnn, cudnnHandle_t handle, const ConvPlan& p, const ConvArgs& a, void* ws,
                  size_t ws_size) {
  const float one = 1.0f;
  const float alpha2 = a.has_z ? 1.0f : 0.0f;
  // Without z, pass out itself with alpha2 = 0 (as PyTorch does): the z term then contributes nothing.
  const void* z = a.has_z ? DataPtr(a.z) : DataPtr(a.out);
  cudnnStatus_t status = dnn.cudnnConvolutionBiasActivationForward(
      handle, &one, p.x, DataPtr(a.x), p.w, DataPtr(a.w), p.conv, p.algo.algo, ws, ws_size, &alpha2, p.y, z, p.bias,
      DataPtr(a.bias), a.relu ? p.relu : p.identity, p.y, DataPtr(a.out));
  // cuDNN 9 reports refusals with sub-codes (CUDNN_STATUS_NOT_SUPPORTED_SHAPE = 3002, ..._LAYOUT, ...; see
  // cudnn_graph.h): compare the category (CUDNN_STATUS_CATEGORY, thousands), not the bare 3000, or a refusal
  // would be raised as an error instead of falling back.
  if (CUDNN_STATUS_CATEGORY(status) == CUDNN_STATUS_NOT_SUPPORTED) return false;
  CheckCudnn(dnn, status, "cudnnConvolutionBiasActivationForward", kConv2d);
  return true;
}

// The legacy path: cudnnConvolutionBiasActivationForward where cuDNN takes the configuration (remembered
// process-wide when it refuses), else the convolution and its epilogue as separate calls.
void RunConvLegacy(const CudnnApi& dnn, cudnnHandle_t handle, const ConvPlan& p, const ConvArgs& a, void* ws,
                   size_t ws_size) {
  const bool fusable = a.has_bias && (a.relu || p.algo.algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM);
  if (fusable) {
    std::vector<int64_t> fused_key = ConvKey(a);
    fused_key.push_back(a.relu);
    fused_key.push_back(static_cast<int64_t>(p.algo.algo));
    bool refused;
    {
      std::lock_guard<std::mutex> cache_lock(ConvAlgoMutex());
      refused = FusedRefused().count(fused_key) > 0;
    }
    if (!refused) {
      if (RunConvFused(dnn, handle, p, a, ws, ws_size)) return;
      std::lock_guard<std::mutex> cache_lock(ConvAlgoMutex());
      FusedRefused().insert(std::move(fused_key));
    }
  }
  RunConvUnfused(dnn, handle, p, a, ws, ws_size);
}

#include "cudnn_engines.h"  // NOLINT(build/include): the graph-API engines, in this namespace

void Conv2d(ffi::PackedArgs args, ffi::Any* rv) {
  const char* caller = kConv2d;
  const int64_t t_start = NowNs();
  const ConvArgs a = ParseConvArgs(args);  // all validation first: no library is needed to refuse a bad call
  const CudartApi& rt = Cudart().Get(caller);
  const CudnnApi& dnn = Cudnn().Get(caller);
  DeviceGuard guard(rt, a.device, caller);
  const cudaStream_t stream = CurrentStream(a.device);
  const bool capturing = IsCapturing(rt, stream);
  StreamContext& ctx = GetStreamContext(a.device, stream);
  std::lock_guard<std::mutex> call_lock(CudnnCallMutex());   // the device's handle is shared (see above)
  std::lock_guard<std::mutex> lock(ctx.mu);
  cudnnHandle_t handle = EnsureCudnnHandle(rt, dnn, ctx, capturing, caller);

  std::unique_ptr<ConvPlan>& plan = ctx.conv_plans[ConvKey(a)];
  const bool steady = !capturing && plan != nullptr && plan->have_algo;
  if (!plan) plan = MakeConvPlan(dnn, a);
  if (!plan->have_algo) {
    // Search under the base math type: a heuristic pick made during a capture may have left another one on this
    // descriptor, and Find/the heuristic only consider what the descriptor's math type permits.
    TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnSetConvolutionMathType, plan->conv, BaseMath(a));
    ConvAlgo algo = ChooseConvAlgo(rt, dnn, handle, *plan, a, capturing);
    TVM_INTEROP_CUDNN_CALL(dnn, caller, cudnnSetConvolutionMathType, plan->conv, algo.math);
    // The sizes above were taken under the base math type; ask again under the one the call will run with and
    // keep the larger, so the workspace can never be short (a short workspace fails the call).
    size_t need = 0;
    if (dnn.cudnnGetConvolutionForwardWorkspaceSize(handle, plan->x, plan->w, plan->conv, plan->y, algo.algo,
                                                    &need) == CUDNN_STATUS_SUCCESS) {
      algo.workspace = std::max(algo.workspace, need);
    }
    // A heuristic pick (during a capture) is not remembered: the next call outside a capture measures.
    std::lock_guard<std::mutex> cache_lock(ConvAlgoMutex());
    plan->have_algo = ConvAlgoCache().count(ConvKey(a)) > 0;
    plan->algo = algo;
  }
  void* ws = EnsureWorkspace(rt, ctx, plan->algo.workspace, capturing, caller);
  const size_t ws_size = ctx.workspace_size;
  auto legacy = [&] { RunConvLegacy(dnn, handle, *plan, a, ws, ws_size); };

  // Policy "measured": the graph-API engines and the legacy path timed once per shape (outside a capture), the
  // fastest kept (cudnn_engines.h). A capture that meets a shape not measured yet runs the legacy path.
  std::shared_ptr<ConvChoice> choice;
  bool chosen_before = true;
  if (CurrentPolicy() == EnginePolicy::kMeasured) {
    const std::vector<int64_t> key = ChoiceKey(a);
    {
      std::lock_guard<std::mutex> cache_lock(ConvAlgoMutex());
      auto it = ConvChoices().find(key);
      if (it != ConvChoices().end()) choice = it->second;
    }
    if (!choice && !capturing) {
      chosen_before = false;
      choice = MeasureConvChoice(rt, dnn, handle, stream, *plan, a, legacy);
      std::lock_guard<std::mutex> cache_lock(ConvAlgoMutex());
      choice = ConvChoices().emplace(key, choice).first->second;
    }
  }
  const bool graph = choice != nullptr && choice->graph;
  void* graph_ws = graph ? EnsureWorkspace(rt, ctx, static_cast<size_t>(choice->workspace), capturing, caller)
                         : nullptr;
  const int64_t t_library = NowNs();
  if (graph) {
    CheckCudnn(dnn, ExecutePlan(dnn, handle, *choice->plan, *choice->op, a, graph_ws, &choice->packs),
               "cudnnBackendExecute", caller);
    if (!choice->op->fused) RunConvEpilogue(dnn, handle, *plan, a);
  } else {
    legacy();
  }
  if (steady && chosen_before) RecordCall(kConvStats, t_start, t_library, NowNs());
  (void)rv;
}

// ---------------------------------------------------------------------------------------------------------------
// cuBLASLt dense.
// ---------------------------------------------------------------------------------------------------------------

constexpr const char* kDenseLayout = "[has_bias, relu, w_transposed, tf32]";
constexpr size_t kDenseWorkspaceLimit = size_t(32) << 20;  // cuBLAS's recommendation for Hopper

struct DenseArgs {
  bool has_bias, relu, w_transposed, tf32;
  DLTensor *x, *w, *bias = nullptr, *out;
  int64_t M, N, K;
  int device;
};

DenseArgs ParseDenseArgs(ffi::PackedArgs args) {
  const char* caller = kDense;
  std::vector<int64_t> p = ParamsArg(args, caller, 4, kDenseLayout);
  const char* flag_names[] = {"has_bias", "relu", "w_transposed", "tf32"};
  for (int i = 0; i < 4; ++i) CheckFlag(p[i], caller, flag_names[i]);
  DenseArgs a;
  a.has_bias = p[0], a.relu = p[1], a.w_transposed = p[2], a.tf32 = p[3];
  CheckArity(args, 4 + a.has_bias, caller, "(params, x, w, [bias if has_bias], out)");
  int i = 1;
  a.x = TensorArg(args, i++, caller, "x");
  a.w = TensorArg(args, i++, caller, "w");
  if (a.has_bias) a.bias = TensorArg(args, i++, caller, "bias");
  a.out = TensorArg(args, i++, caller, "out");
  // x may carry leading batch dimensions ([..., M, K]): contiguous row-major, they fold into M.
  if (a.x->ndim < 2) TVM_FFI_THROW(ValueError) << caller << ": x must be at least 2-D, got " << ShapeStr(a.x);
  CheckNdim(a.w, 2, caller, a.w_transposed ? "w ([N, K])" : "w ([K, N])");
  if (a.out->ndim != a.x->ndim) {
    TVM_FFI_THROW(ValueError) << caller << ": out " << ShapeStr(a.out) << " must have the rank of x "
                              << ShapeStr(a.x);
  }
  std::vector<std::pair<const DLTensor*, const char*>> all = {{a.x, "x"}, {a.w, "w"}, {a.out, "out"}};
  if (a.bias) all.push_back({a.bias, "bias"});
  for (const auto& [t, name] : all) CheckTensor(t, caller, name);

  a.K = a.x->shape[a.x->ndim - 1];
  a.M = Numel(a.x) / a.K;
  const int64_t wk = a.w_transposed ? a.w->shape[1] : a.w->shape[0];
  a.N = a.w_transposed ? a.w->shape[0] : a.w->shape[1];
  if (wk != a.K) {
    TVM_FFI_THROW(ValueError) << caller << ": x " << ShapeStr(a.x) << " and w " << ShapeStr(a.w)
                              << " disagree on K (w_transposed=" << a.w_transposed << " expects w as "
                              << (a.w_transposed ? "[N, K]" : "[K, N]") << ")";
  }
  bool out_ok = a.out->shape[a.out->ndim - 1] == a.N &&
                std::equal(a.x->shape, a.x->shape + a.x->ndim - 1, a.out->shape);
  if (!out_ok) {
    TVM_FFI_THROW(ValueError) << caller << ": out has shape " << ShapeStr(a.out) << "; x " << ShapeStr(a.x)
                              << " times w " << ShapeStr(a.w) << " needs x's leading dimensions then N = " << a.N;
  }
  if (a.bias && Numel(a.bias) != a.N) {
    TVM_FFI_THROW(ValueError) << caller << ": bias has shape " << ShapeStr(a.bias) << " (" << Numel(a.bias)
                              << " elements); it must have N = " << a.N << " elements";
  }
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (a.M > kMax) TVM_FFI_THROW(ValueError) << caller << ": M = " << a.M << " is too large (limit 2^31 - 1)";
  CheckCudaDevice(all, caller);
  a.device = a.x->device.device_id;
  return a;
}


struct DensePlan {
  const CublasLtApi* lt = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  ~DensePlan() {
    if (!lt) return;
    if (op) lt->cublasLtMatmulDescDestroy(op);
    if (a) lt->cublasLtMatrixLayoutDestroy(a);
    if (b) lt->cublasLtMatrixLayoutDestroy(b);
    if (d) lt->cublasLtMatrixLayoutDestroy(d);
  }
};

std::vector<int64_t> DenseKey(const DenseArgs& a) {
  return {a.device, a.M, a.N, a.K, a.has_bias, a.relu, a.w_transposed, a.tf32, Alignment(DataPtr(a.x)),
          Alignment(DataPtr(a.w)), Alignment(DataPtr(a.out)), a.bias ? Alignment(DataPtr(a.bias)) : 0};
}

// cuBLASLt is column-major; a row-major [R, C] buffer is a column-major [C, R] matrix with ld = C. So the
// row-major product out[M, N] = x[M, K] . W[K, N] is computed as the column-major out^T[N, M] = W^T[N, K] .
// x^T[K, M], with A = the w buffer and B = the x buffer:
//   w_transposed=1: w is row-major [N, K] = column-major [K, N] (ld K); op(A) = T gives [N, K].
//   w_transposed=0: w is row-major [K, N] = column-major [N, K] (ld N); op(A) = N.
//   x is row-major [M, K] = column-major [K, M] (ld K); op(B) = N.  D is column-major [N, M] (ld N).
// The bias epilogue adds a vector of length rows(D) = N to every column: bias[n] to out[m, n].
// `bias` is the bias pointer the call will use (DataPtr(a.bias) or its aligned copy; nullptr without a bias).
std::unique_ptr<DensePlan> MakeDensePlan(const CublasLtApi& lt, cublasLtHandle_t handle, const DenseArgs& a,
                                         const void* bias) {
  const char* caller = kDense;
  auto p = std::make_unique<DensePlan>();
  p->lt = &lt;
  const uint64_t M = a.M, N = a.N, K = a.K;
  const cublasComputeType_t compute = a.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  TVM_INTEROP_CUBLAS_CALL(lt, caller, cublasLtMatmulDescCreate, &p->op, compute, CUDA_R_32F);
  const int32_t trans_a = a.w_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t trans_b = CUBLAS_OP_N;
  TVM_INTEROP_CUBLAS_CALL(lt, caller, cublasLtMatmulDescSetAttribute, p->op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                          sizeof(trans_a));
  TVM_INTEROP_CUBLAS_CALL(lt, caller, cublasLtMatmulDescSetAttribute, p->op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                          sizeof(trans_b));
  const uint32_t epilogue = a.has_bias ? (a.relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                       : (a.relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
  TVM_INTEROP_CUBLAS_CALL(lt, caller, cublasLtMatmulDescSetAttribute, p->op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                          &epilogue, sizeof(epilogue));
  if (a.has_bias) {  // set for the heuristic too; the call sets it again every time
    TVM_INTEROP_CUBLAS_CALL(lt, caller, cublasLtMatmulDescSetAttribute, p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                            &bias, sizeof(bias));
  }
  if (a.w_transposed) {
    TVM_INTEROP_CUBLAS_CALL(lt, caller, cublasLtMatrixLayoutCreate, &p->a, CUDA_R_32F, K, N, K);
  } else {
    TVM_INTEROP_CUBLAS_CALL(lt, caller, cublasLtMatrixLayoutCreate, &p->a, CUDA_R_32F, N, K, N);
  }
  TVM_INTEROP_CUBLAS_CALL(lt, caller, cublasLtMatrixLayoutCreate, &p->b, CUDA_R_32F, K, M, K);
  TVM_INTEROP_CUBLAS_CALL(lt, caller, cublasLtMatrixLayoutCreate, &p->d, CUDA_R_32F, N, M, N);

  cublasLtMatmulPreference_t pref = nullptr;
  TVM_INTEROP_CUBLAS_CALL(lt, caller, cublasLtMatmulPreferenceCreate, &pref);
  std::unique_ptr<void, std::function<void(void*)>> pref_guard(
      pref, [&lt](void* q) { lt.cublasLtMatmulPreferenceDestroy(static_cast<cublasLtMatmulPreference_t>(q)); });
  const uint64_t max_ws = kDenseWorkspaceLimit;
  TVM_INTEROP_CUBLAS_CALL(lt, caller, cublasLtMatmulPreferenceSetAttribute, pref,
                          CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof(max_ws));
  const uint32_t align_a = Alignment(DataPtr(a.w)), align_b = Alignment(DataPtr(a.x)),
                 align_d = Alignment(DataPtr(a.out));
  TVM_INTEROP_CUBLAS_CALL(lt, caller, cublasLtMatmulPreferenceSetAttribute, pref,
                          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a));
  TVM_INTEROP_CUBLAS_CALL(lt, caller, cublasLtMatmulPreferenceSetAttribute, pref,
                          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b));
  TVM_INTEROP_CUBLAS_CALL(lt, caller, cublasLtMatmulPreferenceSetAttribute, pref,
                          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d));
  TVM_INTEROP_CUBLAS_CALL(lt, caller, cublasLtMatmulPreferenceSetAttribute, pref,
                          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d));
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  TVM_INTEROP_CUBLAS_CALL(lt, caller, cublasLtMatmulAlgoGetHeuristic, handle, p->op, p->a, p->b, p->d, p->d, pref,
                          1, &result, &returned);
  if (returned < 1 || result.state != CUBLAS_STATUS_SUCCESS) {
    TVM_FFI_THROW(RuntimeError) << caller << ": cublasLtMatmulAlgoGetHeuristic found no algorithm for M=" << a.M
                                << " N=" << a.N << " K=" << a.K << " (w_transposed=" << a.w_transposed
                                << ", bias=" << a.has_bias << ", relu=" << a.relu << ", tf32=" << a.tf32 << ")";
  }
  p->algo = result.algo;
  p->workspace = result.workspaceSize;
  return p;
}

void Dense(ffi::PackedArgs args, ffi::Any* rv) {
  const char* caller = kDense;
  const int64_t t_start = NowNs();
  const DenseArgs a = ParseDenseArgs(args);  // all validation first
  const CudartApi& rt = Cudart().Get(caller);
  const CublasLtApi& lt = CublasLt().Get(caller);
  DeviceGuard guard(rt, a.device, caller);
  const cudaStream_t stream = CurrentStream(a.device);
  const bool capturing = IsCapturing(rt, stream);
  StreamContext& ctx = GetStreamContext(a.device, stream);
  std::lock_guard<std::mutex> lock(ctx.mu);
  cublasLtHandle_t handle = EnsureLtHandle(rt, lt, ctx, capturing, caller);

  // The bias epilogue's pointer has no alignment preference (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_* cover A, B,
  // C and D only), so a kernel the heuristic picks may load the bias 16 bytes at a time and fault with a
  // misaligned address (a sticky error that ends the CUDA context) on a bias that is only 4-byte aligned. Such a
  // bias is first copied, on the stream, into an aligned buffer of this stream's context; the copy is a plain
  // memcpy node under capture, and stream order keeps the buffer's reuse safe.
  const void* bias = a.has_bias ? DataPtr(a.bias) : nullptr;
  if (bias != nullptr && Alignment(bias) < 16) {
    const size_t bytes = static_cast<size_t>(a.N) * sizeof(float);
    void* copy = EnsureBuffer(rt, ctx, ctx.bias_copy, ctx.bias_copy_size, bytes, capturing, caller);
    TVM_INTEROP_CUDA_CALL(rt, caller, cudaMemcpyAsync, copy, bias, bytes, cudaMemcpyDeviceToDevice, stream);
    bias = copy;
  }

  std::unique_ptr<DensePlan>& plan = ctx.dense_plans[DenseKey(a)];
  const bool steady = !capturing && plan != nullptr;
  if (!plan) plan = MakeDensePlan(lt, handle, a, bias);  // host-only heuristic: fine during a capture
  void* ws = EnsureWorkspace(rt, ctx, plan->workspace, capturing, caller);
  const int64_t t_library = NowNs();
  if (a.has_bias) {
    TVM_INTEROP_CUBLAS_CALL(lt, caller, cublasLtMatmulDescSetAttribute, plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                            &bias, sizeof(bias));
  }
  const float one = 1.0f, zero = 0.0f;
  TVM_INTEROP_CUBLAS_CALL(lt, caller, cublasLtMatmul, handle, plan->op, &one, DataPtr(a.w), plan->a, DataPtr(a.x),
                          plan->b, &zero, DataPtr(a.out), plan->d, DataPtr(a.out), plan->d, &plan->algo, ws,
                          ctx.workspace_size, stream);
  if (steady) RecordCall(kDenseStats, t_start, t_library, NowNs());
  (void)rv;
}

// ---------------------------------------------------------------------------------------------------------------
// info(): never throws.
// ---------------------------------------------------------------------------------------------------------------

std::string JsonString(const std::string& s) {
  std::ostringstream os;
  os << '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      os << '\\' << c;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      os << buf;
    } else {
      os << c;
    }
  }
  os << '"';
  return os.str();
}

template <typename Api, typename Fn>
std::string LibraryJson(LazyLibrary<Api>& lib, Fn&& describe) {
  std::string error;
  const Api* api = lib.TryGet(&error);
  std::ostringstream os;
  os << "{\"soname\": " << JsonString(Api::kSoname) << ", \"loaded\": " << (api ? "true" : "false");
  if (api) {
    os << ", \"path\": " << JsonString(lib.Path()) << ", " << describe(*api);
  } else {
    os << ", \"error\": " << JsonString(error);
  }
  os << "}";
  return os.str();
}

std::string Info() {
  std::ostringstream os;
  os << "{\"version\": " << JsonString(kVersion) << ", \"functions\": [";
  for (size_t i = 0; i < kFunctionNames.size(); ++i) os << (i ? ", " : "") << JsonString(kFunctionNames[i]);
  os << "], \"headers\": {\"cudart\": " << CUDART_VERSION << ", \"cudnn\": " << CUDNN_VERSION
     << ", \"cublas\": " << CUBLAS_VERSION << "}, \"libraries\": {";
  os << "\"cudart\": " << LibraryJson(Cudart(), [](const CudartApi& rt) {
    int runtime = 0, driver = 0, count = 0;
    rt.cudaRuntimeGetVersion(&runtime);
    rt.cudaDriverGetVersion(&driver);
    cudaError_t err = rt.cudaGetDeviceCount(&count);
    rt.cudaGetLastError();
    std::ostringstream s;
    s << "\"runtime_version\": " << runtime << ", \"driver_version\": " << driver;
    if (err == cudaSuccess) {
      s << ", \"device_count\": " << count;
    } else {
      s << ", \"device_count\": 0, \"device_error\": "
        << JsonString(std::string(rt.cudaGetErrorName(err)) + " (" + rt.cudaGetErrorString(err) + ")");
    }
    return s.str();
  });
  os << ", \"cudnn\": " << LibraryJson(Cudnn(), [](const CudnnApi& dnn) {
    return "\"version\": " + std::to_string(dnn.cudnnGetVersion());
  });
  os << ", \"cublasLt\": " << LibraryJson(CublasLt(), [](const CublasLtApi& lt) {
    return "\"version\": " + std::to_string(lt.cublasLtGetVersion());
  });
  os << "}}";
  return os.str();
}

// ---------------------------------------------------------------------------------------------------------------
// Registration at load time.
// ---------------------------------------------------------------------------------------------------------------

// Keeps the library containing this code loaded for the process's life. The globals registered below point into
// it; if the library (an exported model .so, or ours) were dlclose'd while the globals still named its functions,
// the next call would jump into unmapped memory.
void PinThisLibrary() {
  Dl_info dl;
  if (dladdr(reinterpret_cast<void*>(&PinThisLibrary), &dl) != 0 && dl.dli_fname != nullptr) {
    dlopen(dl.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
  }
}

void RegisterAll() {
  // allow_override: two exported models loaded in one process each carry a copy; the latest one wins, and the
  // earlier copies stay loaded (PinThisLibrary), so functions already looked up keep working.
  constexpr bool kOverride = true;
  ffi::Function::SetGlobal(kEventsCreate, ffi::Function::FromTyped(&EventsCreate, kEventsCreate), kOverride);
  ffi::Function::SetGlobal(kEventsFree, ffi::Function::FromTyped(&EventsFree, kEventsFree), kOverride);
  ffi::Function::SetGlobal(kEventSync, ffi::Function::FromTyped(&EventSync, kEventSync), kOverride);
  ffi::Function::SetGlobal(kTimingCreate, ffi::Function::FromTyped(&TimingCreate, kTimingCreate), kOverride);
  ffi::Function::SetGlobal(kTimingRecord, ffi::Function::FromTyped(&TimingRecord, kTimingRecord), kOverride);
  ffi::Function::SetGlobal(kTimingRead, ffi::Function::FromTyped(&TimingRead, kTimingRead), kOverride);
  ffi::Function::SetGlobal(kTimingFree, ffi::Function::FromTyped(&TimingFree, kTimingFree), kOverride);
  ffi::Function::SetGlobal(kStreamHold, ffi::Function::FromTyped(&StreamHoldCreate, kStreamHold), kOverride);
  ffi::Function::SetGlobal(kStreamRelease, ffi::Function::FromTyped(&StreamHoldRelease, kStreamRelease), kOverride);
  ffi::Function::SetGlobal(kConv2d, ffi::Function::FromPacked(&Conv2d), kOverride);
  ffi::Function::SetGlobal(kDense, ffi::Function::FromPacked(&Dense), kOverride);
  ffi::Function::SetGlobal(
      kSetEnginePolicy,
      ffi::Function::FromTyped([](ffi::String policy) -> ffi::String { return SetEnginePolicy(policy); },
                               kSetEnginePolicy),
      kOverride);
  ffi::Function::SetGlobal(
      kConvEngines,
      ffi::Function::FromPacked([](ffi::PackedArgs args, ffi::Any* rv) { *rv = ffi::String(ConvEngines(args)); }),
      kOverride);
  ffi::Function::SetGlobal(
      kConvChoices,
      ffi::Function::FromTyped([](bool reset) -> ffi::String { return ConvChoicesJson(reset); }, kConvChoices),
      kOverride);
  ffi::Function::SetGlobal(kInfo, ffi::Function::FromTyped([]() -> ffi::String { return Info(); }, kInfo),
                           kOverride);
  ffi::Function::SetGlobal(
      kCallStats, ffi::Function::FromTyped([](bool reset) -> ffi::String { return CallStatsJson(reset); }, kCallStats),
      kOverride);
}

struct Registrar {
  Registrar() {
    PinThisLibrary();
    try {
      RegisterAll();
    } catch (const std::exception& e) {  // an exception escaping a static initialiser would abort the process
      std::fprintf(stderr, "tvm-interop native extension: registration failed: %s\n", e.what());
    }
  }
};

Registrar registrar;

}  // namespace
}  // namespace tvm_interop
