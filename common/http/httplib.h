// Includes Debian's cpp-httplib (httplib.h) with its warnings silenced, so
// the rest of the build keeps -Werror. Build with the cpp-httplib pkg-config
// flags (they define the *_SUPPORT macros the shared library was built with).
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wall"
#pragma GCC diagnostic ignored "-Wextra"
#include <httplib.h>
#pragma GCC diagnostic pop
