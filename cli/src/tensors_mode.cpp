// cuwarden CLI: `cuwarden run --tensors` — which variables the per-tensor mode sets, which it
// keeps, and what it tells the user before the program starts. The switches themselves are
// one table (common/include/cuw/tensors.hpp); the detail behind each line printed here is in
// docs/tensors.md.
#include "tensors_mode.hpp"

#include <string_view>

#include "cuw/options.hpp"
#include "cuw/tensors.hpp"
#include "cuw/text.hpp"

namespace cuw::cli {

namespace {

/// Markdown of the table as plain text: without the backticks.
std::string plain(std::string_view markdown) {
  std::string s;
  for (char c : markdown)
    if (c != '`') s += c;
  return s;
}

/// PyTorch reads PYTORCH_NO_CUDA_MEMORY_CACHING two ways: up to 2.6 any value at all turns
/// its cache off ("0" too: getenv() != nullptr), from 2.7 only "1" does ("0" keeps it, any
/// other value is ignored with a warning; pytorch/pytorch pull request 145905). Whatever
/// else a user wrote means opposite things in the two, so every value but "1" is said.
std::string pytorch_value_warning(const char* value) {
  const std::string v = cuw::printable(value);
  return "PYTORCH_NO_CUDA_MEMORY_CACHING='" + v +
         "' is in the environment: PyTorch 2.6 and older turn their memory cache off for any value, 0 and "
         "empty too; 2.7 and later only for 1 (0 keeps the cache, another value is ignored). Unset it to keep "
         "the cache, or set it to 1 to turn it off";
}

/// PyTorch's cudaMallocAsync backend is a separate allocator that does not read
/// PYTORCH_NO_CUDA_MEMORY_CACHING (c10/cuda/CUDAMallocAsyncAllocator.cpp): its tensors come
/// from the driver's own pool, which cuwarden's does not serve.
bool pytorch_async_backend(const EnvLookup& env, std::string* which) {
  for (const char* var : {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}) {
    const char* v = env(var);
    if (v && std::string_view(v).find("backend:cudaMallocAsync") != std::string_view::npos) {
      *which = var;
      return true;
    }
  }
  return false;
}

/// What the mode changes for a program, said once before it starts: the ways in which
/// PyTorch's uncached path (c10/cuda/CUDACachingAllocator.cpp: uncached_allocate and
/// uncached_delete) differs from its caching allocator, and what a pool hides.
const char* const kChanges[] = {
    "an allocation refused under PyTorch raises RuntimeError ('CUDA error: out of memory'), not "
    "torch.cuda.OutOfMemoryError, and PyTorch neither frees a cache nor retries: code that catches the "
    "out-of-memory type (batch-size finders, servers that shed load) sees another error",
    "torch.cuda.memory_stats() and memory_allocated() no longer count tensors, only what still goes through "
    "PyTorch's cache (in older releases, raw_alloc's cub and thrust temporaries); cuwarden counts every "
    "tensor",
    "sharing a CUDA tensor with another process (torch.multiprocessing, CUDA IPC) fails in PyTorch itself: "
    "'invalid device pointer'",
    "CUDA graph capture (torch.cuda.graph, torch.compile with mode='reduce-overhead') fails: PyTorch's "
    "uncached path calls cudaMalloc during capture on purpose, and capture forbids it",
    "compute-sanitizer: a pool hands freed memory out again and rounds sizes up, which hides the "
    "use-after-free and out-of-bounds accesses it checks; run it with --pool off",
};

}  // namespace

std::optional<bool> tensors_mode(bool flag, const EnvLookup& env, std::string* why) {
  const char* v = env(cuw::tensors::kVariable);
  const std::string_view value = v ? v : "";
  if (value != "" && value != "0" && value != "1") {
    *why = std::string("bad ") + cuw::tensors::kVariable + "='" + cuw::printable(value) +
           "': use 1 (every tensor through cuwarden's pool, as --tensors) or 0 (off)";
    return std::nullopt;
  }
  return flag || value == "1";
}

TensorsPlan plan_tensors(bool on, const std::string& pool_flag, const std::string& label, const EnvLookup& env) {
  TensorsPlan p;
  const cuw::tensors::Switch& torch = cuw::tensors::get(cuw::tensors::Id::PYTORCH_NO_CUDA_MEMORY_CACHING);
  const char* torch_value = env(torch.variable);
  const bool torch_odd = torch_value && std::string_view(torch_value) != torch.value;
  if (!on) {
    if (torch_odd) p.lines.push_back(pytorch_value_warning(torch_value));
    return p;
  }
  for (const cuw::tensors::Switch& s : cuw::tensors::kSwitches) {
    const std::string what = std::string(" for ") + s.framework + ": " + plain(s.effect);
    if (const char* had = env(s.variable)) {
      if (std::string_view(had) == s.value)
        p.lines.push_back(label + " keeps " + s.variable + "=" + s.value + ", already set," + what);
      else
        p.lines.push_back(label + " keeps " + s.variable + "='" + cuw::printable(had) +
                          "' the environment sets, not " + s.value + " (" + s.framework + ")");
    } else {
      p.set.emplace_back(s.variable, s.value);
      p.lines.push_back(label + " sets " + s.variable + "=" + s.value + what);
    }
  }
  // So that what the program starts (a nested cuwarden run, a tool that reads it) knows.
  if (const char* had = env(cuw::tensors::kVariable); !had || std::string_view(had) != "1") {
    p.set.emplace_back(cuw::tensors::kVariable, "1");
    p.lines.push_back(label + " sets " + cuw::tensors::kVariable +
                      "=1 (a cuwarden run inside the program keeps the mode)");
  }

  const char* pool_var = cuw::options::get(cuw::options::Id::CUWARDEN_POOL).variable;
  const char* env_pool = env(pool_var);
  std::string pool;
  if (!pool_flag.empty()) {
    pool = pool_flag;
    p.lines.push_back(label + " uses the pool --pool " + pool_flag + " chose");
  } else if (env_pool && *env_pool) {
    pool = env_pool;
    p.lines.push_back(label + " keeps " + pool_var + "=" + cuw::printable(env_pool) + " the environment sets");
  } else {
    pool = cuw::tensors::kPool;
    p.set.emplace_back(pool_var, pool);
    p.lines.push_back(label + " sets " + pool_var + "=" + pool +
                      " (the pool serves every tensor; --pool chooses another)");
  }
  if (pool == "off")
    p.lines.push_back(label + " with " + pool_var +
                      "=off: every tensor is a driver allocation and free, which slows a training step several times");

  if (torch_odd) p.lines.push_back(pytorch_value_warning(torch_value));
  std::string conf;
  if (pytorch_async_backend(env, &conf))
    p.lines.push_back(conf + " chooses PyTorch's cudaMallocAsync backend, which ignores " + torch.variable +
                      ": its tensors come from the driver's own pool, not one by one through cuwarden's");
  for (const char* change : kChanges) p.lines.push_back(label + ": " + change);
  p.lines.push_back(label + ": more in docs/tensors.md of cuwarden's source");
  return p;
}

std::string tensors_help() {
  const char* pool_var = cuw::options::get(cuw::options::Id::CUWARDEN_POOL).variable;
  std::string s = std::string("Per-tensor mode (--tensors, or ") + cuw::tensors::kVariable +
                  "=1 in cuwarden run's environment; 0 or unset: off). It sets each\n"
                  "framework's switch that sends every buffer to the driver, where cuwarden's pool serves, caps and\n"
                  "names each one; a variable the environment already holds is kept:";
  for (const cuw::tensors::Switch& sw : cuw::tensors::kSwitches)
    s += std::string("\n  ") + sw.variable + "=" + sw.value + " for " + sw.framework + ": " + plain(sw.effect);
  s += std::string("\nand ") + pool_var + "=" + cuw::tensors::kPool +
       " unless --pool or the environment chooses a pool. Before the program starts it says\n"
       "what it set and what changes: under PyTorch a refusal is a RuntimeError, not torch.cuda.OutOfMemoryError;\n"
       "memory_stats() stops counting tensors; tensors cannot be shared with other processes; CUDA graph capture\n"
       "fails; a pool hides what compute-sanitizer checks (docs/tensors.md in the source). Any run warns of\n"
       "PYTORCH_NO_CUDA_MEMORY_CACHING at a value other than 1: PyTorch 2.6 and older turn the cache off for any\n"
       "value, 0 too.";
  return s;
}

}  // namespace cuw::cli
