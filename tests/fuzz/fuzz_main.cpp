// One libFuzzer target; MCPRUN_FUZZ_ENTRY names which entry point (tests/fuzz/CMakeLists.txt).
#include "tests/fuzz/fuzz_entry_points.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mcprun::fuzz::MCPRUN_FUZZ_ENTRY(data, size);
  return 0;
}
