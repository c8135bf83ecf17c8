// cuDNN's backend graph API (cudnn_graph.h): the library opened once, descriptors, graphs and plans.
#include "backend/cuda/cudnn_graph.h"

#include <dlfcn.h>

#include <fmt/format.h>

#include <algorithm>
#include <type_traits>

namespace tr::cuda::dnn {

namespace {

struct Loaded {
  Api api;
  std::string why;  // empty when api is usable
};

Loaded load() {
  Loaded l;
  void* lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* e = dlerror();
    l.why = fmt::format("cannot load libcudnn.so.9 ({})", e ? e : "not found");
    return l;
  }
  bool ok = true;
  auto get = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (fn == nullptr && ok) {
      ok = false;
      l.why = fmt::format("libcudnn.so.9 lacks {}", name);
    }
  };
  Api& a = l.api;
  get(a.get_version, "cudnnGetVersion");
  get(a.error_string, "cudnnGetErrorString");
  get(a.last_error, "cudnnGetLastErrorString");
  get(a.create, "cudnnCreate");
  get(a.destroy, "cudnnDestroy");
  get(a.set_stream, "cudnnSetStream");
  get(a.create_descriptor, "cudnnBackendCreateDescriptor");
  get(a.destroy_descriptor, "cudnnBackendDestroyDescriptor");
  get(a.set_attribute, "cudnnBackendSetAttribute");
  get(a.get_attribute, "cudnnBackendGetAttribute");
  get(a.finalize, "cudnnBackendFinalize");
  get(a.execute, "cudnnBackendExecute");
  // The fused attention engines need cuDNN 9 (runtime major 9; the graph API's enums are 9's).
  if (ok && a.get_version() / 10000 != 9) {
    ok = false;
    l.why = fmt::format("libcudnn.so.9 reports version {}, not 9.x", a.get_version());
  }
  if (!ok) l.api = Api{};
  return l;
}

}  // namespace

void Api::check(cudnnStatus_t s, const std::string& what) const {
  if (s == CUDNN_STATUS_SUCCESS) return;
  char msg[512] = {0};
  last_error(msg, sizeof msg);
  throw DnnError(fmt::format("{}: {}{}{}", what, error_string(s), msg[0] ? " - " : "", msg));
}

const Api* api(std::string* why) {
  // Immutable once loaded, as NCCL's table; never destroyed, so the backend's descriptors and handles can
  // still be released through it while statics are torn down at exit.
  static const Loaded* const l = new Loaded(load());
  if (!l->why.empty()) {
    if (why) *why = l->why;
    return nullptr;
  }
  return &l->api;
}

Desc::Desc(const Api& api, cudnnBackendDescriptorType_t type, const char* what) : api_(api), what_(what) {
  if (const cudnnStatus_t s = api_.create_descriptor(type, &d_); s != CUDNN_STATUS_SUCCESS)
    api_.check(s, fmt::format("creating the {} descriptor", what_));
}

Desc::~Desc() {
  if (d_) api_.destroy_descriptor(d_);
}

Desc& Desc::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                const void* values) {
  // (The message is made only on failure: variant packs are set up on every call.)
  if (const cudnnStatus_t s = api_.set_attribute(d_, name, type, count, values); s != CUDNN_STATUS_SUCCESS)
    api_.check(s, fmt::format("setting attribute {} of the {} descriptor", static_cast<int>(name), what_));
  return *this;
}

void Desc::finalize() {
  if (const cudnnStatus_t s = api_.finalize(d_); s != CUDNN_STATUS_SUCCESS)
    api_.check(s, fmt::format("finalizing the {} descriptor", what_));
}

int64_t GraphBuilder::tensor(const TensorSpec& s) {
  const auto uid = static_cast<int64_t>(tensors_.size()) + 1;
  auto d = std::make_unique<Desc>(api_, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
  d->set_dtype(CUDNN_ATTR_TENSOR_DATA_TYPE, s.dtype)
      .set_i64s(CUDNN_ATTR_TENSOR_DIMENSIONS, s.dims)
      .set_i64s(CUDNN_ATTR_TENSOR_STRIDES, s.strides)
      .set_i64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid)
      .set_i64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, s.alignment);
  if (s.is_virtual) d->set_bool(CUDNN_ATTR_TENSOR_IS_VIRTUAL, true);
  if (s.by_value) d->set_bool(CUDNN_ATTR_TENSOR_IS_BY_VALUE, true);
  d->finalize();
  tensors_.emplace_back(uid, std::move(d));
  return uid;
}

const Desc& GraphBuilder::find(int64_t uid) const {
  if (uid < 1 || uid > static_cast<int64_t>(tensors_.size()))
    throw DnnError(fmt::format("graph: no tensor {}", uid));
  return *tensors_[static_cast<size_t>(uid - 1)].second;
}

void GraphBuilder::matmul(int64_t a, int64_t b, int64_t c) {
  auto m = std::make_unique<Desc>(api_, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
  m->set_dtype(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT).finalize();
  auto op = std::make_unique<Desc>(api_, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
  op->set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, find(a))
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, find(b))
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, find(c))
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, *m)
      .finalize();
  op_params_.push_back(std::move(m));
  ops_.push_back(std::move(op));
}

namespace {

std::unique_ptr<Desc> pointwise_desc(const Api& api, cudnnPointwiseMode_t mode, int64_t axis,
                                     cudnnDataType_t math) {
  auto pw = std::make_unique<Desc>(api, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
  pw->set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
      .set_dtype(CUDNN_ATTR_POINTWISE_MATH_PREC, math);
  if (axis >= 0) pw->set_i64(CUDNN_ATTR_POINTWISE_AXIS, axis);
  pw->finalize();
  return pw;
}

// The pointwise operation of `pw` on x [, b [, t]] into y, with unit alphas (as cudnn_frontend sets them).
std::unique_ptr<Desc> pointwise_op(const Api& api, const Desc& pw, const Desc* x, const Desc* b,
                                   const Desc* t, const Desc& y) {
  auto op = std::make_unique<Desc>(api, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
  op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
  if (x) op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, *x);
  if (b) op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
  if (t) op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
  const float one = 1.0f;
  op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y)
      .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one)
      .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one)
      .finalize();
  return op;
}

}  // namespace

void GraphBuilder::pointwise(cudnnPointwiseMode_t mode, int64_t x, int64_t b, int64_t y, int64_t axis,
                             cudnnDataType_t math) {
  auto pw = pointwise_desc(api_, mode, axis, math);
  ops_.push_back(pointwise_op(api_, *pw, &find(x), b > 0 ? &find(b) : nullptr, nullptr, find(y)));
  op_params_.push_back(std::move(pw));
}

void GraphBuilder::select(int64_t a, int64_t b, int64_t mask, int64_t y) {
  auto pw = pointwise_desc(api_, CUDNN_POINTWISE_BINARY_SELECT, -1, CUDNN_DATA_FLOAT);
  ops_.push_back(pointwise_op(api_, *pw, &find(a), &find(b), &find(mask), find(y)));
  op_params_.push_back(std::move(pw));
}

void GraphBuilder::reshape(int64_t x, int64_t y) {
  auto op = std::make_unique<Desc>(api_, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation");
  op->set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, find(x))
      .set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, find(y))
      .finalize();
  ops_.push_back(std::move(op));
}

void GraphBuilder::reduction(cudnnReduceTensorOp_t reduce_op, int64_t x, int64_t y) {
  auto r = std::make_unique<Desc>(api_, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction");
  r->set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce_op)
      .set_dtype(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT);
  if (api_.get_version() >= 91100) r->set_bool(CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, false);
  r->finalize();
  auto op = std::make_unique<Desc>(api_, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation");
  op->set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, find(x))
      .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, find(y))
      .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, *r)
      .finalize();
  op_params_.push_back(std::move(r));
  ops_.push_back(std::move(op));
}

namespace {

// Engine configs cuDNN's heuristics list for the graph in `mode`, best first (none when the mode has none).
std::vector<std::unique_ptr<Desc>> engine_configs(const Api& api, const Desc& graph,
                                                  cudnnBackendHeurMode_t mode, const Desc* device) {
  Desc heur(api, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
  heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (device) heur.set_desc(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, *device);
  heur.finalize();
  int64_t n = 0;
  api.check(api.get_attribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n,
                              nullptr),
            "counting the heuristics' engine configs");
  std::vector<std::unique_ptr<Desc>> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < n; ++i) {
    cfgs.push_back(std::make_unique<Desc>(api, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config"));
    raw.push_back(cfgs.back()->get());
  }
  int64_t got = 0;
  if (n > 0)
    api.check(api.get_attribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n,
                                &got, raw.data()),
              "reading the heuristics' engine configs");
  cfgs.resize(static_cast<size_t>(std::min(got, n)));
  return cfgs;
}

// The global index of the engine a finalized plan runs (-1 when cuDNN does not say).
int64_t engine_of(const Api& api, const Desc& cfg) {
  cudnnBackendDescriptor_t engine = nullptr;
  if (api.create_descriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) != CUDNN_STATUS_SUCCESS) return -1;
  int64_t got = 0, index = -1;
  if (api.get_attribute(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got,
                        &engine) == CUDNN_STATUS_SUCCESS)
    api.get_attribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got, &index);
  api.destroy_descriptor(engine);
  return index;
}

}  // namespace

std::unique_ptr<Desc> device_properties(const Api& api, const std::string& json) {
  auto d = std::make_unique<Desc>(api, CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "device properties");
  d->set(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, static_cast<int64_t>(json.size()),
         json.data());
  d->finalize();
  return d;
}

GraphBuilder::Plan GraphBuilder::build(cudnnHandle_t handle, const Desc* device) {
  Plan p;
  p.graph = std::make_unique<Desc>(api_, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const auto& op : ops_) ops.push_back(op->get());
  p.graph->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops.size()),
               ops.data());
  if (handle) p.graph->set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  p.graph->finalize();
  std::string refusals;
  int refused = 0;
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    std::vector<std::unique_ptr<Desc>> cfgs;
    try {
      cfgs = engine_configs(api_, *p.graph, mode, device);
    } catch (const DnnError& e) {
      refusals += fmt::format("{}{}", refusals.empty() ? "" : "; ", e.what());
      continue;
    }
    for (auto& cfg : cfgs) {
      try {
        auto plan = std::make_unique<Desc>(api_, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
        // (No plan handle: deprecated in 9.19, the graph's is used, as cudnn_frontend does.)
        plan->set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *cfg);
        if (device) plan->set_desc(CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, *device);
        plan->finalize();
        int64_t ws = 0, got = 0;
        api_.check(api_.get_attribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                      1, &got, &ws),
                   "reading the plan's workspace size");
        p.plan = std::move(plan);
        p.workspace = ws;
        p.engine = engine_of(api_, *cfg);
        // The plan's parts live as long as it (cudnn_frontend keeps them too): the engine config and every
        // tensor and operation descriptor of the graph.
        p.parts.push_back(std::move(cfg));
        for (auto& [uid, t] : tensors_) p.parts.push_back(std::move(t));
        for (auto* v : {&ops_, &op_params_})
          for (auto& d : *v) p.parts.push_back(std::move(d));
        tensors_.clear(), ops_.clear(), op_params_.clear();
        return p;
      } catch (const DnnError& e) {
        if (++refused <= 2)
          refusals +=
              fmt::format("{}engine {}: {}", refusals.empty() ? "" : "; ", engine_of(api_, *cfg), e.what());
      }
    }
  }
  if (refused > 2) refusals += fmt::format("; {} more configs refused", refused - 2);
  throw DnnError(refusals.empty() ? std::string("cuDNN's heuristics offered no engine for the graph")
                                  : fmt::format("no engine config ran the graph ({})", refusals));
}

void execute(const Api& api, cudnnHandle_t handle, const Desc& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace) {
  Desc pack(api, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
  pack.set_i64s(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids)
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(pointers.size()),
           pointers.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  api.check(api.execute(handle, plan.get(), pack.get()), "executing the plan");
}

}  // namespace tr::cuda::dnn
