// What each fuzz target feeds its input to. The libFuzzer targets (fuzz_main.cpp) and the
// replay test (tests/fuzz_regression_test.cpp) call the same functions, so that a committed
// crash input replays through exactly the code that crashed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mcprun::fuzz {

/// The frame decoder, fed in split reads, then every message parser on each frame. The first
/// byte picks the mode: a raw byte stream, one payload, or a real message with one field
/// replaced by whatever JSON (or string) the rest of the input is.
void frames(const uint8_t* data, size_t size);
/// One StoreProtocol connection, in both dialects, fed in reads split where the first byte says.
void store_protocol(const uint8_t* data, size_t size);
/// FileTimer request lines.
void timer_lines(const uint8_t* data, size_t size);
/// A --config job file, then the command line that names it.
void job_file(const uint8_t* data, size_t size);
/// The command line: NUL-separated arguments to parse_launch_config.
void command_line(const uint8_t* data, size_t size);

/// The targets by name, as the corpus and regression folders are named.
struct Target {
  const char* name;
  void (*run)(const uint8_t*, size_t);
};
const std::vector<Target>& targets();

}  // namespace mcprun::fuzz
