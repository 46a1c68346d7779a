// fakecuda: shared helpers of the simulated driver's unit tests.
#pragma once

#include <cuda.h>

#include <catch2/catch.hpp>

#include "fakecuda.h"

// Makes device `ordinal`'s primary context current on this thread (cuInit once).
inline CUcontext use_device(int ordinal) {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CUcontext ctx = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&ctx, ordinal) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
  return ctx;
}

constexpr size_t kMiB = size_t{1} << 20;
