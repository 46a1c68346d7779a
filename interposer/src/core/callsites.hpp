// cuwarden interposer core: call sites, as the tracker includes them (core/tracker.hpp); they
// live in core/callsites/ (callsites.hpp there says what they are).
#pragma once

#include "core/callsites/callsites.hpp"
