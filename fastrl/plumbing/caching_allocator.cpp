// torch's CPU allocator, with the blocks of large tensors kept when freed and
// handed out again for the next request of the same size (caching_allocator.py
// says why). Built by caching_allocator.py and loaded with ctypes: it needs only
// c10's headers and library, so it compiles in a few seconds with no Python
// bindings. (Its blocks do not show in torch's CPU memory profiler.)
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace {

// Sizes are rounded up to whole pages, so that tensors a few bytes apart share blocks.
constexpr size_t kRound = 4096;

struct Cache {
  std::mutex mu;
  std::unordered_map<void*, size_t> live;  // every large block handed out: its rounded size
  std::unordered_map<size_t, std::vector<void*>> free_blocks;  // rounded size -> kept blocks
  size_t min_bytes = 0, max_cached = 0, cached = 0;
  size_t hits = 0, misses = 0, released = 0;
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: tensors may be freed during exit
  return *c;
}

// Keeps the block just freed, making room by returning older blocks of other
// sizes to the system: the sizes a training loop frees are the ones it asks for
// next, and a size it stopped using must not hold the cache forever.
void release(void* ptr) {
  Cache& c = cache();
  std::vector<void*> to_free;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.live.find(ptr);
    if (it == c.live.end()) {
      to_free.push_back(ptr);  // a small block: never cached
    } else {
      const size_t size = it->second;
      c.live.erase(it);
      // A block larger than the whole cache goes back at once, evicting nothing.
      for (auto bucket = c.free_blocks.begin();
           size <= c.max_cached && c.cached + size > c.max_cached && bucket != c.free_blocks.end();) {
        while (bucket->first != size && !bucket->second.empty() && c.cached + size > c.max_cached) {
          to_free.push_back(bucket->second.back());
          bucket->second.pop_back();
          c.cached -= bucket->first;
        }
        bucket = bucket->second.empty() ? c.free_blocks.erase(bucket) : std::next(bucket);
      }
      if (c.cached + size <= c.max_cached) {
        c.free_blocks[size].push_back(ptr);
        c.cached += size;
      } else {  // larger than the cache, or blocks of its own size fill it
        to_free.push_back(ptr);
      }
      c.released += to_free.size();
    }
  }
  for (void* p : to_free) c10::free_cpu(p);
}

// Every block, small or large, comes from c10::alloc_cpu (what torch's own CPU
// allocator calls) and goes back through `release`: oneDNN frees its scratch
// memory with raw_deleter() whatever its size, so there is one deleter for all.
struct CachingCPUAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    Cache& c = cache();
    if (n < c.min_bytes) {
      void* ptr = c10::alloc_cpu(n);
      return {ptr, ptr, &release, c10::Device(c10::DeviceType::CPU)};
    }
    const size_t size = (n + kRound - 1) / kRound * kRound;
    void* ptr = nullptr;
    {
      std::lock_guard<std::mutex> lock(c.mu);
      auto it = c.free_blocks.find(size);
      if (it != c.free_blocks.end() && !it->second.empty()) {
        ptr = it->second.back();
        it->second.pop_back();
        c.cached -= size;
        c.hits++;
      } else {
        c.misses++;
      }
    }
    if (ptr == nullptr) ptr = c10::alloc_cpu(size);
    {
      std::lock_guard<std::mutex> lock(c.mu);
      c.live.emplace(ptr, size);
    }
    return {ptr, ptr, &release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

}  // namespace

extern "C" {

// Installs the allocator once for the process (tensors allocated before keep
// their own deleter); later calls only change the limits, returning what the new
// cap no longer holds to the system. max_cached 0 keeps nothing: torch's own
// behaviour, through this allocator.
void fastrl_install_caching_allocator(size_t min_bytes, size_t max_cached) {
  static CachingCPUAllocator* installed = nullptr;
  Cache& c = cache();
  std::vector<void*> to_free;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.min_bytes = min_bytes;
    c.max_cached = max_cached;
    for (auto& bucket : c.free_blocks) {
      while (c.cached > c.max_cached && !bucket.second.empty()) {
        to_free.push_back(bucket.second.back());
        bucket.second.pop_back();
        c.cached -= bucket.first;
      }
    }
    c.released += to_free.size();
  }
  for (void* p : to_free) c10::free_cpu(p);
  if (installed == nullptr) {
    installed = new CachingCPUAllocator();
    c10::SetCPUAllocator(installed, /*priority=*/1);
  }
}

// out[5]: blocks reused, blocks allocated new, blocks returned to the system,
// bytes cached now, blocks handed out and not yet freed.
void fastrl_caching_allocator_stats(size_t* out) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  out[0] = c.hits; out[1] = c.misses; out[2] = c.released; out[3] = c.cached; out[4] = c.live.size();
}

}
