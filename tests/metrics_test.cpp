#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "common/metrics_http.hpp"
#include "rendezvousd/daemon_metrics.hpp"

namespace mcprun {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

/// Sample name (with labels) -> value, and which families have HELP and TYPE lines.
struct Exposition {
  std::map<std::string, double> samples;
  std::map<std::string, std::string> types;
  std::set<std::string> helped;
};

Exposition parse(const std::string& text) {
  Exposition parsed;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string first, name, rest;
    fields >> first;
    if (first == "#") {
      fields >> rest >> name;
      if (rest == "HELP") parsed.helped.insert(name);
      if (rest == "TYPE") fields >> parsed.types[name];
      continue;
    }
    double value = 0;
    fields >> value;
    parsed.samples[first] = value;
  }
  return parsed;
}

TEST(RenderMetrics, EveryFamilyHasHelpAndTypeAndTheHistogramIsCumulative) {
  ServerStats stats;
  stats.record_round(0.003);
  stats.record_round(0.2);
  stats.record_round(700);  // Beyond the last bucket: only +Inf.
  stats.failures = 2;
  stats.stalls = 1;
  stats.restarts = 3;
  stats.heartbeats = 9;
  ServerLoad load{.joining = 1,
                  .running = 2,
                  .finished = 4,
                  .nodes = 5,
                  .connections = 6,
                  .leased_gpus = 7,
                  .leased_ports = 8};
  const Exposition parsed = parse(render_metrics(stats, load, 12345));

  const std::map<std::string, std::string> families{
      {"mcprun_jobs", "gauge"},
      {"mcprun_nodes", "gauge"},
      {"mcprun_connections", "gauge"},
      {"mcprun_rendezvous_rounds_total", "counter"},
      {"mcprun_rendezvous_round_duration_seconds", "histogram"},
      {"mcprun_failures_total", "counter"},
      {"mcprun_stalls_total", "counter"},
      {"mcprun_restarts_total", "counter"},
      {"mcprun_heartbeats_total", "counter"},
      {"mcprun_gpu_leases", "gauge"},
      {"mcprun_port_leases", "gauge"},
      {"process_resident_memory_bytes", "gauge"}};
  EXPECT_EQ(parsed.types, families);
  EXPECT_EQ(parsed.helped.size(), families.size());

  EXPECT_EQ(parsed.samples.at(R"(mcprun_jobs{state="joining"})"), 1);
  EXPECT_EQ(parsed.samples.at(R"(mcprun_jobs{state="running"})"), 2);
  EXPECT_EQ(parsed.samples.at(R"(mcprun_jobs{state="finished"})"), 4);
  EXPECT_EQ(parsed.samples.at("mcprun_nodes"), 5);
  EXPECT_EQ(parsed.samples.at("mcprun_connections"), 6);
  EXPECT_EQ(parsed.samples.at("mcprun_gpu_leases"), 7);
  EXPECT_EQ(parsed.samples.at("mcprun_port_leases"), 8);
  EXPECT_EQ(parsed.samples.at("mcprun_rendezvous_rounds_total"), 3);
  EXPECT_EQ(parsed.samples.at("mcprun_failures_total"), 2);
  EXPECT_EQ(parsed.samples.at("mcprun_stalls_total"), 1);
  EXPECT_EQ(parsed.samples.at("mcprun_restarts_total"), 3);
  EXPECT_EQ(parsed.samples.at("mcprun_heartbeats_total"), 9);
  EXPECT_EQ(parsed.samples.at("process_resident_memory_bytes"), 12345);

  const std::string histogram = "mcprun_rendezvous_round_duration_seconds";
  EXPECT_EQ(parsed.samples.at(histogram + R"(_bucket{le="0.001"})"), 0);
  EXPECT_EQ(parsed.samples.at(histogram + R"(_bucket{le="0.005"})"), 1);
  EXPECT_EQ(parsed.samples.at(histogram + R"(_bucket{le="0.25"})"), 2);
  EXPECT_EQ(parsed.samples.at(histogram + R"(_bucket{le="600"})"), 2);
  EXPECT_EQ(parsed.samples.at(histogram + R"(_bucket{le="+Inf"})"), 3);
  EXPECT_EQ(parsed.samples.at(histogram + "_count"), 3);
  EXPECT_DOUBLE_EQ(parsed.samples.at(histogram + "_sum"), 700.203);
  double previous = 0;
  for (double bound : ServerStats::kRoundBuckets) {
    const double count =
        parsed.samples.at(histogram + "_bucket{le=\"" + fmt::format("{}", bound) + "\"}");
    EXPECT_GE(count, previous) << bound;
    previous = count;
  }
}

/// A MetricsServer on its own loop thread, and blocking clients against it.
class MetricsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.emplace(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0), [this] {
      ++renders_;
      return std::string("mcprun_nodes 3\n");
    });
    endpoint_ = server_->local_endpoint();
    loop_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    asio::post(io_, [this] { server_->stop(); });
    loop_.join();  // stop() leaves the loop no work.
    server_.reset();
  }

  /// Sends `request` and returns everything the server answers until it closes the connection.
  std::string exchange(const std::string& request) {
    asio::io_context client_io;
    tcp::socket socket(client_io);
    socket.connect(endpoint_);
    boost::system::error_code ec;
    asio::write(socket, asio::buffer(request), ec);
    std::string answer;
    asio::read(socket, asio::dynamic_buffer(answer), ec);  // Until EOF or a reset.
    return answer;
  }

  asio::io_context io_;
  std::optional<MetricsServer> server_;
  tcp::endpoint endpoint_;
  std::thread loop_;
  std::atomic<int> renders_{0};
};

TEST_F(MetricsServerTest, ServesMetricsAndRefusesEverythingElse) {
  const std::string ok = exchange("GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            std::string::npos)
      << ok;
  EXPECT_NE(ok.find("\r\n\r\nmcprun_nodes 3\n"), std::string::npos) << ok;

  EXPECT_EQ(exchange("GET /other HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .rfind("HTTP/1.1 404", 0),
            0u);
  EXPECT_EQ(exchange("POST /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .rfind("HTTP/1.1 405", 0),
            0u);
  EXPECT_EQ(exchange("NOT HTTP AT ALL\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  const std::string huge =
      "GET /metrics HTTP/1.1\r\nX-Padding: " + std::string(64 * 1024, 'a') + "\r\n\r\n";
  const std::string refused = exchange(huge);
  EXPECT_TRUE(refused.empty() || refused.rfind("HTTP/1.1 431", 0) == 0) << refused.substr(0, 100);
  // A request body is not part of a scrape.
  EXPECT_EQ(
      exchange("GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello").rfind("HTTP/1.1 4", 0),
      0u);

  // The server still serves, and a query string is ignored.
  EXPECT_EQ(
      exchange("GET /metrics?x=1 HTTP/1.1\r\nConnection: close\r\n\r\n").rfind("HTTP/1.1 200", 0),
      0u);
  EXPECT_EQ(renders_, 2);
}

TEST_F(MetricsServerTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  const std::string twice =
      exchange("GET /metrics HTTP/1.1\r\n\r\nGET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
  size_t responses = 0;
  for (size_t at = twice.find("HTTP/1.1 200"); at != std::string::npos;
       at = twice.find("HTTP/1.1 200", at + 1))
    ++responses;
  EXPECT_EQ(responses, 2u) << twice;
}

TEST_F(MetricsServerTest, StopClosesIdleConnections) {
  asio::io_context client_io;
  tcp::socket idle(client_io);
  idle.connect(endpoint_);
  asio::write(idle, asio::buffer(std::string("GET /metr")));  // Half a request, then silence.
  asio::post(io_, [this] { server_->stop(); });
  char byte;
  boost::system::error_code ec;
  idle.read_some(asio::buffer(&byte, 1), ec);
  EXPECT_TRUE(ec == asio::error::eof || ec == asio::error::connection_reset) << ec.message();
}

}  // namespace
}  // namespace mcprun
