// Reusable f32 scratch for the CPU backend's widened (bf16/f16) GEMMs. A fresh 50 MB copy of the LM head's
// weight per call cost a page fault per page and an munmap per free: 20% of a bf16 step spent in the kernel.
// Leased buffers go back to the pool, which keeps the few largest (what one GEMM's operands need at once).
#pragma once
#include <cstddef>
#include <mutex>
#include <vector>

namespace tr::cpu {

class ScratchPool {
 public:
  // A buffer of at least n floats until the lease ends (contents undefined).
  class Lease {
   public:
    Lease(ScratchPool& pool, float* p, size_t capacity) : pool_(&pool), p_(p), capacity_(capacity) {}
    Lease(Lease&& o) noexcept : pool_(o.pool_), p_(o.p_), capacity_(o.capacity_) { o.p_ = nullptr; }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (p_) pool_->give_back(p_, capacity_);
    }
    float* get() const { return p_; }

   private:
    ScratchPool* pool_;
    float* p_;
    size_t capacity_;
  };

  ScratchPool() = default;
  ScratchPool(const ScratchPool&) = delete;
  ScratchPool& operator=(const ScratchPool&) = delete;
  ~ScratchPool() { release_all(); }

  Lease take(size_t n);
  // Frees every buffer not leased out (torch_empty_cache_steps, tests).
  void release_all();
  size_t pooled_bytes() const;

 private:
  struct Block {
    float* p;
    size_t capacity;
  };
  static constexpr size_t kKeep = 4;  // a GEMM leases up to three (a, b, c); one spare for the next shape
  void give_back(float* p, size_t capacity);

  mutable std::mutex mu_;
  std::vector<Block> free_;
};

}  // namespace tr::cpu
