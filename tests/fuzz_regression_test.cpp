// Replays every committed fuzz input (tests/fuzz/regressions/<target>/: crashes found, now
// fixed; tests/fuzz/corpus/<target>/: the seeds) through the entry point of its target, so a
// crash once found stays fixed in the plain and the sanitizer builds.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/fuzz/fuzz_entry_points.hpp"

namespace mcprun {
namespace {

namespace fs = std::filesystem;

size_t replay(const char* folder) {
  size_t replayed = 0;
  for (const fuzz::Target& target : fuzz::targets()) {
    const fs::path inputs = fs::path(MCPRUN_SOURCE_DIR) / "tests/fuzz" / folder / target.name;
    if (!fs::is_directory(inputs)) continue;
    for (const auto& entry : fs::directory_iterator(inputs)) {
      if (!entry.is_regular_file() || entry.path().filename().string().starts_with(".")) continue;
      std::ifstream in(entry.path(), std::ios::binary);
      const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      SCOPED_TRACE(entry.path().string());
      target.run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++replayed;
    }
  }
  return replayed;
}

TEST(FuzzRegression, EveryCrashFoundReplaysCleanly) { replay("regressions"); }

TEST(FuzzRegression, EverySeedReplaysCleanly) { EXPECT_GT(replay("corpus"), 0u); }

}  // namespace
}  // namespace mcprun
