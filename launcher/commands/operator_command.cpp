#include "launcher/commands/operator_command.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <cstdio>
#include <iostream>
#include <optional>

#include "common/endpoint.hpp"
#include "common/event_loop.hpp"
#include "common/exit_status.hpp"
#include "common/framed_session.hpp"
#include "common/messages.hpp"
#include "common/protocol.hpp"
#include "launcher/config/subcommand.hpp"

namespace mcprun {
namespace {

namespace asio = boost::asio;

/// How long the daemon may take to answer an operator request once connected.
constexpr std::chrono::seconds kOperatorRequestTimeout{10};

/// One request's connection: the first frame back is the answer. Whatever ends it early is kept
/// for the command's one line, not logged.
class OperatorExchange : public FramedSession {
 public:
  using FramedSession::FramedSession;
  std::optional<Expected<nlohmann::json>> answer;

 private:
  void on_frame(const nlohmann::json& message) override {
    answer = message;
    close();
  }
  void on_cut(const std::string& reason) override { cut_because_ = reason; }
  void on_closed() override {
    if (answer) return;
    answer = Error{peer() + (cut_because_.empty() ? " closed the connection without an answer"
                                                  : ": " + cut_because_)};
  }
  std::string cut_because_;
};

/// Sends one request and reads the one reply; an error line naming the endpoint otherwise.
Expected<nlohmann::json> ask_daemon(const std::string& endpoint, const nlohmann::json& request) {
  auto parsed = parse_endpoint(endpoint, kConnectRules);
  if (!parsed) return Error{"--rdzv-endpoint " + parsed.error().message};
  asio::io_context io;
  auto dialled = connect_within(io, *parsed, kConnectTimeout);
  if (!dialled)
    return Error{"cannot reach rendezvousd at " + endpoint + ": " + dialled.error().message};
  auto exchange = std::make_shared<OperatorExchange>(
      std::move(dialled->socket), "rendezvousd at " + endpoint, kUnmeteredLimits);
  exchange->start(std::chrono::milliseconds::zero());  // Bounded below, with the command's line.
  exchange->send(request);
  const bool answered = run_until(
      io, [&] { return exchange->answer.has_value(); }, kOperatorRequestTimeout);
  if (!answered) {
    exchange->close();
    return Error{fmt::format("rendezvousd at {} did not answer within {} s", endpoint,
                             kOperatorRequestTimeout.count())};
  }
  return std::move(*exchange->answer);
}

std::string format_age(double seconds) {
  if (seconds < 120) return fmt::format("{:.0f}s", seconds);
  if (seconds < 7200) return fmt::format("{:.0f}m", seconds / 60);
  return fmt::format("{:.1f}h", seconds / 3600);
}

void print_jobs(const std::vector<JobSummary>& jobs) {
  std::cout << fmt::format("{:<24} {:<24} {:>5} {:>5} {:<9} {:>6}\n", "ID", "OWNER", "NODES",
                           "RANKS", "STATE", "AGE");
  for (const JobSummary& job : jobs)
    std::cout << fmt::format("{:<24} {:<24} {:>5} {:>5} {:<9} {:>6}\n", job.id, job.owner,
                             job.nodes, job.ranks, job.state, format_age(job.age_s));
}

void print_status(const JobStatus& status) {
  const JobSummary& job = status.summary;
  std::cout << fmt::format("job {}: {}, owner {}, {} node(s) ({}..{}), {} rank(s), age {}\n",
                           job.id, job.state, job.owner, job.nodes, status.min_nodes,
                           status.max_nodes, job.ranks, format_age(job.age_s));
  if (!status.master.empty()) std::cout << "  master " << status.master << "\n";
  for (const JobPlacementLine& node : status.placement)
    std::cout << fmt::format("  node rank {}: {} ({}), ranks {}\n", node.group_rank, node.node,
                             node.addr, node.ranks);
  for (const JobMember& member : status.members)
    if (!member.connected) std::cout << "  " << member.node << ": disconnected\n";
}

}  // namespace

int run_operator_command(const std::vector<std::string>& args) {
  const std::string command = args.front();
  CLI::App app{command == "jobs" ? "mcprun jobs: the jobs rendezvousd serves that you may see"
               : command == "status"
                   ? "mcprun status ID: one job's state, nodes and placement"
                   : "mcprun stop ID: stop a job on every node (its workers get SIGTERM)",
               "mcprun " + command};
  app.footer(fmt::format(
      "Waits at most {} s to connect and {} s for the answer; past either, one "
      "line and exit {}.",
      kConnectTimeout.count(), kOperatorRequestTimeout.count(), static_cast<int>(kExitRendezvous)));
  std::string endpoint = kDefaultDaemonEndpoint, token_file, job;
  bool json = false;
  app.add_option("--rdzv-endpoint", endpoint, "rendezvousd to ask: unix:PATH or HOST:PORT")
      ->capture_default_str();
  app.add_option("--rdzv-token-file", token_file, "The daemon's token, needed over TCP");
  if (command != "jobs") app.add_option("id", job, "The job's --rdzv-id")->required();
  if (command != "stop") app.add_flag("--json", json, "Print the daemon's answer as JSON");
  if (auto done = parse_subcommand(app, {args.begin() + 1, args.end()})) return *done;
  OperatorRequest request{command, "", job};
  if (!token_file.empty()) {
    auto token = read_token_file(token_file);
    if (!token) {
      return usage_error("--rdzv-token-file " + token_file + ": cannot read a token");
    }
    request.token = *token;
  }
  auto answer = ask_daemon(endpoint, encode(request));
  if (!answer) {
    std::fprintf(stderr, "mcprun: %s\n", answer.error().message.c_str());
    return kExitRendezvous;
  }
  const nlohmann::json& reply = *answer;
  // Each answer is parsed before anything is printed: a malformed one is one line, not a crash.
  auto malformed = [&](const std::string& reason) {
    std::fprintf(stderr, "mcprun: rendezvousd at %s sent a malformed %s\n", endpoint.c_str(),
                 reason.c_str());
    return kExitRendezvous;
  };
  auto decoded = decode_rendezvous_message(reply);
  if (!decoded) return malformed(decoded.error().message);
  const std::string answer_type = command == "stop" ? "stopped" : command;
  if (const std::string type = message_type(reply); type != answer_type && type != "error")
    return malformed("answer to '" + command + "': '" + type + "'");
  // --json prints the answer's body as the daemon sent it; otherwise a table.
  return std::visit(
      MessageHandlers{[&](const ErrorMessage& refused) {
                        std::fprintf(stderr, "mcprun: %s\n",
                                     refused.message.empty() ? "refused" : refused.message.c_str());
                        return kExitFailure;
                      },
                      [&](const JobsReply& jobs) {
                        if (json)
                          std::cout << reply["jobs"].dump(2) << "\n";
                        else
                          print_jobs(jobs.jobs);
                        return kExitSuccess;
                      },
                      [&](const JobStatus& status) {
                        if (json)
                          std::cout << reply["job"].dump(2) << "\n";
                        else
                          print_status(status);
                        return kExitSuccess;
                      },
                      [&](const StoppedReply& stopped) {
                        std::cout << "stopped job " << stopped.job << "\n";
                        return kExitSuccess;
                      },
                      [](const auto&) { return kExitRendezvous; }},  // Refused above.
      *decoded);
}

}  // namespace mcprun
