// The one bounded wait on an Asio loop that every component uses.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>

namespace mcprun {

/// Runs `io` one handler at a time until `done()` or `limit` passes; returns done().
inline bool run_until(boost::asio::io_context& io, const std::function<bool()>& done,
                      std::chrono::steady_clock::duration limit) {
  // Shared with the handler, which may run after this frame is gone.
  if (io.stopped()) io.restart();  // A loop that once ran out of work would not run again.
  auto expired = std::make_shared<bool>(false);
  boost::asio::steady_timer timer(io, limit);
  timer.async_wait([expired](boost::system::error_code ec) { *expired = !ec; });
  while (!done() && !*expired) io.run_one();
  return done();
}

}  // namespace mcprun
