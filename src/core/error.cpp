// Error types are header-only; this unit keeps one out-of-line anchor for their vtables.
#include "src/core/error.h"
