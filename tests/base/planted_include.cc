// A source that includes the one header SNAPFILL_PLANTED names, compiled with
// the include roots of one layer's library (tests/CMakeLists.txt,
// snapfill_planted_include): the build must refuse a header of a layer
// above, or of the kernels from beyond the backend, and accept one below.
#ifndef SNAPFILL_PLANTED
#define SNAPFILL_PLANTED "snapfill/status.h"
#endif
#include SNAPFILL_PLANTED

int snapfill_planted_include_anchor = 0;
