// `mcprun jobs`, `mcprun status ID` and `mcprun stop ID`: what the daemon tells an operator.
#include <fmt/format.h>
#include <pwd.h>

#include "common/exit_status.hpp"
#include "common/protocol.hpp"
#include "rendezvous/agent_session.hpp"
#include "rendezvous/rendezvous_server.hpp"

namespace mcprun {
namespace {

const char* state_of(bool running, bool finished) {
  return finished ? "finished" : running ? "running" : "joining";
}

}  // namespace

std::string RendezvousServer::user_name(uid_t uid) {
  passwd entry{}, *found = nullptr;
  char buffer[1024];
  if (::getpwuid_r(uid, &entry, buffer, sizeof buffer, &found) == 0 && found)
    return fmt::format("{} (uid {})", found->pw_name, uid);
  return fmt::format("uid {}", uid);
}

bool RendezvousServer::may_access(const AgentSession& session, const Job& job) {
  if (!session.uid || !job.owner) return true;  // Over TCP the token is the authentication.
  return *session.uid == 0 || *session.uid == *job.owner;
}

void RendezvousServer::handle_operator(const std::shared_ptr<AgentSession>& session,
                                       const OperatorRequest& request) {
  const std::string& type = request.type;
  if (!session->uid) {
    // Over TCP an operator is whoever holds the token; without one, nobody is.
    if (settings_.token.empty())
      return session->refuse("'" + type +
                             "' needs the daemon's unix socket, or a daemon with a token");
    if (!tokens_equal(request.token, settings_.token))
      return session->refuse("authentication failed: wrong or missing token");
  }
  const auto now = Clock::now();
  auto describe = [&](const std::string& id, const Job& job) {
    return JobSummary{id,
                      job.owner ? user_name(*job.owner) : "remote",
                      state_of(job.running, job.finished),
                      static_cast<int>(job.members.size()),
                      job.world_size,
                      std::chrono::duration<double>(now - job.created_at).count()};
  };
  if (type == "jobs") {
    JobsReply reply;
    for (const auto& [id, job] : jobs_)
      if (may_access(*session, job)) reply.jobs.push_back(describe(id, job));
    return session->reply_and_close(encode(reply));
  }

  const std::string& id = request.job;
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return session->refuse("no job '" + id + "'");
  Job& job = it->second;
  if (!may_access(*session, job))
    return session->refuse("job " + id + " belongs to " + user_name(*job.owner) +
                           "; only that user or root may see or stop it");
  if (type == "status") {
    JobStatus status;
    status.summary = describe(id, job);
    status.generation = static_cast<int>(job.generation);
    status.min_nodes = job.settings.min_nodes;
    status.max_nodes = job.settings.max_nodes;
    for (const auto& [name, member] : job.members)
      status.members.push_back({name, !member.expired(), job.done_nodes.contains(name)});
    if (job.running && job.round && job.round->state() == RendezvousRound::State::kComplete) {
      const RoundResult& result = job.round->result();
      status.master = fmt::format("{}:{}", result.master_addr, result.master_port);
      for (const NodeAssignment& node : result.nodes)
        status.placement.push_back(
            {node.node, node.addr,
             fmt::format("{}-{}", node.rank_offset, node.rank_offset + node.nproc - 1),
             node.group_rank});
    }
    return session->reply_and_close(encode(status));
  }
  // stop
  if (job.finished) return session->refuse("job " + id + " has already ended");
  const std::string who = session->uid ? user_name(*session->uid) : "an operator holding the token";
  const std::string reason = "stopped by " + who + " with mcprun stop";
  spdlog::warn("job {}: {}", id, reason);
  if (job.running)
    broadcast(job, encode(FailedNotice{"rendezvousd", reason, exit_code_for_signal(SIGTERM)}));
  else
    broadcast(job, encode(ErrorMessage{"job " + id + " was " + reason}));
  finish(id);
  session->reply_and_close(encode(StoppedReply{id}));
}

}  // namespace mcprun
