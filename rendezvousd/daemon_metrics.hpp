// rendezvousd's metrics: what its server has done and holds, in Prometheus' text format.
#pragma once

#include <cstdint>
#include <string>

#include "rendezvous/rendezvous_server.hpp"

namespace mcprun {

/// `stats` and `load` in the text exposition format 0.0.4, with the process's resident memory.
std::string render_metrics(const ServerStats& stats, const ServerLoad& load,
                           uint64_t resident_bytes);

}  // namespace mcprun
