// cuDNN's graph (backend) API for conv2d: engines the legacy API cannot reach, chosen by measurement.
//
// Why. With the legacy API (cudnnFindConvolutionForwardAlgorithmEx over the eight cudnnConvolutionFwdAlgo_t) our
// cuDNN convolutions are slower than PyTorch's on an H100: Inception-v3's 95 library units add up to 4.60 ms timed
// one by one (docs/unit_costs_h100_2026-11-26), more than PyTorch's whole model (3.83 ms with its BN, ReLU, pools
// and concats, CUDA graph, TF32 off). PyTorch's cudnn.benchmark times engine configurations of the graph API,
// which include engines that no legacy algorithm maps to. This file builds the same kind of candidates for one
// convolution (the convolution alone, its epilogue then run as today; and, where an engine takes it, the
// convolution with bias, residual and ReLU fused in one operation graph), times each next to the legacy path on
// the real buffers, and keeps the fastest per shape for the process's life. The legacy path stays a candidate,
// so the measured choice is never slower than it except for timing noise.
//
// Policy (process-wide): "measured" (the default since 2026-11-27) or "legacy" (cudnnFind over the legacy algorithms
// alone, the behaviour before this file); from the environment (TVM_INTEROP_CUDNN_ENGINES) or
// tvm_interop.cudnn.set_engine_policy. Why measured is the default: on an H200 (docs/gpu_check_h200_2026-11-27.md)
// it took Inception-v3's sequential cuDNN program in a CUDA graph from 4.66 to 3.17 ms and GoogLeNet's from 2.85 to
// 1.45 ms, every output still matching plain TVM; the cost is one timed search per convolution shape at the first
// call of a loaded model. Engines that compile kernels at
// run time (NVRTC) are left out unless TVM_INTEROP_CUDNN_RUNTIME_FUSION=1: one compile per shape can take a
// second. Without TF32, engines whose numerical notes say tensor cores, down-converted inputs or reduced-precision
// reductions are left out (for float data they compute in TF32).
//
// Included by tvm_interop_cuda.cc inside its anonymous namespace, after the legacy convolution path: it uses
// CudartApi, CudnnApi, ConvArgs, ConvPlan, ConvKey, StreamContext, WorkspaceLimit, RunConvEpilogue, DataPtr,
// ShapeStr and the function names (kSetEnginePolicy, kConvChoices, kConvEngines) from there. A choice is made
// outside a CUDA-graph capture only (it runs and times kernels); a capture that meets a shape with no choice yet
// runs the legacy path for that call, like the legacy algorithm search.

std::string JsonString(const std::string& s);  // tvm_interop_cuda.cc

enum class EnginePolicy : int { kUnset = -1, kLegacy = 0, kMeasured = 1 };

const char* PolicyName(EnginePolicy p) { return p == EnginePolicy::kMeasured ? "measured" : "legacy"; }

EnginePolicy ParsePolicy(const std::string& text, const char* source) {
  if (text == "legacy") return EnginePolicy::kLegacy;
  if (text == "measured") return EnginePolicy::kMeasured;
  TVM_FFI_THROW(ValueError) << source << ": unknown cuDNN engine policy '" << text
                            << "'; use 'legacy' (cudnnFind over the legacy algorithms) or 'measured' (graph-API "
                            << "engines and the legacy path timed per shape, the fastest kept)";
  return EnginePolicy::kLegacy;  // not reached: TVM_FFI_THROW throws
}

std::atomic<int>& PolicySlot() {
  static auto* slot = new std::atomic<int>(static_cast<int>(EnginePolicy::kUnset));
  return *slot;
}

EnginePolicy CurrentPolicy() {
  int p = PolicySlot().load();
  if (p != static_cast<int>(EnginePolicy::kUnset)) return static_cast<EnginePolicy>(p);
  const char* env = std::getenv("TVM_INTEROP_CUDNN_ENGINES");
  EnginePolicy parsed = (env && *env) ? ParsePolicy(env, "TVM_INTEROP_CUDNN_ENGINES") : EnginePolicy::kMeasured;
  int expected = static_cast<int>(EnginePolicy::kUnset);
  PolicySlot().compare_exchange_strong(expected, static_cast<int>(parsed));
  return static_cast<EnginePolicy>(PolicySlot().load());
}

// A graph-API tensor's byte alignment (Alignment, at most 16): engines with vectorised loads need 16 bytes, and
// the plan must not promise more than the buffers of later calls have (it is part of the choice's key).
int64_t TensorAlignment(const void* ptr) { return Alignment(ptr, 16); }

// One backend descriptor, destroyed with its owner.
class BackendDesc {
 public:
  BackendDesc(const CudnnApi& dnn, cudnnBackendDescriptorType_t type) : dnn_(&dnn) {
    status_ = dnn.cudnnBackendCreateDescriptor(type, &desc_);
    if (status_ != CUDNN_STATUS_SUCCESS) desc_ = nullptr;
  }
  ~BackendDesc() {
    if (desc_ != nullptr) dnn_->cudnnBackendDestroyDescriptor(desc_);
  }
  BackendDesc(const BackendDesc&) = delete;
  BackendDesc& operator=(const BackendDesc&) = delete;
  cudnnBackendDescriptor_t get() const { return desc_; }
  cudnnStatus_t status() const { return status_; }

 private:
  const CudnnApi* dnn_;
  cudnnBackendDescriptor_t desc_ = nullptr;
  cudnnStatus_t status_;
};
using BackendDescPtr = std::shared_ptr<BackendDesc>;

// The first failure of a sequence of backend calls, as text; the calls after it are skipped by the callers.
struct BackendSteps {
  const CudnnApi& dnn;
  std::string error;
  bool Ok(cudnnStatus_t status, const char* what) {
    if (!error.empty()) return false;
    if (status == CUDNN_STATUS_SUCCESS) return true;
    error = std::string(what) + ": " + dnn.cudnnGetErrorString(status);
    return false;
  }
  BackendDescPtr Make(cudnnBackendDescriptorType_t type, const char* what) {
    auto d = std::make_shared<BackendDesc>(dnn, type);
    return Ok(d->status(), what) ? d : nullptr;
  }
  bool Set(const BackendDescPtr& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
           int64_t count, const void* values, const char* what) {
    return d && Ok(dnn.cudnnBackendSetAttribute(d->get(), name, type, count, values), what);
  }
  // One backend-descriptor attribute: `value`'s descriptor (a failed earlier step left it null: skipped).
  bool SetDesc(const BackendDescPtr& d, cudnnBackendAttributeName_t name, const BackendDescPtr& value,
               const char* what) {
    if (!value) return Ok(CUDNN_STATUS_BAD_PARAM, what);
    cudnnBackendDescriptor_t v = value->get();
    return Set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
  }
  bool Finalize(const BackendDescPtr& d, const char* what) { return d && Ok(dnn.cudnnBackendFinalize(d->get()), what); }
};

// The attribute's own name is the failure's text.
#define TVM_INTEROP_BACKEND_SET(steps, desc, attr, type, count, values) \
  (steps).Set((desc), attr, type, (count), (values), #attr)
#define TVM_INTEROP_BACKEND_SET_DESC(steps, desc, attr, value) (steps).SetDesc((desc), attr, (value), #attr)

// Tensor unique ids of the operation graphs (the variant pack names buffers by them).
enum : int64_t { kUidX = 1, kUidW = 2, kUidY = 3, kUidBias = 4, kUidZ = 5, kUidVirtual = 100 };

// The operation graph of one convolution: its descriptors stay alive as long as any plan made from it.
struct ConvGraph {
  bool fused = false;                     // bias / z / ReLU inside the graph (else the epilogue runs after)
  std::vector<BackendDescPtr> keep;       // tensors, convolution, pointwise and operation descriptors
  BackendDescPtr graph;                   // the finalized operation graph
  std::vector<int64_t> uids;              // the real (non-virtual) tensors, in variant-pack order
};

BackendDescPtr MakeTensor(BackendSteps& s, std::vector<BackendDescPtr>& keep, int64_t uid, std::vector<int64_t> dims,
                          int64_t alignment, bool is_virtual) {
  std::vector<int64_t> strides(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * dims[i + 1];
  const cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
  const int64_t n = static_cast<int64_t>(dims.size());
  BackendDescPtr t = s.Make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor descriptor");
  TVM_INTEROP_BACKEND_SET(s, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dtype);
  TVM_INTEROP_BACKEND_SET(s, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, n, dims.data());
  TVM_INTEROP_BACKEND_SET(s, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, n, strides.data());
  TVM_INTEROP_BACKEND_SET(s, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  TVM_INTEROP_BACKEND_SET(s, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  TVM_INTEROP_BACKEND_SET(s, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  s.Finalize(t, "tensor descriptor");
  keep.push_back(t);
  return t;
}

// One pointwise operation out = mode(in, [b]).
bool AddPointwise(BackendSteps& s, std::vector<BackendDescPtr>& keep, std::vector<cudnnBackendDescriptor_t>& ops,
                  cudnnPointwiseMode_t mode, const BackendDescPtr& in, const BackendDescPtr& b,
                  const BackendDescPtr& out) {
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  BackendDescPtr pw = s.Make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise descriptor");
  TVM_INTEROP_BACKEND_SET(s, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  TVM_INTEROP_BACKEND_SET(s, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
  s.Finalize(pw, "pointwise descriptor");
  BackendDescPtr op = s.Make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
  TVM_INTEROP_BACKEND_SET_DESC(s, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
  TVM_INTEROP_BACKEND_SET_DESC(s, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, in);
  if (b) {
    TVM_INTEROP_BACKEND_SET_DESC(s, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
  }
  TVM_INTEROP_BACKEND_SET_DESC(s, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, out);
  s.Finalize(op, "pointwise operation");
  keep.push_back(pw);
  keep.push_back(op);
  if (op) ops.push_back(op->get());
  return s.error.empty();
}

// The operation graph y = conv(x, w) (fused = false) or y = act(conv(x, w) + bias + z) (fused = true, the terms
// the call has). Returns nullptr with `error` set when cuDNN refuses a descriptor.
std::shared_ptr<ConvGraph> MakeConvGraph(const CudnnApi& dnn, cudnnHandle_t handle, const ConvArgs& a, bool fused,
                                         std::string* error) {
  BackendSteps s{dnn, {}};
  auto g = std::make_shared<ConvGraph>();
  g->fused = fused;
  auto dims = [](const DLTensor* t) { return std::vector<int64_t>(t->shape, t->shape + t->ndim); };
  const std::vector<int64_t> ydims = dims(a.out);
  BackendDescPtr x = MakeTensor(s, g->keep, kUidX, dims(a.x), TensorAlignment(DataPtr(a.x)), false);
  BackendDescPtr w = MakeTensor(s, g->keep, kUidW, dims(a.w), TensorAlignment(DataPtr(a.w)), false);
  BackendDescPtr y = MakeTensor(s, g->keep, kUidY, ydims, TensorAlignment(DataPtr(a.out)), false);
  g->uids = {kUidX, kUidW, kUidY};

  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;  // Relax's conv2d does not flip the kernel
  const int64_t spatial = 2;
  const int64_t dil[2] = {a.dil_h, a.dil_w}, stride[2] = {a.stride_h, a.stride_w}, pad[2] = {a.pad_h, a.pad_w};
  BackendDescPtr conv = s.Make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, "convolution descriptor");
  TVM_INTEROP_BACKEND_SET(s, conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
  TVM_INTEROP_BACKEND_SET(s, conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  TVM_INTEROP_BACKEND_SET(s, conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial);
  TVM_INTEROP_BACKEND_SET(s, conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil);
  TVM_INTEROP_BACKEND_SET(s, conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride);
  TVM_INTEROP_BACKEND_SET(s, conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  TVM_INTEROP_BACKEND_SET(s, conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  s.Finalize(conv, "convolution descriptor");
  g->keep.push_back(conv);

  // the convolution writes y directly, or a virtual tensor the epilogue reads
  const bool epilogue = fused && (a.has_bias || a.has_z || a.relu);
  int64_t next_virtual = kUidVirtual;
  BackendDescPtr conv_out = epilogue ? MakeTensor(s, g->keep, next_virtual++, ydims, 16, true) : y;
  std::vector<cudnnBackendDescriptor_t> ops;
  const float alpha = 1.0f, beta = 0.0f;
  BackendDescPtr op = s.Make(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, "convolution operation");
  TVM_INTEROP_BACKEND_SET(s, op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
  TVM_INTEROP_BACKEND_SET(s, op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
  TVM_INTEROP_BACKEND_SET_DESC(s, op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv);
  TVM_INTEROP_BACKEND_SET_DESC(s, op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x);
  TVM_INTEROP_BACKEND_SET_DESC(s, op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w);
  TVM_INTEROP_BACKEND_SET_DESC(s, op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, conv_out);
  s.Finalize(op, "convolution operation");
  g->keep.push_back(op);
  if (op) ops.push_back(op->get());

  if (epilogue) {
    // conv_out (+ z) (+ bias) (ReLU) -> y; each step writes a fresh virtual tensor, the last one writes y
    std::vector<std::pair<cudnnPointwiseMode_t, BackendDescPtr>> steps;
    if (a.has_z) {
      steps.push_back(
          {CUDNN_POINTWISE_ADD, MakeTensor(s, g->keep, kUidZ, dims(a.z), TensorAlignment(DataPtr(a.z)), false)});
      g->uids.push_back(kUidZ);
    }
    if (a.has_bias) {
      steps.push_back({CUDNN_POINTWISE_ADD, MakeTensor(s, g->keep, kUidBias, {1, a.w->shape[0], 1, 1},
                                                       TensorAlignment(DataPtr(a.bias)), false)});
      g->uids.push_back(kUidBias);
    }
    if (a.relu) steps.push_back({CUDNN_POINTWISE_RELU_FWD, nullptr});
    BackendDescPtr in = conv_out;
    for (size_t i = 0; i < steps.size(); ++i) {
      BackendDescPtr out = i + 1 == steps.size() ? y : MakeTensor(s, g->keep, next_virtual++, ydims, 16, true);
      AddPointwise(s, g->keep, ops, steps[i].first, in, steps[i].second, out);
      in = out;
    }
  }

  g->graph = s.Make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
  s.Set(g->graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "CUDNN_ATTR_OPERATIONGRAPH_HANDLE");
  s.Set(g->graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops.size()),
        ops.data(), "CUDNN_ATTR_OPERATIONGRAPH_OPS");
  s.Finalize(g->graph, "operation graph");
  if (!s.error.empty()) {
    *error = s.error;
    return nullptr;
  }
  return g;
}

// The engine configurations one heuristic mode proposes for `graph`, best first (empty when the mode has none).
std::vector<BackendDescPtr> HeuristicConfigs(const CudnnApi& dnn, const ConvGraph& g, cudnnBackendHeurMode_t mode) {
  BackendSteps s{dnn, {}};
  BackendDescPtr heur = s.Make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
  cudnnBackendDescriptor_t graph_d = g.graph->get();
  s.Set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph_d, "heuristics graph");
  s.Set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
  s.Finalize(heur, "heuristics");
  int64_t count = 0;
  if (!s.error.empty() ||
      !s.Ok(dnn.cudnnBackendGetAttribute(heur->get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                         &count, nullptr),
            "heuristics count") ||
      count <= 0) {
    return {};
  }
  std::vector<BackendDescPtr> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    BackendDescPtr c = s.Make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config");
    if (!c) return {};
    configs.push_back(c);
    raw.push_back(c->get());
  }
  int64_t returned = 0;
  if (!s.Ok(dnn.cudnnBackendGetAttribute(heur->get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                         count, &returned, raw.data()),
            "heuristics results")) {
    return {};
  }
  configs.resize(static_cast<size_t>(std::min(returned, count)));
  return configs;
}

// An engine configuration's engine: its global index and what its notes say.
struct EngineInfo {
  int64_t index = -1;
  bool tensor_core = false;       // a tensor-core, down-converting or reduced-precision engine: TF32 for float
  bool runtime_compiled = false;  // NVRTC at plan time
};

EngineInfo InfoOf(const CudnnApi& dnn, const BackendDescPtr& config) {
  EngineInfo info;
  BackendDesc engine(dnn, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t engine_d = engine.get();
  int64_t n = 0;
  if (engine_d == nullptr || dnn.cudnnBackendGetAttribute(config->get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                                          &engine_d) != CUDNN_STATUS_SUCCESS) {
    return info;
  }
  dnn.cudnnBackendGetAttribute(engine_d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &info.index);
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  n = 0;
  if (dnn.cudnnBackendGetAttribute(engine_d, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                   CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes) == CUDNN_STATUS_SUCCESS) {
    for (int64_t i = 0; i < std::min<int64_t>(n, CUDNN_NUMERICAL_NOTE_TYPE_COUNT); ++i) {
      info.tensor_core |= notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE ||
                          notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS ||
                          notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION;
    }
  }
  cudnnBackendBehaviorNote_t behaviour[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
  n = 0;
  if (dnn.cudnnBackendGetAttribute(engine_d, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                   CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &n, behaviour) == CUDNN_STATUS_SUCCESS) {
    for (int64_t i = 0; i < std::min<int64_t>(n, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT); ++i) {
      info.runtime_compiled |= behaviour[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION;
    }
  }
  return info;
}

// A finalized execution plan of one engine configuration, or nullptr when cuDNN refuses to finalize it.
BackendDescPtr MakePlan(const CudnnApi& dnn, cudnnHandle_t handle, const BackendDescPtr& config, int64_t* workspace) {
  BackendSteps s{dnn, {}};
  BackendDescPtr plan = s.Make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
  s.Set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "CUDNN_ATTR_EXECUTION_PLAN_HANDLE");
  TVM_INTEROP_BACKEND_SET_DESC(s, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
  s.Finalize(plan, "execution plan");
  int64_t n = 0;
  *workspace = 0;
  if (!s.error.empty() ||
      !s.Ok(dnn.cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                         &n, workspace),
            "workspace size")) {
    return nullptr;
  }
  return plan;
}

// The buffers of `a` in the order of `uids`.
std::vector<void*> GraphPointers(const ConvGraph& g, const ConvArgs& a) {
  std::vector<void*> ptrs;
  for (int64_t uid : g.uids) {
    switch (uid) {
      case kUidX: ptrs.push_back(DataPtr(a.x)); break;
      case kUidW: ptrs.push_back(DataPtr(a.w)); break;
      case kUidY: ptrs.push_back(DataPtr(a.out)); break;
      case kUidBias: ptrs.push_back(DataPtr(a.bias)); break;
      case kUidZ: ptrs.push_back(DataPtr(a.z)); break;
      default: ptrs.push_back(nullptr);
    }
  }
  return ptrs;
}

// Finalized variant packs of one plan by their buffers (the data pointers, then the workspace). A program's
// buffers are the same on every call (TVM plans its memory statically), so a pack is built once per buffer set,
// not per call: building one costs host time on the critical path of a direct (not captured) program. Bounded.
struct PackCache {
  static constexpr size_t kMax = 256;
  std::map<std::vector<void*>, BackendDescPtr> packs;   // used under CudnnCallMutex(), like every conv2d call
};

// Runs one plan on the handle's stream; the pack comes from `cache` (nullptr: a fresh one).
cudnnStatus_t ExecutePlan(const CudnnApi& dnn, cudnnHandle_t handle, const BackendDesc& plan, const ConvGraph& g,
                          const ConvArgs& a, void* workspace, PackCache* cache) {
  std::vector<void*> ptrs = GraphPointers(g, a);
  std::vector<void*> key = ptrs;
  key.push_back(workspace);
  if (cache != nullptr) {
    auto it = cache->packs.find(key);
    if (it != cache->packs.end()) return dnn.cudnnBackendExecute(handle, plan.get(), it->second->get());
  }
  auto pack = std::make_shared<BackendDesc>(dnn, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  if (pack->get() == nullptr) return pack->status();
  cudnnBackendDescriptor_t p = pack->get();
  cudnnStatus_t st;
  if ((st = dnn.cudnnBackendSetAttribute(p, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                         static_cast<int64_t>(g.uids.size()), g.uids.data())) != CUDNN_STATUS_SUCCESS ||
      (st = dnn.cudnnBackendSetAttribute(p, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                         static_cast<int64_t>(ptrs.size()), ptrs.data())) != CUDNN_STATUS_SUCCESS ||
      (st = dnn.cudnnBackendSetAttribute(p, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                                         &workspace)) != CUDNN_STATUS_SUCCESS ||
      (st = dnn.cudnnBackendFinalize(p)) != CUDNN_STATUS_SUCCESS) {
    return st;
  }
  if (cache != nullptr) {
    if (cache->packs.size() >= PackCache::kMax) cache->packs.clear();
    cache->packs.emplace(std::move(key), pack);
  }
  return dnn.cudnnBackendExecute(handle, plan.get(), p);
}

// What runs one convolution shape: the legacy path, or a graph-API plan (and then the epilogue unless fused).
struct ConvChoice {
  bool graph = false;
  std::shared_ptr<ConvGraph> op;
  BackendDescPtr config, plan;   // the engine configuration is kept as long as the plan made from it
  PackCache packs;
  int64_t workspace = 0;
  std::string label = "legacy";
  std::string shape;
  double legacy_us = -1, chosen_us = -1;
  std::vector<std::pair<std::string, double>> tried;   // every candidate: label, us (-1: it failed to run)
  std::vector<std::string> dropped;                    // why candidates were left out
};

std::map<std::vector<int64_t>, std::shared_ptr<ConvChoice>>& ConvChoices() {  // guarded by ConvAlgoMutex()
  static auto* choices = new std::map<std::vector<int64_t>, std::shared_ptr<ConvChoice>>();
  return *choices;
}

std::vector<int64_t> ChoiceKey(const ConvArgs& a) {
  std::vector<int64_t> key = ConvKey(a);
  for (int64_t v : {int64_t(a.has_bias), int64_t(a.has_z), int64_t(a.relu), TensorAlignment(DataPtr(a.x)),
                    TensorAlignment(DataPtr(a.w)), TensorAlignment(DataPtr(a.out)),
                    a.bias ? TensorAlignment(DataPtr(a.bias)) : 0, a.z ? TensorAlignment(DataPtr(a.z)) : 0}) {
    key.push_back(v);
  }
  return key;
}

std::string ConvShapeText(const ConvArgs& a) {
  std::ostringstream os;
  os << "x " << ShapeStr(a.x) << " w " << ShapeStr(a.w) << " stride " << a.stride_h << "x" << a.stride_w << " pad "
     << a.pad_h << "x" << a.pad_w << " dilation " << a.dil_h << "x" << a.dil_w << " groups " << a.groups
     << (a.has_bias ? " +bias" : "") << (a.has_z ? " +z" : "") << (a.relu ? " relu" : "")
     << (a.tf32 ? " tf32" : "");
  return os.str();
}

// Device time of `fn` on `stream`, in microseconds per call (one untimed call first), or -1 when a call fails.
template <typename Fn>
double TimeCalls(const CudartApi& rt, cudaStream_t stream, int calls, Fn&& fn) {
  cudaEvent_t start = nullptr, stop = nullptr;
  if (rt.cudaEventCreateWithFlags(&start, cudaEventDefault) != cudaSuccess ||
      rt.cudaEventCreateWithFlags(&stop, cudaEventDefault) != cudaSuccess) {
    rt.cudaGetLastError();
    if (start) rt.cudaEventDestroy(start);
    return -1;
  }
  StreamGate gate{std::chrono::milliseconds(200)};
  // Also when `fn` throws (the legacy path raises cuDNN's errors): open the gate, then wait for an event queued
  // behind the host function, so it has returned before `gate` goes out of scope; then free the events.
  struct Release {
    const CudartApi& rt;
    cudaStream_t stream;
    StreamGate& gate;
    cudaEvent_t a, b;
    ~Release() {
      gate.open.store(true, std::memory_order_release);
      rt.cudaEventRecord(b, stream);
      rt.cudaEventSynchronize(b);
      rt.cudaGetLastError();
      rt.cudaEventDestroy(a);
      rt.cudaEventDestroy(b);
    }
  } release{rt, stream, gate, start, stop};
  if (!fn()) return -1;
  const bool gated = rt.cudaLaunchHostFunc(stream, &StreamGate::Wait, &gate) == cudaSuccess;
  if (!gated) rt.cudaGetLastError();
  rt.cudaEventRecord(start, stream);
  bool ok = true;
  for (int i = 0; i < calls && ok; ++i) ok = fn();
  rt.cudaEventRecord(stop, stream);
  gate.open.store(true, std::memory_order_release);
  float ms = 0;
  const bool timed = rt.cudaEventSynchronize(stop) == cudaSuccess &&
                     rt.cudaEventElapsedTime(&ms, start, stop) == cudaSuccess;
  return ok && timed ? 1e3 * ms / calls : -1;
}

struct GraphCandidate {
  std::shared_ptr<ConvGraph> op;
  BackendDescPtr config, plan;
  int64_t workspace;
  std::string label;
};

// The graph-API candidates of one convolution: per operation graph (convolution alone; fused with its epilogue),
// the engine configurations of heuristic modes A, B and FALLBACK, best first, one per engine, at most
// TVM_INTEROP_CUDNN_MAX_ENGINES (default 8) per graph, that finalize and fit the workspace limit.
std::vector<GraphCandidate> GraphCandidates(const CudnnApi& dnn, cudnnHandle_t handle, const ConvArgs& a,
                                            std::vector<std::string>* dropped) {
  std::vector<GraphCandidate> out;
  const int64_t per_graph = EnvInt("TVM_INTEROP_CUDNN_MAX_ENGINES", 8);
  const bool allow_nvrtc = EnvFlag("TVM_INTEROP_CUDNN_RUNTIME_FUSION");
  std::vector<bool> variants = {false};
  if (a.has_bias || a.has_z || a.relu) variants.push_back(true);
  for (bool fused : variants) {
    const char* what = fused ? "fused" : "conv only";
    std::string error;
    std::shared_ptr<ConvGraph> g = MakeConvGraph(dnn, handle, a, fused, &error);
    if (!g) {
      dropped->push_back(std::string(what) + " graph refused: " + error);
      continue;
    }
    std::set<int64_t> seen;
    int taken = 0, tensor_core = 0, nvrtc = 0, unfinalized = 0, too_big = 0;
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_B, CUDNN_HEUR_MODE_FALLBACK}) {
      if (taken >= per_graph) break;   // mode B's queries cost host time: none once the quota is full
      for (const BackendDescPtr& config : HeuristicConfigs(dnn, *g, mode)) {
        if (taken >= per_graph) break;
        EngineInfo info = InfoOf(dnn, config);
        if (info.index >= 0 && !seen.insert(info.index).second) continue;
        if (info.tensor_core && !a.tf32) { ++tensor_core; continue; }
        if (info.runtime_compiled && !allow_nvrtc) { ++nvrtc; continue; }
        int64_t workspace = 0;
        BackendDescPtr plan = MakePlan(dnn, handle, config, &workspace);
        if (!plan) { ++unfinalized; continue; }
        if (workspace < 0 || static_cast<size_t>(workspace) > WorkspaceLimit()) { ++too_big; continue; }
        out.push_back({g, config, plan, workspace,
                       "graph engine " + std::to_string(info.index) + " (" + what + ")"});
        ++taken;
      }
    }
    if (tensor_core + nvrtc + unfinalized + too_big > 0) {
      std::ostringstream os;
      os << what << ": " << tensor_core << " TF32 engine(s), " << nvrtc << " runtime-compiled, " << unfinalized
         << " not finalized, " << too_big << " over the workspace limit";
      dropped->push_back(os.str());
    }
  }
  return out;
}

// Times the legacy path and every graph-API candidate on the call's own buffers and returns the fastest.
// `legacy` runs the legacy path once (and throws on a cuDNN error, as it would anyway).
template <typename Legacy>
std::shared_ptr<ConvChoice> MeasureConvChoice(const CudartApi& rt, const CudnnApi& dnn, cudnnHandle_t handle,
                                              cudaStream_t stream, const ConvPlan& p, const ConvArgs& a,
                                              Legacy&& legacy) {
  constexpr int kCalls = 5;
  auto choice = std::make_shared<ConvChoice>();
  choice->shape = ConvShapeText(a);
  choice->legacy_us = TimeCalls(rt, stream, kCalls, [&] { legacy(); return true; });
  choice->chosen_us = choice->legacy_us;
  choice->tried.push_back({"legacy", choice->legacy_us});

  std::vector<GraphCandidate> candidates = GraphCandidates(dnn, handle, a, &choice->dropped);
  size_t scratch_size = 0;
  for (const auto& c : candidates) scratch_size = std::max(scratch_size, static_cast<size_t>(c.workspace));
  // a temporary buffer for the timing (only the winner's workspace is kept per stream); out of memory, it is
  // smaller and the candidates that need more drop out below
  void* scratch = AllocateScratch(rt, scratch_size);
  for (const auto& c : candidates) {
    PackCache packs;   // as the chosen plan will run: its pack built once
    if (static_cast<size_t>(c.workspace) > scratch_size) {
      choice->tried.push_back({c.label, -1});
      continue;
    }
    double us = TimeCalls(rt, stream, kCalls, [&] {
      if (ExecutePlan(dnn, handle, *c.plan, *c.op, a, scratch, &packs) != CUDNN_STATUS_SUCCESS) return false;
      if (!c.op->fused) RunConvEpilogue(dnn, handle, p, a);
      return true;
    });
    choice->tried.push_back({c.label, us});
    if (us > 0 && (choice->chosen_us < 0 || us < choice->chosen_us)) {
      choice->graph = true;
      choice->op = c.op;
      choice->config = c.config;
      choice->plan = c.plan;
      choice->workspace = c.workspace;
      choice->label = c.label;
      choice->chosen_us = us;
    }
  }
  if (scratch != nullptr) rt.cudaFree(scratch);
  return choice;  // the winner's plan and graph stay alive with the choice; the other candidates' go here
}

// A time for JSON: a non-finite one (a timing that went wrong) as -1, like a candidate that failed to run, since
// JSON has no inf or nan.
double JsonUs(double us) { return std::isfinite(us) ? us : -1.0; }

// Every choice made in this process, as JSON (for gpu_check's report); `reset` forgets them afterwards, so the
// next calls measure again and the next report lists one program's shapes only (a call in flight keeps its own
// choice alive).
std::string ConvChoicesJson(bool reset) {
  std::lock_guard<std::mutex> lock(ConvAlgoMutex());
  std::ostringstream os;
  os << "{\"policy\": \"" << PolicyName(CurrentPolicy()) << "\", \"choices\": [";
  bool first = true;
  for (const auto& [key, c] : ConvChoices()) {
    os << (first ? "" : ", ") << "{\"shape\": " << JsonString(c->shape) << ", \"chosen\": " << JsonString(c->label)
       << ", \"legacy_us\": " << JsonUs(c->legacy_us) << ", \"chosen_us\": " << JsonUs(c->chosen_us)
       << ", \"tried\": [";
    for (size_t i = 0; i < c->tried.size(); ++i) {
      os << (i ? ", " : "") << "[" << JsonString(c->tried[i].first) << ", " << JsonUs(c->tried[i].second) << "]";
    }
    os << "], \"dropped\": [";
    for (size_t i = 0; i < c->dropped.size(); ++i) os << (i ? ", " : "") << JsonString(c->dropped[i]);
    os << "]}";
    first = false;
  }
  os << "]}";
  if (reset) ConvChoices().clear();
  return os.str();
}

std::string SetEnginePolicy(const std::string& policy) {
  EnginePolicy previous = CurrentPolicy();
  PolicySlot().store(static_cast<int>(ParsePolicy(policy, kSetEnginePolicy)));
  return PolicyName(previous);
}

// tvm_interop.cudnn.conv_engines(params, x, w, [bias], [z], out) -> JSON: the graph-API candidates the measured
// policy would time for this call's shape, without running anything. Without a GPU there is no handle, and the
// operation graph needs one: each graph then stops there, and what this still checks is that cuDNN accepts every
// tensor, convolution and pointwise descriptor of the graphs (the part that cannot fail on a GPU only).
std::string ConvEngines(ffi::PackedArgs args) {
  const ConvArgs a = ParseConvArgs(args);
  const CudnnApi& dnn = Cudnn().Get(kConvEngines);
  cudnnHandle_t handle = nullptr;
  const CudartApi* rt = nullptr;
  try {
    rt = &Cudart().Get(kConvEngines);
  } catch (const std::exception&) {
    rt = nullptr;  // no CUDA runtime: no handle either
  }
  int devices = 0;
  if (rt != nullptr && rt->cudaGetDeviceCount(&devices) != cudaSuccess) {
    rt->cudaGetLastError();
    devices = 0;
  }
  std::optional<DeviceGuard> guard;
  if (devices > 0) {
    guard.emplace(*rt, a.device, kConvEngines);
    StreamContext& ctx = GetStreamContext(a.device, CurrentStream(a.device));
    std::lock_guard<std::mutex> call_lock(CudnnCallMutex());
    handle = EnsureCudnnHandle(*rt, dnn, ctx, IsCapturing(*rt, ctx.stream), kConvEngines);
  }
  std::vector<std::string> dropped;
  std::vector<GraphCandidate> candidates = GraphCandidates(dnn, handle, a, &dropped);
  std::ostringstream os;
  os << "{\"shape\": " << JsonString(ConvShapeText(a)) << ", \"handle\": " << (handle ? "true" : "false")
     << ", \"candidates\": [";
  for (size_t i = 0; i < candidates.size(); ++i) {
    os << (i ? ", " : "") << "[" << JsonString(candidates[i].label) << ", " << candidates[i].workspace << "]";
  }
  os << "], \"dropped\": [";
  for (size_t i = 0; i < dropped.size(); ++i) os << (i ? ", " : "") << JsonString(dropped[i]);
  os << "]}";
  return os.str();
}
