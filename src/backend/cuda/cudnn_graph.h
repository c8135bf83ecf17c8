// cuDNN's backend graph API from the CUDA backend's host code: libcudnn.so.9 opened at first use (dlopen, as
// NCCL), descriptors as RAII values whose failures throw DnnError naming the step and cuDNN's own message,
// a builder for operation graphs of tensors and ops, and execution plans chosen by cuDNN's heuristics with
// their workspace size. No cudnn_frontend: the C++ frontend headers are not part of the toolkit.
#pragma once
#include <cudnn_graph.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

namespace tr::cuda::dnn {

// A cuDNN call that failed: the caller declines the work (falls back to its own kernels) with this text.
class DnnError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The entry points the graph API needs, resolved once per process from libcudnn.so.9.
struct Api {
  decltype(&cudnnGetVersion) get_version = nullptr;
  decltype(&cudnnGetErrorString) error_string = nullptr;
  decltype(&cudnnGetLastErrorString) last_error = nullptr;
  decltype(&cudnnCreate) create = nullptr;
  decltype(&cudnnDestroy) destroy = nullptr;
  decltype(&cudnnSetStream) set_stream = nullptr;
  decltype(&cudnnBackendCreateDescriptor) create_descriptor = nullptr;
  decltype(&cudnnBackendDestroyDescriptor) destroy_descriptor = nullptr;
  decltype(&cudnnBackendSetAttribute) set_attribute = nullptr;
  decltype(&cudnnBackendGetAttribute) get_attribute = nullptr;
  decltype(&cudnnBackendFinalize) finalize = nullptr;
  decltype(&cudnnBackendExecute) execute = nullptr;
  // Throws DnnError("<what>: <status> (<cuDNN's last message>)") unless s is CUDNN_STATUS_SUCCESS.
  void check(cudnnStatus_t s, const std::string& what) const;
};

// The process's cuDNN, or nullptr with *why set when libcudnn.so.9 is missing or lacks an entry point.
const Api* api(std::string* why);

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  Desc(const Api& api, cudnnBackendDescriptorType_t type, const char* what);
  ~Desc();
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
            const void* values);
  Desc& set_i64(cudnnBackendAttributeName_t name, int64_t v) { return set(name, CUDNN_TYPE_INT64, 1, &v); }
  Desc& set_i64s(cudnnBackendAttributeName_t name, const std::vector<int64_t>& v) {
    return set(name, CUDNN_TYPE_INT64, static_cast<int64_t>(v.size()), v.data());
  }
  Desc& set_dtype(cudnnBackendAttributeName_t name, cudnnDataType_t v) {
    return set(name, CUDNN_TYPE_DATA_TYPE, 1, &v);
  }
  Desc& set_bool(cudnnBackendAttributeName_t name, bool v) { return set(name, CUDNN_TYPE_BOOLEAN, 1, &v); }
  Desc& set_desc(cudnnBackendAttributeName_t name, const Desc& d) {
    cudnnBackendDescriptor_t p = d.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p);
  }
  void finalize();

 private:
  const Api& api_;
  cudnnBackendDescriptor_t d_ = nullptr;
  std::string what_;
};

// A tensor of an operation graph. Dimensions and strides are in elements, outermost first (cuDNN's order).
struct TensorSpec {
  std::vector<int64_t> dims, strides;
  cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
  bool is_virtual = false;  // an intermediate cuDNN keeps inside the fused kernel
  bool by_value = false;    // a host scalar passed with the variant pack (the attention scale)
  int64_t alignment = 16;   // bytes the data pointer is aligned to
};

// A graph under construction: tensors get unique ids in creation order; ops keep their descriptors alive
// until the graph is planned.
class GraphBuilder {
 public:
  explicit GraphBuilder(const Api& api) : api_(api) {}
  // Returns the tensor's unique id (what the variant pack names it by).
  int64_t tensor(const TensorSpec& spec);
  // c = a @ b over the last two dimensions (the leading ones batched, broadcast where 1), f32 accumulation.
  void matmul(int64_t a, int64_t b, int64_t c);
  // y = mode(x [, b]) elementwise with numpy broadcasting (b = 0: none), in `math` (f32; boolean for the
  // comparisons); axis for CUDNN_POINTWISE_GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, int64_t x, int64_t b, int64_t y, int64_t axis = -1,
                 cudnnDataType_t math = CUDNN_DATA_FLOAT);
  // y = select(mask, a, b): mask ? a : b (cuDNN's BINARY_SELECT takes x=a, b=b, t=mask).
  void select(int64_t a, int64_t b, int64_t mask, int64_t y);
  // y = reduction of x over the dimensions where y has size 1, f32.
  void reduction(cudnnReduceTensorOp_t op, int64_t x, int64_t y);
  // y: x's memory under other dims and strides (a transposed view).
  void reshape(int64_t x, int64_t y);
  // The graph finalized on `handle` and the first of cuDNN's heuristic engine configs (mode A, then the
  // fallback list) that finalizes into a plan. Throws DnnError with the first configs' refusals when none
  // does.
  //
  // With `device` (a CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR) and no handle, the plan is made for the GPU the
  // properties describe without one present (cuDNN 9.8's deviceless planning): how the tests check on a
  // machine without a GPU that cuDNN's engines take the graphs.
  // A plan takes the builder's descriptors with it (the builder is spent).
  struct Plan {
    std::unique_ptr<Desc> graph, plan;
    std::vector<std::unique_ptr<Desc>> parts;  // the engine config, tensors and operations it was made from
    int64_t workspace = 0;
    int64_t engine = -1;  // the engine's global index
  };
  Plan build(cudnnHandle_t handle, const Desc* device = nullptr);
  // Operations so far (each finalized: cuDNN has checked its tensors' dims, types and strides).
  int64_t operations() const { return static_cast<int64_t>(ops_.size()); }

 private:
  const Desc& find(int64_t uid) const;
  const Api& api_;
  std::vector<std::pair<int64_t, std::unique_ptr<Desc>>> tensors_;
  std::vector<std::unique_ptr<Desc>> ops_, op_params_;
};

// The properties of a GPU from cuDNN's JSON representation of them
// (CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION: maxGridSize, multiProcessorCount, deviceVer = 100 * major + 10
// * minor, ...), for deviceless planning.
std::unique_ptr<Desc> device_properties(const Api& api, const std::string& json);

// Runs a plan on the handle's stream: pointers[i] is the data of uids[i] (a by-value tensor's points to host
// memory holding its value), workspace at least the plan's size (may be null when that is 0).
void execute(const Api& api, cudnnHandle_t handle, const Desc& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace);

}  // namespace tr::cuda::dnn
