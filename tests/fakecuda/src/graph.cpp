// fakecuda: stream capture and a minimal graph — enough for allocator and interposer tests.
//
// Captured work is recorded as a list of nodes, in the order it was captured (no fork/join
// across streams). Graph memory: an allocation node reserves its address range when it is
// created (so captured code gets a pointer at once); physical memory is mapped and counted
// against the device at the first launch (or cuGraphUpload) and stays mapped until
// cuDeviceGraphMemTrim finds it freed and no longer owned by a live executable graph.
// Capture rules kept from the driver (see cuStreamBeginCapture / cudaStreamCaptureMode):
//  - "potentially unsafe" calls (cuMemAlloc, cuMemFree, cuCtxSynchronize, ...) are refused
//    with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidate the capture when made by the
//    capturing thread (non-relaxed capture), or by any thread in global mode while a
//    global-mode capture runs; cuThreadExchangeStreamCaptureMode(RELAXED) lifts that;
//  - synchronizing or querying a capturing stream: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
//  - work on the legacy stream while a blocking stream captures:
//    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT; both invalidate the capture.
#include <sys/mman.h>

#include <set>

#include "internal.hpp"

namespace fc {

struct GraphAlloc {
  uintptr_t base = 0;
  size_t size = 0;  // mapped bytes (page multiple)
  int ordinal = 0;
  bool backed = false;
  bool in_use = false;
  int exec_refs = 0;
};

struct Node {
  enum Kind { op, alloc, free, empty } kind = empty;
  OpFn fn;
  GraphAlloc* ga = nullptr;
  CUdeviceptr dptr = 0;
};

struct Graph {
  std::vector<std::unique_ptr<Node>> nodes;
};

namespace {

struct GraphExec {
  std::vector<Node> nodes;
};

std::mutex g_graph_mu;  // graph allocations, graph and exec handle sets
auto& g_graphs = *new std::set<Graph*>;  // these are never destroyed: used at exit
auto& g_execs = *new std::set<GraphExec*>;
auto& g_graph_allocs = *new std::map<uintptr_t, GraphAlloc*>;

struct CaptureInfo {
  Context* ctx;
  CUstreamCaptureMode mode;
  uint64_t thread;
  bool blocking;
};
std::mutex g_capture_mu;
auto& g_capturing = *new std::map<Stream*, CaptureInfo>;
std::atomic<uint64_t> g_next_capture_id{1};
thread_local CUstreamCaptureMode t_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

void invalidate(const std::vector<Stream*>& streams) {
  for (Stream* s : streams) {
    std::lock_guard lk(s->mu);
    if (s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE) s->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
  }
}

GraphAlloc* new_graph_alloc(size_t bytes, int ordinal) {
  size_t size = (bytes + 4095) / 4096 * 4096;
  void* p = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  auto* ga = new GraphAlloc;
  ga->base = reinterpret_cast<uintptr_t>(p);
  ga->size = size;
  ga->ordinal = ordinal;
  {
    std::lock_guard lock(g_graph_mu);
    g_graph_allocs[ga->base] = ga;
  }
  Allocation a;
  a.base = ga->base;
  a.size = bytes;
  a.block = size;
  a.kind = AllocKind::graph;
  a.ordinal = ordinal;
  a.ctx = current_context();
  table_insert(a);
  return ga;
}

// Maps physical memory behind a graph allocation. Caller holds g_graph_mu.
CUresult back_locked(GraphAlloc* ga) {
  if (ga->backed) return CUDA_SUCCESS;
  Device* d = device(ga->ordinal);
  if (!d->reserve(ga->size)) return CUDA_ERROR_OUT_OF_MEMORY;
  void* p = mmap(reinterpret_cast<void*>(ga->base), ga->size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    d->unreserve(ga->size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  ga->backed = true;
  return CUDA_SUCCESS;
}

void unback_locked(GraphAlloc* ga) {
  if (!ga->backed) return;
  mmap(reinterpret_cast<void*>(ga->base), ga->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
       -1, 0);
  device(ga->ordinal)->unreserve(ga->size);
  ga->backed = false;
}

Graph* graph_from(CUgraph h) {
  auto* g = reinterpret_cast<Graph*>(h);
  std::lock_guard lock(g_graph_mu);
  return g_graphs.count(g) ? g : nullptr;
}

Graph* new_graph() {
  auto* g = new Graph;
  std::lock_guard lock(g_graph_mu);
  g_graphs.insert(g);
  return g;
}

}  // namespace

CUstreamCaptureMode& thread_capture_mode() { return t_mode; }

bool capture_prohibits_unsafe_call() {
  if (t_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return false;
  uint64_t me = thread_token();
  std::vector<Stream*> hit;
  {
    std::lock_guard lock(g_capture_mu);
    for (const auto& [s, info] : g_capturing) {
      bool mine = info.thread == me && info.mode != CU_STREAM_CAPTURE_MODE_RELAXED;
      bool global = t_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && info.mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
      if (mine || global) hit.push_back(s);
    }
  }
  invalidate(hit);
  return !hit.empty();
}

bool any_blocking_stream_capturing(Context* ctx) {
  std::lock_guard lock(g_capture_mu);
  for (const auto& [s, info] : g_capturing)
    if (info.ctx == ctx && info.blocking) return true;
  return false;
}

void invalidate_captures_of(Context* ctx) {
  std::vector<Stream*> hit;
  {
    std::lock_guard lock(g_capture_mu);
    for (const auto& [s, info] : g_capturing)
      if (info.ctx == ctx) hit.push_back(s);
  }
  invalidate(hit);
}

void graph_capture_op(Graph* g, OpFn fn) {
  auto n = std::make_unique<Node>();
  n->kind = fn ? Node::op : Node::empty;
  n->fn = std::move(fn);
  g->nodes.push_back(std::move(n));
}

CUresult graph_capture_alloc(Stream* s, size_t bytes, int ordinal, CUdeviceptr* out) {
  GraphAlloc* ga = new_graph_alloc(bytes, ordinal);
  if (!ga) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard lk(s->mu);
  if (s->capture != CU_STREAM_CAPTURE_STATUS_ACTIVE) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  auto n = std::make_unique<Node>();
  n->kind = Node::alloc;
  n->ga = ga;
  n->dptr = ga->base;
  s->capture_graph->nodes.push_back(std::move(n));
  *out = ga->base;
  return CUDA_SUCCESS;
}

CUresult graph_capture_free(Stream* s, CUdeviceptr ptr) {
  GraphAlloc* ga;
  {
    std::lock_guard lock(g_graph_mu);
    auto it = g_graph_allocs.find(ptr);
    if (it == g_graph_allocs.end()) return CUDA_ERROR_INVALID_VALUE;
    ga = it->second;
  }
  std::lock_guard lk(s->mu);
  if (s->capture != CU_STREAM_CAPTURE_STATUS_ACTIVE) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  auto n = std::make_unique<Node>();
  n->kind = Node::free;
  n->ga = ga;
  n->dptr = ptr;
  s->capture_graph->nodes.push_back(std::move(n));
  return CUDA_SUCCESS;
}

bool graph_free_outside(const Allocation& a, Stream* s, CUresult* rc) {
  GraphAlloc* ga;
  {
    std::lock_guard lock(g_graph_mu);
    auto it = g_graph_allocs.find(a.base);
    if (it == g_graph_allocs.end()) {
      *rc = CUDA_ERROR_INVALID_VALUE;
      return false;
    }
    ga = it->second;
  }
  if (stream_is_capturing(s)) {
    *rc = graph_capture_free(s, a.base);
    return true;
  }
  stream_enqueue(
      s,
      [ga] {
        std::lock_guard lock(g_graph_mu);
        ga->in_use = false;
      },
      rc);
  return true;
}

}  // namespace fc

using namespace fc;

// ------------------------------------------------------------------ capture

namespace {

CUresult begin_capture(CUstream h, CUstreamCaptureMode mode, bool pt) {
  Stream* s;
  if (CUresult rc = resolve_stream(h, pt, &s)) return rc;
  if (s->legacy) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  {
    std::lock_guard lk(s->mu);
    if (s->capture != CU_STREAM_CAPTURE_STATUS_NONE) return CUDA_ERROR_ILLEGAL_STATE;
    s->capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    s->capture_mode = mode;
    s->capture_graph = new_graph();
    s->capture_id = g_next_capture_id.fetch_add(1);
    s->capture_thread = thread_token();
  }
  std::lock_guard lock(g_capture_mu);
  g_capturing[s] = CaptureInfo{s->ctx, mode, thread_token(), !(s->flags & CU_STREAM_NON_BLOCKING)};
  return CUDA_SUCCESS;
}

CUresult end_capture(CUstream h, CUgraph* phGraph, bool pt) {
  Stream* s;
  if (CUresult rc = resolve_stream(h, pt, &s)) return rc;
  if (!phGraph) return CUDA_ERROR_INVALID_VALUE;
  Graph* g;
  CUstreamCaptureStatus status;
  {
    std::lock_guard lk(s->mu);
    if (s->capture == CU_STREAM_CAPTURE_STATUS_NONE) return CUDA_ERROR_ILLEGAL_STATE;
    if (s->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED && s->capture_thread != thread_token())
      return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    g = s->capture_graph;
    status = s->capture;
    s->capture = CU_STREAM_CAPTURE_STATUS_NONE;
    s->capture_graph = nullptr;
  }
  {
    std::lock_guard lock(g_capture_mu);
    g_capturing.erase(s);
  }
  if (status == CU_STREAM_CAPTURE_STATUS_INVALIDATED) {
    *phGraph = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  *phGraph = reinterpret_cast<CUgraph>(g);
  return CUDA_SUCCESS;
}

CUresult capture_info(CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                      const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* ndeps, bool pt) {
  Stream* s;
  if (CUresult rc = resolve_stream(h, pt, &s)) return rc;
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  if (s->legacy && any_blocking_stream_capturing(s->ctx)) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  std::lock_guard lk(s->mu);
  *status = s->capture;
  bool on = s->capture != CU_STREAM_CAPTURE_STATUS_NONE;
  if (id && on) *id = s->capture_id;
  if (graph) *graph = on ? reinterpret_cast<CUgraph>(s->capture_graph) : nullptr;
  if (deps) *deps = nullptr;
  if (edges) *edges = nullptr;
  if (ndeps) *ndeps = 0;
  return CUDA_SUCCESS;
}

CUresult is_capturing(CUstream h, CUstreamCaptureStatus* status, bool pt) {
  return capture_info(h, status, nullptr, nullptr, nullptr, nullptr, nullptr, pt);
}

}  // namespace

FC_API CUresult cuStreamBeginCapture(CUstream hStream) {
  FC_ENTER();
  return begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, false);
}
FC_API CUresult cuStreamBeginCapture_ptsz(CUstream hStream) {
  FC_ENTER();
  return begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, true);
}
FC_API CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  FC_ENTER();
  return begin_capture(hStream, mode, false);
}
FC_API CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  FC_ENTER();
  return begin_capture(hStream, mode, true);
}
FC_API CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  FC_ENTER();
  return end_capture(hStream, phGraph, false);
}
FC_API CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  FC_ENTER();
  return end_capture(hStream, phGraph, true);
}
FC_API CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  FC_ENTER();
  return is_capturing(hStream, captureStatus, false);
}
FC_API CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  FC_ENTER();
  return is_capturing(hStream, captureStatus, true);
}
FC_API CUresult cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus* captureStatus_out, cuuint64_t* id_out) {
  FC_ENTER();
  return capture_info(hStream, captureStatus_out, id_out, nullptr, nullptr, nullptr, nullptr, false);
}
FC_API CUresult cuStreamGetCaptureInfo_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                            cuuint64_t* id_out) {
  FC_ENTER();
  return capture_info(hStream, captureStatus_out, id_out, nullptr, nullptr, nullptr, nullptr, true);
}
FC_API CUresult cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                          cuuint64_t* id_out, CUgraph* graph_out, const CUgraphNode** dependencies_out,
                                          size_t* numDependencies_out) {
  FC_ENTER();
  return capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, nullptr,
                      numDependencies_out, false);
}
FC_API CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                               cuuint64_t* id_out, CUgraph* graph_out,
                                               const CUgraphNode** dependencies_out, size_t* numDependencies_out) {
  FC_ENTER();
  return capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, nullptr,
                      numDependencies_out, true);
}
FC_API CUresult cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                          cuuint64_t* id_out, CUgraph* graph_out, const CUgraphNode** dependencies_out,
                                          const CUgraphEdgeData** edgeData_out, size_t* numDependencies_out) {
  FC_ENTER();
  return capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                      numDependencies_out, false);
}
FC_API CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                               cuuint64_t* id_out, CUgraph* graph_out,
                                               const CUgraphNode** dependencies_out,
                                               const CUgraphEdgeData** edgeData_out, size_t* numDependencies_out) {
  FC_ENTER();
  return capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                      numDependencies_out, true);
}

FC_API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  FC_ENTER();
  if (!mode) return CUDA_ERROR_INVALID_VALUE;
  if (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      *mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  std::swap(*mode, t_mode);
  return CUDA_SUCCESS;
}

// ------------------------------------------------------------------ graphs

FC_API CUresult cuGraphCreate(CUgraph* phGraph, unsigned int flags) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!phGraph || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  *phGraph = reinterpret_cast<CUgraph>(new_graph());
  return CUDA_SUCCESS;
}

FC_API CUresult cuGraphDestroy(CUgraph hGraph) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  Graph* g = graph_from(hGraph);
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  {
    std::lock_guard lock(g_graph_mu);
    g_graphs.erase(g);
  }
  delete g;
  return CUDA_SUCCESS;
}

namespace {

CUresult add_node(CUgraphNode* ph, CUgraph hg, std::unique_ptr<Node> n) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  Graph* g = graph_from(hg);
  if (!g || !ph) return CUDA_ERROR_INVALID_VALUE;
  *ph = reinterpret_cast<CUgraphNode>(n.get());
  g->nodes.push_back(std::move(n));
  return CUDA_SUCCESS;
}

CUresult instantiate(CUgraphExec* ph, CUgraph hg) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  Graph* g = graph_from(hg);
  if (!g || !ph) return CUDA_ERROR_INVALID_VALUE;
  auto* e = new GraphExec;
  std::lock_guard lock(g_graph_mu);
  for (const auto& n : g->nodes) {
    e->nodes.push_back(*n);
    if (n->kind == Node::alloc) n->ga->exec_refs++;
  }
  g_execs.insert(e);
  *ph = reinterpret_cast<CUgraphExec>(e);
  return CUDA_SUCCESS;
}

GraphExec* exec_from(CUgraphExec h) {
  auto* e = reinterpret_cast<GraphExec*>(h);
  std::lock_guard lock(g_graph_mu);
  return g_execs.count(e) ? e : nullptr;
}

CUresult upload(GraphExec* e) {
  std::lock_guard lock(g_graph_mu);
  for (auto& n : e->nodes)
    if (n.kind == Node::alloc)
      if (CUresult rc = back_locked(n.ga)) return rc;
  return CUDA_SUCCESS;
}

CUresult launch(CUgraphExec h, CUstream hs, bool pt) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  GraphExec* e = exec_from(h);
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  Stream* s;
  if (CUresult rc = resolve_stream(hs, pt, &s)) return rc;
  if (CUresult rc = upload(e)) return rc;
  for (auto& n : e->nodes) {
    CUresult err = CUDA_SUCCESS;
    switch (n.kind) {
      case Node::op: stream_enqueue(s, n.fn, &err); break;
      case Node::empty: break;
      case Node::alloc: {
        GraphAlloc* ga = n.ga;
        std::lock_guard lock(g_graph_mu);
        ga->in_use = true;
        break;
      }
      case Node::free: {
        GraphAlloc* ga = n.ga;
        stream_enqueue(
            s,
            [ga] {
              std::lock_guard lock(g_graph_mu);
              ga->in_use = false;
            },
            &err);
        break;
      }
    }
    if (err) return err;
  }
  return CUDA_SUCCESS;
}

}  // namespace

FC_API CUresult cuGraphAddEmptyNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                                    size_t numDependencies) {
  FC_ENTER();
  (void)dependencies;
  (void)numDependencies;
  return add_node(phGraphNode, hGraph, std::make_unique<Node>());
}

FC_API CUresult cuGraphAddHostNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                                   size_t numDependencies, const CUDA_HOST_NODE_PARAMS* nodeParams) {
  FC_ENTER();
  (void)dependencies;
  (void)numDependencies;
  if (!nodeParams || !nodeParams->fn) return CUDA_ERROR_INVALID_VALUE;
  auto n = std::make_unique<Node>();
  n->kind = Node::op;
  CUhostFn fn = nodeParams->fn;
  void* user = nodeParams->userData;
  n->fn = [fn, user] { fn(user); };
  return add_node(phGraphNode, hGraph, std::move(n));
}

FC_API CUresult cuGraphAddMemAllocNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                                       size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS* nodeParams) {
  FC_ENTER();
  (void)dependencies;
  (void)numDependencies;
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!nodeParams || nodeParams->bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (nodeParams->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE || !device(nodeParams->poolProps.location.id))
    return CUDA_ERROR_INVALID_VALUE;
  if (!graph_from(hGraph)) return CUDA_ERROR_INVALID_VALUE;
  GraphAlloc* ga = new_graph_alloc(nodeParams->bytesize, nodeParams->poolProps.location.id);
  if (!ga) return CUDA_ERROR_OUT_OF_MEMORY;
  auto n = std::make_unique<Node>();
  n->kind = Node::alloc;
  n->ga = ga;
  n->dptr = ga->base;
  nodeParams->dptr = ga->base;
  return add_node(phGraphNode, hGraph, std::move(n));
}

FC_API CUresult cuGraphAddMemFreeNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                                      size_t numDependencies, CUdeviceptr dptr) {
  FC_ENTER();
  (void)dependencies;
  (void)numDependencies;
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  GraphAlloc* ga;
  {
    std::lock_guard lock(g_graph_mu);
    auto it = g_graph_allocs.find(dptr);
    if (it == g_graph_allocs.end()) return CUDA_ERROR_INVALID_VALUE;
    ga = it->second;
  }
  auto n = std::make_unique<Node>();
  n->kind = Node::free;
  n->ga = ga;
  n->dptr = dptr;
  return add_node(phGraphNode, hGraph, std::move(n));
}

FC_API CUresult cuGraphInstantiate(CUgraphExec* phGraphExec, CUgraph hGraph, CUgraphNode* phErrorNode,
                                   char* logBuffer, size_t bufferSize) {
  FC_ENTER();
  (void)phErrorNode;
  if (logBuffer && bufferSize) logBuffer[0] = 0;
  return instantiate(phGraphExec, hGraph);
}
FC_API CUresult cuGraphInstantiate_v2(CUgraphExec* phGraphExec, CUgraph hGraph, CUgraphNode* phErrorNode,
                                      char* logBuffer, size_t bufferSize) {
  FC_ENTER();
  (void)phErrorNode;
  if (logBuffer && bufferSize) logBuffer[0] = 0;
  return instantiate(phGraphExec, hGraph);
}
FC_API CUresult cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph, unsigned long long flags) {
  FC_ENTER();
  (void)flags;
  return instantiate(phGraphExec, hGraph);
}

namespace {
CUresult instantiate_with_params(CUgraphExec* ph, CUgraph hg, CUDA_GRAPH_INSTANTIATE_PARAMS* params, bool pt) {
  CUresult rc = instantiate(ph, hg);
  if (params) {
    params->result_out = rc ? CUDA_GRAPH_INSTANTIATE_ERROR : CUDA_GRAPH_INSTANTIATE_SUCCESS;
    params->hErrNode_out = nullptr;
    if (!rc && (params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD)) {
      Stream* s;
      if (resolve_stream(params->hUploadStream, pt, &s) == CUDA_SUCCESS) rc = upload(exec_from(*ph));
    }
  }
  return rc;
}
}  // namespace

FC_API CUresult cuGraphInstantiateWithParams(CUgraphExec* phGraphExec, CUgraph hGraph,
                                             CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams) {
  FC_ENTER();
  return instantiate_with_params(phGraphExec, hGraph, instantiateParams, false);
}
FC_API CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                  CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams) {
  FC_ENTER();
  return instantiate_with_params(phGraphExec, hGraph, instantiateParams, true);
}

FC_API CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  FC_ENTER();
  return launch(hGraphExec, hStream, false);
}
FC_API CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  FC_ENTER();
  return launch(hGraphExec, hStream, true);
}

namespace {
CUresult graph_upload(CUgraphExec h, CUstream hs, bool pt) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  GraphExec* e = exec_from(h);
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  Stream* s;
  if (CUresult rc = resolve_stream(hs, pt, &s)) return rc;
  return upload(e);
}
}  // namespace

FC_API CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream) {
  FC_ENTER();
  return graph_upload(hGraphExec, hStream, false);
}
FC_API CUresult cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  FC_ENTER();
  return graph_upload(hGraphExec, hStream, true);
}

FC_API CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
  FC_ENTER();
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  auto* e = reinterpret_cast<GraphExec*>(hGraphExec);
  {
    std::lock_guard lock(g_graph_mu);
    if (!g_execs.erase(e)) return CUDA_ERROR_INVALID_VALUE;
    for (auto& n : e->nodes)
      if (n.kind == Node::alloc) n.ga->exec_refs--;
  }
  delete e;
  return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGraphMemTrim(CUdevice device_ordinal) {
  FC_ENTER();
  if (CUresult rc = check_device(device_ordinal)) return rc;
  std::lock_guard lock(g_graph_mu);
  for (auto& [base, ga] : g_graph_allocs)
    if (ga->ordinal == device_ordinal && ga->backed && !ga->in_use && ga->exec_refs == 0) unback_locked(ga);
  return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetGraphMemAttribute(CUdevice device_ordinal, CUgraphMem_attribute attr, void* value) {
  FC_ENTER();
  if (CUresult rc = check_device(device_ordinal)) return rc;
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(g_graph_mu);
  cuuint64_t used = 0, reserved = 0;
  for (auto& [base, ga] : g_graph_allocs) {
    if (ga->ordinal != device_ordinal || !ga->backed) continue;
    reserved += ga->size;
    if (ga->in_use) used += ga->size;
  }
  switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: *static_cast<cuuint64_t*>(value) = used; break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: *static_cast<cuuint64_t*>(value) = reserved; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
