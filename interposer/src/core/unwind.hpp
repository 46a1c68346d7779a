// cuwarden interposer core: the native stack walk, as the tracker includes it (core/tracker.cpp,
// for its fork handler); it lives in core/callsites/ (unwind.hpp there says what it is).
#pragma once

#include "core/callsites/unwind.hpp"
