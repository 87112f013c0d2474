// Servers with a connection per rank or per agent need more descriptors than the usual soft
// limit of 1024.
#pragma once

#include <sys/resource.h>

#include <limits>

namespace mcprun {

/// Raises the soft RLIMIT_NOFILE to the hard limit; returns the soft limit it leaves.
inline long raise_descriptor_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return std::numeric_limits<long>::max();
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return limit.rlim_cur == RLIM_INFINITY ? std::numeric_limits<long>::max()
                                         : static_cast<long>(limit.rlim_cur);
}

}  // namespace mcprun
