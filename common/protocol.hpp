// The agent <-> rendezvousd wire format: length-prefixed JSON frames with a hard size cap. Each
// message below is a struct of common/messages.hpp, encoded and parsed there.
//
// A frame is a 4-byte big-endian payload length followed by that many bytes of UTF-8 JSON. Every
// payload is an object {"v": kProtocolVersion, "type": "<message>", ...}. Messages:
//   join       agent->daemon  job, node, addr, nproc, labels{}, token, node_rank (-1: any),
//                             gpus[{local_rank, bus_id, numa_node, switch, uuid}] (logged),
//                             min_nodes, max_nodes, join_timeout_s, last_call_timeout_s,
//                             progress (false: the agent shows no progress, so is sent none)
//   rejoin     agent->daemon  the join's fields + assignment{group_rank, group_world_size,
//                             world_size, rank_offset, master_addr, master_port}: a running
//                             node re-registers after its connection broke (a daemon restart);
//                             a daemon that lost the job rebuilds it from these
//   joined     daemon->agent  heartbeat_interval_ms: the join was accepted; heartbeat this often
//                             (a third of the lease, longer where the agents the daemon holds
//                             would pass its max_heartbeats_per_second)
//   assignment daemon->agent  group_rank, group_world_size, world_size, rank_offset,
//                             master_addr, master_port (no node list: that would make a round
//                             of N agents cost N^2 bytes), heartbeat_interval_ms (the pace for
//                             the agents the daemon holds now, never shorter than the joined one)
//   pace       daemon->agent  heartbeat_interval_ms: heartbeat this often from now on (nodes of
//                             a running job that re-registered first, once all are back)
//   heartbeat  agent->daemon  (no fields): any message renews the agent's lease
//   done       agent->daemon  (no fields): this node's workers all succeeded
//   progress   daemon->agent  joined, min_nodes, max_nodes, names[<= 8], remaining_s: a forming
//                             round's state, at most once a second, to the agents that show it
//                             (on a terminal)
//   membership daemon->agent  node: a node joins a running elastic job; re-join for a new round
//   lost       daemon->agent  node: that node's agent vanished or went silent past its lease
//   failed     both ways      reason, exit_code [, node: set by the daemon when it relays]: a
//                             worker failed; every agent stops its group
//   noted      daemon->agent  (no fields): the failure was heard and relayed; the node decides
//   closed     daemon->agent  message: the job cannot restart (another node finished)
//   error      daemon->agent  message: the request was refused (bad token, timeout, ...)
//   stall      both ways      kind, what, noticed_on, [barrier, rank, arrived{addr: "ports"},
//                             arrived_left_out (hosts whose ports did not fit),
//                             collective{group, op, seq, backend, pending_s, in, missing,
//                             group_ranks: "0-4095,4097-16383", states[{ranks, state}],
//                             <list>_left_out, states_left_out}]: the job stalled
//                             (launcher/watch/stall_report.hpp); every agent diagnoses, dumps
//                             stacks and stops its group. A collective's lists are ranges and
//                             its states grouped, within 60 KiB at any job size (what does not
//                             fit is counted, not sent)
//   stall_report both ways    node, ranks[{rank, local_rank, host, pid, level, state, last_line,
//                             last_line_age_s, stack_file}]: one node's ranks, for every report
//   barrier    agent->daemon  name, rank: a rank reached helper barrier `name`
//   barrier_done daemon->agent name: every rank of the job reached it
//   clock      both ways      unix_time_ns (the daemon's reply only): the daemon's wall clock,
//                             for `mcprun doctor`'s skew check. Answered without a token (the
//                             time is no secret); before a join the daemon then closes the
//                             connection, after one it keeps it
//   lease      agent->daemon  gpus (a count), wait_s, job [, held_gpus, held_port: a running job
//                             re-registers after a daemon restart]: GPUs and a master port for
//                             a job on the daemon's host (unix socket only)
//   lease      daemon->agent  gpus[bus ids], port, heartbeat_interval_ms: granted, held for as
//                             long as this connection lasts
//   queued     daemon->agent  message: not granted yet; the request waits up to wait_s, behind
//                             every older request for GPUs (the message names who holds and
//                             who waits first)
//   straggler  both ways      line [, node]: the store host's straggler or slow-collective line,
//                             for every other node's console
//   jobs, status, stop  operator->daemon  token [, job]: `mcprun jobs|status|stop`
//   jobs, status, stopped  daemon->operator  jobs[{id, owner, state, nodes, ranks, age_s}],
//                             job{... generation, min_nodes, max_nodes, master, placement[],
//                             members[]}, job: the answers
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

namespace mcprun {

inline constexpr int kProtocolVersion = 1;

/// Where the systemd unit's rendezvousd listens for local users: operators and GPU leases.
inline constexpr const char* kDefaultDaemonEndpoint = "unix:/run/mcprun/rendezvousd.sock";
/// Largest payload accepted: far above any real message, small enough that a hostile peer cannot
/// make the daemon buffer much.
inline constexpr uint32_t kMaxFrameBytes = 64 * 1024;
inline constexpr size_t kFrameHeaderBytes = 4;
/// Deepest nesting of arrays and objects accepted: real messages nest 3 levels.
inline constexpr size_t kMaxNesting = 32;

/// The bytes of one frame for `message` (adds "v").
std::string encode_frame(nlohmann::json message);

/// What a read buffer holds so far.
struct FrameIncomplete {
  size_t bytes_needed = 0;  ///< At least this many more bytes before a frame can be complete.
};
struct FrameError {
  std::string message;  ///< One line for the log; the connection is closed.
};
struct Frame {
  nlohmann::json message;
  size_t consumed = 0;  ///< Bytes of the buffer this frame used.
};
using FrameResult = std::variant<Frame, FrameIncomplete, FrameError>;

/// Parses the first frame of `buffer`: rejects oversized lengths before buffering them, and
/// payloads that are not a JSON object with the right version and a string "type".
FrameResult decode_frame(std::string_view buffer);

/// Compares a presented token with the expected one in time independent of where they differ.
bool tokens_equal(std::string_view presented, std::string_view expected);

/// The token in the first line of `path`; nullopt when unreadable or empty.
std::optional<std::string> read_token_file(const std::string& path);

}  // namespace mcprun
