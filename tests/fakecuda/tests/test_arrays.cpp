// fakecuda unit tests: CUDA arrays and mipmapped arrays — sizes, accounting, validation, errors.
// Devices (set by test_main.cpp): two, of 64 MiB and 32 MiB.
#include <vector>

#include "helpers.hpp"

namespace {

size_t free_bytes_now() {
  size_t f = 0, t = 0;
  REQUIRE(cuMemGetInfo(&f, &t) == CUDA_SUCCESS);
  return f;
}

CUDA_ARRAY3D_DESCRIPTOR desc3(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch, unsigned flags = 0) {
  CUDA_ARRAY3D_DESCRIPTOR a{};
  a.Width = w;
  a.Height = h;
  a.Depth = d;
  a.Format = f;
  a.NumChannels = ch;
  a.Flags = flags;
  return a;
}

}  // namespace

TEST_CASE("a 2D array takes width*height*element bytes, rounded to 512, from the arena", "[arrays]") {
  use_device(1);
  size_t free0 = free_bytes_now();
  size_t live0 = fakecuda_live_bytes(1);
  CUDA_ARRAY_DESCRIPTOR d{};
  d.Width = 100;
  d.Height = 30;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 4;
  CUarray a = nullptr;
  REQUIRE(cuArrayCreate(&a, &d) == CUDA_SUCCESS);
  REQUIRE(a != nullptr);
  const size_t expect = (100 * 30 * 16 + 511) / 512 * 512;
  CHECK(fakecuda_array_bytes(a) == expect);
  CHECK(free0 - free_bytes_now() == expect);
  CHECK(fakecuda_live_bytes(1) - live0 == expect);

  CUDA_ARRAY_DESCRIPTOR got{};
  REQUIRE(cuArrayGetDescriptor(&got, a) == CUDA_SUCCESS);
  CHECK(got.Width == 100);
  CHECK(got.Height == 30);
  CHECK(got.Format == CU_AD_FORMAT_FLOAT);
  CHECK(got.NumChannels == 4);
  CUDA_ARRAY3D_DESCRIPTOR got3{};
  REQUIRE(cuArray3DGetDescriptor(&got3, a) == CUDA_SUCCESS);
  CHECK(got3.Depth == 0);
  CHECK(got3.Flags == 0);

  REQUIRE(cuArrayDestroy(a) == CUDA_SUCCESS);
  CHECK(free_bytes_now() == free0);
  CHECK(fakecuda_live_bytes(1) == live0);
  CHECK(fakecuda_array_bytes(a) == 0);
}

TEST_CASE("1D, 3D, layered and cubemap arrays are sized by their extents", "[arrays]") {
  use_device(0);
  struct Case {
    CUDA_ARRAY3D_DESCRIPTOR d;
    size_t bytes;
  };
  const Case cases[] = {
      {desc3(1, 0, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1), 512},
      {desc3(1000, 0, 0, CU_AD_FORMAT_HALF, 2), 4096},
      {desc3(64, 64, 64, CU_AD_FORMAT_FLOAT, 1), 64 * 64 * 64 * 4},
      {desc3(33, 7, 5, CU_AD_FORMAT_SIGNED_INT16, 4), (33 * 7 * 5 * 8 + 511) / 512 * 512},
      {desc3(128, 0, 10, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_LAYERED), 128 * 10 * 4},
      {desc3(32, 32, 3, CU_AD_FORMAT_UNSIGNED_INT8, 4, CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_SURFACE_LDST),
       32 * 32 * 3 * 4},
      {desc3(16, 16, 6, CU_AD_FORMAT_FLOAT, 4, CUDA_ARRAY3D_CUBEMAP), 16 * 16 * 6 * 16},
      {desc3(16, 16, 12, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_CUBEMAP | CUDA_ARRAY3D_LAYERED), 16 * 16 * 12 * 4},
      {desc3(300, 0, 0, CU_AD_FORMAT_UNORM_INT8X4, 4), 1536},
      {desc3(10, 10, 0, CU_AD_FORMAT_UNORM_INT_101010_2, 4), 512},
  };
  for (const Case& c : cases) {
    INFO("w=" << c.d.Width << " h=" << c.d.Height << " d=" << c.d.Depth << " flags=" << c.d.Flags);
    size_t free0 = free_bytes_now();
    CUarray a = nullptr;
    REQUIRE(cuArray3DCreate(&a, &c.d) == CUDA_SUCCESS);
    CHECK(fakecuda_array_bytes(a) == c.bytes);
    CHECK(free0 - free_bytes_now() == c.bytes);
    CUDA_ARRAY3D_DESCRIPTOR got{};
    REQUIRE(cuArray3DGetDescriptor(&got, a) == CUDA_SUCCESS);
    CHECK(got.Width == c.d.Width);
    CHECK(got.Height == c.d.Height);
    CHECK(got.Depth == c.d.Depth);
    CHECK(got.Flags == c.d.Flags);
    CHECK(got.Format == c.d.Format);
    CHECK(got.NumChannels == c.d.NumChannels);
    if (c.d.Depth != 0) {
      CUDA_ARRAY_DESCRIPTOR d2{};
      CHECK(cuArrayGetDescriptor(&d2, a) == CUDA_ERROR_INVALID_VALUE);  // a 3D / layered array
    }
    REQUIRE(cuArrayDestroy(a) == CUDA_SUCCESS);
    CHECK(free_bytes_now() == free0);
  }
}

TEST_CASE("bad array descriptors are CUDA_ERROR_INVALID_VALUE and take nothing", "[arrays]") {
  use_device(1);
  size_t free0 = free_bytes_now();
  const CUDA_ARRAY3D_DESCRIPTOR bad[] = {
      desc3(0, 4, 0, CU_AD_FORMAT_FLOAT, 1),                           // no width
      desc3(4, 4, 0, CU_AD_FORMAT_FLOAT, 3),                           // 3 channels
      desc3(4, 4, 0, CU_AD_FORMAT_FLOAT, 0),                           // 0 channels
      desc3(4, 4, 0, static_cast<CUarray_format>(0x77), 1),            // no such format
      desc3(4, 4, 0, CU_AD_FORMAT_UNORM_INT8X2, 4),                    // channels contradict format
      desc3(4, 0, 4, CU_AD_FORMAT_FLOAT, 1),                           // depth without height
      desc3(4, 4, 0, CU_AD_FORMAT_FLOAT, 1, 0x8000),                   // unknown flag
      desc3(4, 8, 6, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_CUBEMAP),     // cubemap not square
      desc3(4, 4, 5, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_CUBEMAP),     // cubemap not 6 faces
      desc3(4, 4, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_LAYERED),     // layered without layers
      desc3(200000, 0, 0, CU_AD_FORMAT_FLOAT, 1),                      // over TEXTURE1D_WIDTH
      desc3(16, 16, 20000, CU_AD_FORMAT_FLOAT, 1),                     // over TEXTURE3D_DEPTH
      desc3(16, 0, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_TEXTURE_GATHER),  // gather is 2D only
  };
  for (const auto& d : bad) {
    INFO("w=" << d.Width << " h=" << d.Height << " d=" << d.Depth << " ch=" << d.NumChannels << " flags=" << d.Flags);
    CUarray a = nullptr;
    CHECK(cuArray3DCreate(&a, &d) == CUDA_ERROR_INVALID_VALUE);
  }
  CUarray a = nullptr;
  CHECK(cuArray3DCreate(&a, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuArrayCreate(&a, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CUDA_ARRAY_DESCRIPTOR d2{};
  d2.Width = 16;
  d2.Format = CU_AD_FORMAT_FLOAT;
  d2.NumChannels = 1;
  CHECK(cuArrayCreate(nullptr, &d2) == CUDA_ERROR_INVALID_VALUE);
  CHECK(free_bytes_now() == free0);
}

TEST_CASE("an array larger than the free memory is CUDA_ERROR_OUT_OF_MEMORY", "[arrays]") {
  use_device(1);  // 32 MiB
  size_t free0 = free_bytes_now();
  // 4096 x 4096 x 4 bytes = 64 MiB: more than the device has.
  CUDA_ARRAY_DESCRIPTOR d{};
  d.Width = 4096;
  d.Height = 4096;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 1;
  CUarray a = nullptr;
  CHECK(cuArrayCreate(&a, &d) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(free_bytes_now() == free0);
  // Fill the device with 4 MiB arrays until it refuses, then free them all.
  d.Height = 256;
  std::vector<CUarray> arrays;
  for (;;) {
    CUarray x = nullptr;
    CUresult rc = cuArrayCreate(&x, &d);
    if (rc != CUDA_SUCCESS) {
      CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY);
      break;
    }
    arrays.push_back(x);
    REQUIRE(arrays.size() < 16);
  }
  CHECK(arrays.size() >= 6);
  CHECK(free_bytes_now() < 4 * kMiB);
  for (CUarray x : arrays) REQUIRE(cuArrayDestroy(x) == CUDA_SUCCESS);
  CHECK(free_bytes_now() == free0);
}

TEST_CASE("array destroy of an unknown or destroyed handle is CUDA_ERROR_INVALID_HANDLE", "[arrays]") {
  use_device(0);
  CUDA_ARRAY_DESCRIPTOR d{};
  d.Width = 64;
  d.Format = CU_AD_FORMAT_UNSIGNED_INT8;
  d.NumChannels = 1;
  CUarray a = nullptr;
  REQUIRE(cuArrayCreate(&a, &d) == CUDA_SUCCESS);
  REQUIRE(cuArrayDestroy(a) == CUDA_SUCCESS);
  CHECK(cuArrayDestroy(a) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuArrayDestroy(nullptr) == CUDA_ERROR_INVALID_HANDLE);
  int junk = 0;
  CHECK(cuArrayDestroy(reinterpret_cast<CUarray>(&junk)) == CUDA_ERROR_INVALID_HANDLE);
  CUDA_ARRAY_DESCRIPTOR got{};
  CHECK(cuArrayGetDescriptor(&got, a) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuMipmappedArrayDestroy(nullptr) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuMipmappedArrayDestroy(reinterpret_cast<CUmipmappedArray>(&junk)) == CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("sparse and deferred-mapping arrays take no memory", "[arrays]") {
  use_device(0);
  size_t free0 = free_bytes_now();
  auto d = desc3(256, 256, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_DEFERRED_MAPPING);
  CUarray a = nullptr;
  REQUIRE(cuArray3DCreate(&a, &d) == CUDA_SUCCESS);
  CHECK(fakecuda_array_bytes(a) == 0);
  CHECK(free_bytes_now() == free0);
  CUDA_ARRAY_MEMORY_REQUIREMENTS req{};
  REQUIRE(cuArrayGetMemoryRequirements(&req, a, 0) == CUDA_SUCCESS);
  CHECK(req.size == 256 * 256 * 4);
  REQUIRE(cuArrayDestroy(a) == CUDA_SUCCESS);

  d.Flags = CUDA_ARRAY3D_SPARSE;
  REQUIRE(cuArray3DCreate(&a, &d) == CUDA_SUCCESS);
  CHECK(free_bytes_now() == free0);
  CHECK(cuArrayGetMemoryRequirements(&req, a, 0) == CUDA_ERROR_INVALID_VALUE);  // not deferred
  REQUIRE(cuArrayDestroy(a) == CUDA_SUCCESS);
}

TEST_CASE("a mipmapped array takes the sum of its halved levels, and its levels describe themselves", "[arrays]") {
  use_device(0);
  size_t free0 = free_bytes_now();
  auto d = desc3(100, 40, 0, CU_AD_FORMAT_UNSIGNED_INT8, 4);
  CUmipmappedArray m = nullptr;
  REQUIRE(cuMipmappedArrayCreate(&m, &d, 4) == CUDA_SUCCESS);
  // Levels: 100x40, 50x20, 25x10, 12x5, 4 bytes per element, each rounded to 512.
  const size_t levels[] = {16000, 4000, 1000, 240};
  size_t expect = 0;
  for (size_t b : levels) expect += (b + 511) / 512 * 512;
  CHECK(fakecuda_mipmapped_array_bytes(m) == expect);
  CHECK(free0 - free_bytes_now() == expect);

  const size_t widths[] = {100, 50, 25, 12}, heights[] = {40, 20, 10, 5};
  size_t sum = 0;
  for (unsigned i = 0; i < 4; ++i) {
    CUarray l = nullptr;
    REQUIRE(cuMipmappedArrayGetLevel(&l, m, i) == CUDA_SUCCESS);
    CUDA_ARRAY3D_DESCRIPTOR got{};
    REQUIRE(cuArray3DGetDescriptor(&got, l) == CUDA_SUCCESS);
    CHECK(got.Width == widths[i]);
    CHECK(got.Height == heights[i]);
    CHECK(got.Depth == 0);
    sum += fakecuda_array_bytes(l);
    CHECK(cuArrayDestroy(l) == CUDA_ERROR_INVALID_HANDLE);  // levels belong to the mipmapped array
  }
  CHECK(sum == expect);
  CUarray l = nullptr;
  CHECK(cuMipmappedArrayGetLevel(&l, m, 4) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMipmappedArrayGetLevel(&l, m, 0) == CUDA_SUCCESS);

  REQUIRE(cuMipmappedArrayDestroy(m) == CUDA_SUCCESS);
  CHECK(free_bytes_now() == free0);
  CHECK(cuMipmappedArrayDestroy(m) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuMipmappedArrayGetLevel(&l, m, 0) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(fakecuda_array_bytes(l) == 0);  // the level died with it
}

TEST_CASE("mipmapped arrays: 3D levels halve depth, layered levels keep their layers, limits", "[arrays]") {
  use_device(0);
  size_t free0 = free_bytes_now();
  auto d3 = desc3(16, 8, 4, CU_AD_FORMAT_FLOAT, 1);
  CUmipmappedArray m = nullptr;
  // max(16, 8, 4) = 16: at most 5 levels.
  CHECK(cuMipmappedArrayCreate(&m, &d3, 6) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMipmappedArrayCreate(&m, &d3, 0) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMipmappedArrayCreate(&m, &d3, 5) == CUDA_SUCCESS);
  // 16x8x4, 8x4x2, 4x2x1, 2x1x1, 1x1x1 floats.
  size_t expect = 0;
  for (size_t e : {16 * 8 * 4, 8 * 4 * 2, 4 * 2 * 1, 2 * 1 * 1, 1}) expect += (e * 4 + 511) / 512 * 512;
  CHECK(fakecuda_mipmapped_array_bytes(m) == expect);
  CHECK(free0 - free_bytes_now() == expect);
  REQUIRE(cuMipmappedArrayDestroy(m) == CUDA_SUCCESS);

  auto layered = desc3(64, 64, 3, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_LAYERED);
  REQUIRE(cuMipmappedArrayCreate(&m, &layered, 2) == CUDA_SUCCESS);
  CUarray l = nullptr;
  REQUIRE(cuMipmappedArrayGetLevel(&l, m, 1) == CUDA_SUCCESS);
  CUDA_ARRAY3D_DESCRIPTOR got{};
  REQUIRE(cuArray3DGetDescriptor(&got, l) == CUDA_SUCCESS);
  CHECK(got.Width == 32);
  CHECK(got.Height == 32);
  CHECK(got.Depth == 3);
  CHECK(fakecuda_mipmapped_array_bytes(m) == (64 * 64 + 32 * 32) * 3 * 4);
  REQUIRE(cuMipmappedArrayDestroy(m) == CUDA_SUCCESS);

  auto bad = desc3(16, 0, 4, CU_AD_FORMAT_FLOAT, 1);
  CHECK(cuMipmappedArrayCreate(&m, &bad, 1) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMipmappedArrayCreate(nullptr, &d3, 1) == CUDA_ERROR_INVALID_VALUE);
  CHECK(free_bytes_now() == free0);

  use_device(1);  // 32 MiB: a 4096x4096 float mipmap does not fit
  auto big = desc3(4096, 4096, 0, CU_AD_FORMAT_FLOAT, 1);
  CHECK(cuMipmappedArrayCreate(&m, &big, 2) == CUDA_ERROR_OUT_OF_MEMORY);
}

TEST_CASE("arrays need a current context and count their calls", "[arrays]") {
  use_device(0);
  CUcontext saved = nullptr;
  REQUIRE(cuCtxGetCurrent(&saved) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(nullptr) == CUDA_SUCCESS);
  CUDA_ARRAY_DESCRIPTOR d{};
  d.Width = 64;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 1;
  CUarray a = nullptr;
  CHECK(cuArrayCreate(&a, &d) == CUDA_ERROR_INVALID_CONTEXT);
  REQUIRE(cuCtxSetCurrent(saved) == CUDA_SUCCESS);

  fakecuda_reset_counters();
  REQUIRE(cuArrayCreate(&a, &d) == CUDA_SUCCESS);
  REQUIRE(cuArrayDestroy(a) == CUDA_SUCCESS);
  CHECK(fakecuda_call_count("cuArrayCreate_v2") == 1);
  CHECK(fakecuda_call_count("cuArrayCreate") == 1);
  CHECK(fakecuda_call_count("cuArrayDestroy") == 1);
}

TEST_CASE("array bytes land on the device of the current context", "[arrays]") {
  use_device(0);
  size_t live0 = fakecuda_live_bytes(0), live1 = fakecuda_live_bytes(1);
  CUDA_ARRAY_DESCRIPTOR d{};
  d.Width = 1024;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 1;
  CUarray a = nullptr;
  REQUIRE(cuArrayCreate(&a, &d) == CUDA_SUCCESS);
  CHECK(fakecuda_live_bytes(0) - live0 == 4096);
  CHECK(fakecuda_live_bytes(1) == live1);
  CHECK(fakecuda_physical_live_bytes(0) == fakecuda_live_bytes(0));
  // Destroy works from another device's context: the array remembers its own device.
  use_device(1);
  REQUIRE(cuArrayDestroy(a) == CUDA_SUCCESS);
  CHECK(fakecuda_live_bytes(0) == live0);
}
