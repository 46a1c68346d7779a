// cuwarden GPU test: memory the program allocates stays accessible from the peer GPUs it
// enabled, whoever serves the allocation (CUWARDEN_POOL=cache: blocks packed in a slab, whole
// blocks, blocks the cache hands out again). Built by tests/gpu/cache_reuse.sh with the
// machine's nvcc.
//
//   peer_access
//
// For each direction (owner device, accessor device) of two GPUs that can reach each other:
// on the owner, blocks of 4 KiB, 1 MiB and 64 MiB allocated before the accessor enabled
// peer access, the same sizes after it, and after it again once freed and allocated anew
// (the cache's reused blocks); for each block a kernel on the accessor writes a pattern
// into it, a kernel on the owner counts the words that differ, then the accessor reads it
// back with cudaMemcpyPeer into its own memory and a kernel there counts again. Prints one
// JSON line ({"skipped": ...} without two such GPUs); exit 0 when every word of every block
// matched, 1 otherwise, 2 on a CUDA error.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CK(call)                                                                           \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "peer_access: %s: %s\n", #call, cudaGetErrorString(e_));        \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

__global__ void fill(unsigned* p, size_t words, unsigned tag) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x)
    p[i] = static_cast<unsigned>(i) * 2654435761u ^ tag;
}

__global__ void count_wrong(const unsigned* p, size_t words, unsigned tag, unsigned long long* out) {
  unsigned long long n = 0;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x)
    n += p[i] != (static_cast<unsigned>(i) * 2654435761u ^ tag);
  atomicAdd(out, n);
}

/// Words of `p` (on the current device) that do not hold the pattern `tag`.
static unsigned long long wrong_words(const unsigned* p, size_t words, unsigned tag) {
  unsigned long long* c = nullptr;
  CK(cudaMalloc(&c, sizeof *c));
  CK(cudaMemset(c, 0, sizeof *c));
  count_wrong<<<256, 256>>>(p, words, tag, c);
  CK(cudaGetLastError());
  unsigned long long n = 0;
  CK(cudaMemcpy(&n, c, sizeof n, cudaMemcpyDeviceToHost));
  CK(cudaFree(c));
  return n;
}

int main() {
  int n = 0, can01 = 0, can10 = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2 || cudaDeviceCanAccessPeer(&can01, 0, 1) != cudaSuccess ||
      cudaDeviceCanAccessPeer(&can10, 1, 0) != cudaSuccess || !can01 || !can10) {
    std::printf("{\"skipped\":\"needs two GPUs with peer access (devices: %d)\"}\n", n);
    return 0;
  }
  const size_t sizes[] = {4096, 1u << 20, 64u << 20};
  int blocks = 0;
  unsigned long long wrong_direct = 0, wrong_copy = 0;
  std::string detail;
  for (int owner = 0; owner < 2; ++owner) {
    const int peer = 1 - owner;
    struct Block {
      unsigned* p;
      size_t bytes;
      const char* when;
    };
    std::vector<Block> list;
    CK(cudaSetDevice(owner));
    for (size_t b : sizes) {
      unsigned* p = nullptr;
      CK(cudaMalloc(&p, b));
      list.push_back({p, b, "before"});
    }
    CK(cudaSetDevice(peer));
    CK(cudaDeviceEnablePeerAccess(owner, 0));
    CK(cudaSetDevice(owner));
    for (size_t b : sizes) {
      unsigned* p = nullptr;
      CK(cudaMalloc(&p, b));
      list.push_back({p, b, "after"});
    }
    for (size_t b : sizes) {  // freed and allocated anew: the cache hands out a block it keeps
      unsigned* p = nullptr;
      CK(cudaMalloc(&p, b));
      CK(cudaFree(p));
      CK(cudaMalloc(&p, b));
      list.push_back({p, b, "reused"});
    }
    for (const Block& blk : list) {
      const size_t words = blk.bytes / 4;
      const unsigned tag = 0x9E3779B9u + static_cast<unsigned>(blocks) * 77u;
      CK(cudaSetDevice(peer));  // the accessor writes the owner's block
      fill<<<256, 256>>>(blk.p, words, tag);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      CK(cudaSetDevice(owner));
      const unsigned long long d = wrong_words(blk.p, words, tag);
      CK(cudaSetDevice(peer));  // and copies it into its own memory
      unsigned* mine = nullptr;
      CK(cudaMalloc(&mine, blk.bytes));
      CK(cudaMemcpyPeer(mine, peer, blk.p, owner, blk.bytes));
      const unsigned long long c = wrong_words(mine, words, tag);
      CK(cudaFree(mine));
      wrong_direct += d;
      wrong_copy += c;
      ++blocks;
      char line[160];
      std::snprintf(line, sizeof line, "%s{\"owner\":%d,\"bytes\":%zu,\"when\":\"%s\",\"wrong\":%llu,\"wrong_copy\":%llu}",
                    detail.empty() ? "" : ",", owner, blk.bytes, blk.when, d, c);
      detail += line;
    }
    CK(cudaSetDevice(owner));
    for (const Block& blk : list) CK(cudaFree(blk.p));
  }
  const bool ok = wrong_direct == 0 && wrong_copy == 0;
  std::printf("{\"path\":\"peer_access\",\"blocks\":%d,\"wrong_words\":%llu,\"wrong_words_copy\":%llu,\"ok\":%s,"
              "\"blocks_detail\":[%s]}\n",
              blocks, wrong_direct, wrong_copy, ok ? "true" : "false", detail.c_str());
  return ok ? 0 : 1;
}
