// cuwarden: the per-tensor mode's table. Each framework that keeps its own cache of device
// memory has a switch that sends every buffer to the driver instead, where cuwarden's pool
// serves, caps and names each one. `cuwarden run --tensors` (or CUWARDEN_TENSORS=1) sets
// these; `cuwarden run --help` lists them and docs/tensors.md's table is generated from
// them (tests/scripts/check_options.py . --write), so the three never drift apart.
//
// How to add a framework's switch:
//   1. Add a row below, with the place in the framework's source or documentation that
//      reads the variable in a comment above it (a switch nobody can point to is not listed).
//   2. Regenerate docs/tensors.md's table: python3 tests/scripts/check_options.py . --write
//      (ctest scripts.options fails until it is current).
//   3. If a value other than the one set means something else in some versions (PyTorch's
//      "0"), say so in cli/src/tensors.cpp's warnings and in docs/tensors.md.
//
// Frameworks with nothing to set (they already allocate each buffer from the driver, or
// their pool is chosen in the program only): docs/tensors.md says which and why.
//
// Header-only, constexpr, no allocation: the interposer may read it too.
#pragma once

#include <cstddef>
#include <string_view>

#include "cuw/options.hpp"

namespace cuw::tensors {

// X(framework, variable, value, effect)
//   framework  who reads the variable, as users name it
//   variable   the environment variable
//   value      what --tensors sets it to (a variable the environment already holds is kept)
//   effect     one line for users: what the framework does with that value (Markdown)
// No field may hold '|', a backslash, a double quote, a newline or an unclosed `literal`.
#define CUW_TENSOR_SWITCHES(X)                                                                                         \
  /* c10/cuda/CUDACachingAllocator.cpp, forceUncachedAllocator(); docs: pytorch.org/docs/stable/                       \
     cuda_environment_variables.html ("If set to 1, disables caching of memory allocations in CUDA"). */               \
  X("PyTorch", PYTORCH_NO_CUDA_MEMORY_CACHING, "1",                                                                    \
    "every tensor from `cudaMalloc`, freed with `cudaFree`; no caching allocator")                                     \
  /* docs.jax.dev/en/latest/gpu_memory_allocation.html: "allocate exactly what is needed on demand, and                \
     deallocate memory that is no longer needed"; read by jaxlib's GPU client. */                                      \
  X("JAX", XLA_PYTHON_CLIENT_ALLOCATOR, "platform",                                                                    \
    "each buffer allocated from the driver on demand and freed when no longer needed; no BFC pool")                    \
  /* tensorflow/core/common_runtime/gpu/gpu_process_state.cc, UseCudaMallocAllocator(): the value                      \
     cuda_malloc replaces the BFC allocator with GPUcudaMallocAllocator (gpu_cudamalloc_allocator.cc:                  \
     cuMemAlloc and cuMemFree per tensor). */                                                                          \
  X("TensorFlow", TF_GPU_ALLOCATOR, "cuda_malloc",                                                                     \
    "every tensor from the driver's `cuMemAlloc`, freed with `cuMemFree`; no BFC allocator")                           \
  /* rapidsai/cudf python/cudf/cudf/pandas/__init__.py, install(): cuda keeps RMM's                                    \
     CudaMemoryResource instead of the managed pool cudf.pandas makes by default. */                                   \
  X("cudf.pandas (RAPIDS)", CUDF_PANDAS_RMM_MODE, "cuda",                                                              \
    "every buffer from `cudaMalloc` through RMM's `CudaMemoryResource`; no pool, no managed memory")

/// One row of CUW_TENSOR_SWITCHES. Every field is a NUL-terminated literal with static storage.
struct Switch {
  const char* framework;  ///< "PyTorch"
  const char* variable;   ///< "PYTORCH_NO_CUDA_MEMORY_CACHING"
  const char* value;      ///< "1": what the per-tensor mode sets
  const char* effect;     ///< Markdown, one line
};

/// Names a row: Id::PYTORCH_NO_CUDA_MEMORY_CACHING is the index of that variable's row.
enum class Id : std::size_t {
#define CUW_TENSOR_ID(framework, var, value, effect) var,
  CUW_TENSOR_SWITCHES(CUW_TENSOR_ID)
#undef CUW_TENSOR_ID
};

/// Every row, in table order.
inline constexpr Switch kSwitches[] = {
#define CUW_TENSOR_ROW(framework, var, value, effect) {framework, #var, value, effect},
    CUW_TENSOR_SWITCHES(CUW_TENSOR_ROW)
#undef CUW_TENSOR_ROW
};

/// The row of `id`. constexpr; thread-safe.
constexpr const Switch& get(Id id) noexcept { return kSwitches[static_cast<std::size_t>(id)]; }

/// The pool the per-tensor mode picks when neither `--pool` nor CUWARDEN_POOL chooses one.
/// One constant, so that the choice (which pool meets the mode's speed and memory targets)
/// is made here and nowhere else. A literal of CUWARDEN_POOL (checked below).
inline constexpr const char* kPool = "vmm";
static_assert(options::is_literal(options::Id::CUWARDEN_POOL, kPool), "kPool must be a value of CUWARDEN_POOL");

/// The variable that turns the mode on in `cuwarden run`'s environment, and its values.
inline constexpr const char* kVariable = "CUWARDEN_TENSORS";

namespace detail {
constexpr bool rows_well_formed() noexcept {
  for (const Switch& s : kSwitches) {
    if (*s.framework == '\0' || *s.value == '\0' || *s.effect == '\0') return false;
    if (!options::detail::plain_field(s.framework) || !options::detail::plain_field(s.value) ||
        !options::detail::plain_field(s.effect))
      return false;
  }
  return true;
}
}  // namespace detail
static_assert(detail::rows_well_formed(),
              "CUW_TENSOR_SWITCHES: an empty field, or one holding | \\ \" a newline or an unclosed `");

}  // namespace cuw::tensors
