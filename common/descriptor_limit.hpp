// Servers with a connection per rank or per agent need more descriptors than the usual soft
// limit of 1024.
#pragma once

#include <sys/resource.h>

namespace mcprun {

/// Raises the soft RLIMIT_NOFILE to the hard limit.
inline void raise_descriptor_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace mcprun
