// A planned replay as one device launch (a CUDA graph): when to capture it, when what it baked in (buffer
// addresses, Philox offsets) went stale and it must be captured again, and when to stop trying.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace tr::compile {

class DeviceGraphCache {
 public:
  using Capture =
      std::function<std::unique_ptr<backend::Backend::DeviceGraph>(const std::function<void()>& work)>;

  // Runs `work` as a device graph: launches the one captured for `key` (every address and value the work's
  // launches bake in), capturing it first when there is none or the key changed. Returns false, having run
  // nothing, when there is no graph to launch - the backend has none (capture returned null) or a capture
  // failed before (broken(): why) - and the caller runs the work itself.
  bool run(const std::vector<uint64_t>& key, const Capture& capture, const std::function<void()>& work) {
    if (!broken_.empty()) return false;
    if (!graph_ || key != key_) {
      graph_.reset();
      try {
        graph_ = capture(work);
      } catch (const std::exception& e) {
        broken_ = e.what();
        return false;
      }
      if (!graph_) {
        broken_ = "this backend replays without device graphs";
        return false;
      }
      key_ = key;
      ++captures_;
    }
    graph_->launch();
    return true;
  }
  // Drops the graph (its scratch too): the next run captures again.
  void reset() { graph_.reset(); }
  bool holds_graph() const { return graph_ != nullptr; }
  int64_t captures() const { return captures_; }
  const std::string& broken() const { return broken_; }

 private:
  std::unique_ptr<backend::Backend::DeviceGraph> graph_;
  std::vector<uint64_t> key_;
  int64_t captures_ = 0;
  std::string broken_;
};

}  // namespace tr::compile
