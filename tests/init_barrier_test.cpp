// The init barrier as real torch clients drive it: byte captures of torch 1.13's and 2.13's
// env:// init (scripts/capture-store-traffic) replayed through the job store's protocol.
#include "launcher/store/init_barrier.hpp"

#include <gtest/gtest.h>

#include <boost/asio/ip/address.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "launcher/store/torch_keys.hpp"

namespace mcprun {
namespace {

using boost::asio::ip::make_address;
using boost::asio::ip::tcp;

const std::filesystem::path kCaptures = std::filesystem::path(MCPRUN_SOURCE_DIR) / "tests/captures";

/// Feeds every key change the store makes to an InitBarrierWatch, as StallWatch does.
class WatchingOutlet : public StoreOutlet {
 public:
  explicit WatchingOutlet(InitBarrierWatch& watch) : watch_(watch) {}
  void deliver(uint64_t, std::string_view) override {}
  void changed(StoreEvent::Kind kind, uint64_t connection, std::string_view key,
               int64_t value) override {
    watch_.observe({kind, connection, peer(connection), std::string(key), value});
  }
  static tcp::endpoint peer(uint64_t connection) {
    return {make_address("127.0.0.1"), static_cast<unsigned short>(40000 + connection)};
  }

 private:
  InitBarrierWatch& watch_;
};

/// One chunk a client sent, as the capture recorded it.
struct Chunk {
  uint32_t connection = 0;
  std::string bytes;
};

std::vector<Chunk> chunks_of(const std::string& capture) {
  std::ifstream in(kCaptures / capture / "requests.bin", std::ios::binary);
  EXPECT_TRUE(in) << capture;
  std::vector<Chunk> chunks;
  for (Chunk chunk; in.read(reinterpret_cast<char*>(&chunk.connection), 4);) {
    uint32_t length = 0;
    in.read(reinterpret_cast<char*>(&length), 4);
    chunk.bytes.resize(length);
    in.read(chunk.bytes.data(), length);
    chunks.push_back(chunk);
  }
  return chunks;
}

/// Replays a capture through one store in the order its server received it (each connection's
/// requests may span chunks), keeping only the connections `keep` accepts.
struct Replay {
  explicit Replay(bool barrier_runs) : watch(2, barrier_runs) {}

  void run(const std::string& capture, std::function<bool(uint32_t)> keep = {}) {
    for (const Chunk& chunk : chunks_of(capture)) {
      if (keep && !keep(chunk.connection)) continue;
      const uint64_t connection = chunk.connection + 1;
      auto [it, fresh] = protocols.try_emplace(connection, state, connection);
      if (fresh)
        watch.observe(
            {StoreEvent::Kind::kConnected, connection, WatchingOutlet::peer(connection), {}, 0});
      std::string& pending = unread[connection];
      pending += chunk.bytes;
      std::string replies;
      pending.erase(0, it->second.consume(pending, replies));
      // A torch 1.x get of a key no other rank set: the real client would still be waiting.
      if (keep && it->second.failed()) return;
      ASSERT_FALSE(it->second.failed()) << capture << ": " << it->second.error();
    }
  }

  InitBarrierWatch watch;
  WatchingOutlet outlet{watch};
  StoreState state{outlet};
  std::map<uint64_t, StoreProtocol> protocols;
  std::map<uint64_t, std::string> unread;
};

class InitBarrierCaptures : public ::testing::TestWithParam<std::string> {};

TEST_P(InitBarrierCaptures, PassesWithEveryRankAndNamesBoth) {
  const bool barrier_runs = GetParam() != "torch2.13-no-barrier";
  Replay replay(barrier_runs);
  replay.run(GetParam());
  EXPECT_TRUE(replay.watch.passed());
  ASSERT_EQ(replay.watch.arrived().size(), 1u);
  EXPECT_EQ(replay.watch.arrived().begin()->second.size(), 2u) << "two ranks arrived";
}

TEST_P(InitBarrierCaptures, OneRankAloneNeverPasses) {
  // The first connection that reached the default group: it waits for a rank that never comes.
  uint32_t first = UINT32_MAX;
  for (const Chunk& chunk : chunks_of(GetParam()))
    if (chunk.bytes.find("default_pg") != std::string::npos) {
      first = chunk.connection;
      break;
    }
  Replay replay(GetParam() != "torch2.13-no-barrier");
  replay.run(GetParam(), [&](uint32_t connection) { return connection == first; });
  EXPECT_FALSE(replay.watch.passed());
  // torch 1.13 blocks in gloo's rendezvous before its barrier; 2.13 reaches the barrier first.
  const PeerPorts alone{{"127.0.0.1", {40001 + static_cast<int>(first)}}};
  EXPECT_EQ(replay.watch.arrived(), GetParam() == "torch1.13" ? PeerPorts{} : alone);
}

INSTANTIATE_TEST_SUITE_P(RealClients, InitBarrierCaptures,
                         ::testing::Values("torch1.13", "torch2.13", "torch2.13-no-barrier"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::erase_if(name, [](char c) { return !std::isalnum(c); });
                           return name;
                         });

TEST(InitBarrierCaptures, ExpectingABarrierTorchDoesNotRunWouldBeAFalseStall) {
  Replay replay(true);
  replay.run("torch2.13-no-barrier");
  EXPECT_FALSE(replay.watch.passed());
}

TEST(TorchKeys, RecognisesTheDefaultGroupsBarrierInBothDialects) {
  using torch_keys::is_init_barrier;
  EXPECT_TRUE(is_init_barrier("//worker/attempt_0/default_pg/store_based_barrier_key:1"));
  EXPECT_TRUE(is_init_barrier("//worker/attempt_12/default_pg/store_based_barrier_key:1"));
  EXPECT_TRUE(is_init_barrier("/default_pg/store_based_barrier_key:0"));
  EXPECT_FALSE(is_init_barrier("/default_pg/store_based_barrier_key:0:last_worker"));
  EXPECT_FALSE(is_init_barrier("/default_pg/store_based_barrier_key:"));
  EXPECT_FALSE(is_init_barrier("//worker/attempt_/default_pg/store_based_barrier_key:1"));
  EXPECT_FALSE(is_init_barrier("/worker/attempt_0/default_pg/store_based_barrier_key:1"))
      << "without the client's own prefix no real client sends it";
  EXPECT_FALSE(is_init_barrier("/1/store_based_barrier_key:0")) << "a subgroup's";
  EXPECT_FALSE(is_init_barrier("/default_pg/0//cpu//0/1"));
  EXPECT_FALSE(is_init_barrier(""));
}

TEST(TorchKeys, TellsProcessGroupKeysFromOthers) {
  EXPECT_TRUE(torch_keys::is_default_group_key("/default_pg/0//cpu//0/1"));
  EXPECT_TRUE(torch_keys::is_default_group_key("//worker/attempt_1/default_pg/0/0/rank_0"));
  EXPECT_FALSE(torch_keys::is_default_group_key("init/"));
  EXPECT_FALSE(torch_keys::is_default_group_key("/init/"));
  EXPECT_FALSE(torch_keys::is_default_group_key("/my_app/default_pg/x"));
}

}  // namespace
}  // namespace mcprun
