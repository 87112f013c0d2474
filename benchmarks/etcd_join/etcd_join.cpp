// etcd_join: N simulated mcprun agents in one process forming one job through an etcd cluster,
// each the launcher's own EtcdRendezvous on a thread and an event loop of its own, as N nodes'
// agents would. scripts/bench-etcd drives it and counts what etcd served meanwhile.
//
// Usage: etcd_join --endpoints HOST:PORT,... --agents N [--job ID] [--nproc 8] [--timeout 300]
//
// Prints one JSON line once every agent has its assignment or failed: {"agents", "seconds" (the
// first join to the last assignment), "assigned", "errors", "first_error", "ok" (node ranks
// exactly 0..N-1, rank offsets nproc apart, world size N * nproc)}. Then every agent leaves,
// revoking its lease.
#include <algorithm>
#include <barrier>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "launcher/config/launch_config.hpp"
#include "launcher/rendezvous/etcd_rendezvous.hpp"

int main(int argc, char** argv) {
  using namespace mcprun;
  std::string endpoints, job = "etcd-join";
  int agents = 0, nproc = 8;
  double timeout_s = 300;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--endpoints")
      endpoints = value;
    else if (flag == "--agents")
      agents = std::stoi(value);
    else if (flag == "--job")
      job = value;
    else if (flag == "--nproc")
      nproc = std::stoi(value);
    else if (flag == "--timeout")
      timeout_s = std::stod(value);
  }
  auto members = etcd_members(endpoints);
  if (!members || agents < 1) {
    std::cerr << "usage: etcd_join --endpoints HOST:PORT,... --agents N [--job ID] [--nproc 8] "
                 "[--timeout S]\n";
    return 2;
  }
  etcd::Settings cluster;
  cluster.members = *members;
  std::mutex mutex;
  std::vector<Assignment> assigned;
  std::vector<std::string> errors;
  // Every agent stays in the job until the last has its assignment, as nodes stay while they run.
  std::barrier all_answered(agents);
  const auto start = Clock::now();
  Clock::time_point last_answer = start;
  std::vector<std::thread> threads;
  for (int n = 0; n < agents; ++n)
    threads.emplace_back([&, n] {
      boost::asio::io_context io;
      EtcdRendezvous rendezvous(io, cluster, job, nullptr);
      JoinMessage join;
      join.job = job;
      join.node = "node" + std::to_string(n);
      join.nproc = nproc;
      join.master_port = 29500;
      join.min_nodes = join.max_nodes = agents;
      join.join_timeout_s = timeout_s;
      auto answer =
          rendezvous.join(join, std::chrono::milliseconds(static_cast<long>(timeout_s * 1000)));
      {
        std::lock_guard lock(mutex);
        last_answer = std::max(last_answer, Clock::now());
        if (answer)
          assigned.push_back(*answer);
        else
          errors.push_back(answer.error().message);
      }
      all_answered.arrive_and_wait();
    });
  for (auto& thread : threads) thread.join();
  std::vector<int> node_ranks;
  bool ok = static_cast<int>(assigned.size()) == agents;
  for (const Assignment& a : assigned) {
    node_ranks.push_back(a.group_rank);
    ok = ok && a.world_size == agents * nproc && a.rank_offset == a.group_rank * nproc;
  }
  std::sort(node_ranks.begin(), node_ranks.end());
  for (int i = 0; ok && i < agents; ++i) ok = node_ranks[i] == i;
  nlohmann::json report = {
      {"agents", agents},
      {"seconds", std::chrono::duration<double>(last_answer - start).count()},
      {"assigned", assigned.size()},
      {"errors", errors.size()},
      {"first_error", errors.empty() ? nlohmann::json(nullptr) : nlohmann::json(errors.front())},
      {"ok", ok}};
  std::cout << report.dump() << std::endl;
  return ok ? 0 : 1;
}
