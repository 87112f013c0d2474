// store_load: thousands of simulated ranks in one process, one connection each, speaking torch
// 2.x's TCPStore wire protocol to a c10d store (mcprun's or torch's own). scripts/bench-scale
// drives it; tests/e2e/test_scale.py holds its bytes against torch's real client.
//
// Usage: store_load --port PORT [--host 127.0.0.1] [--timeout SECONDS] [--sources 64]
//
// Against a loopback server the ranks connect from --sources loopback addresses (127.0.0.1 up),
// as a job's ranks come from many hosts (see load_generator::open_from).
//
// Commands come one a line on stdin and run one at a time; each answers one JSON line on stdout
// ({"phase", "seconds" (null past the timeout), "ranks", "completed", "errors", "error_names",
// "lost"}):
//   connect N       N ranks connect at once, each sends VALIDATE and PING and waits for the answer
//                   (torch's client does the same). A refused or reset connect is an error; none
//                   is retried.
//   barrier PREFIX  each rank ADDs 1 to PREFIX/count; the one that brings it to N SETs
//                   PREFIX/last; every rank WAITs on PREFIX/last.
//   init            each rank SETs init/<rank> (64 bytes), then gets the keys it needs, rank 0's
//                   and its two ring neighbours', as torch's get does: a WAIT, then a GET.
//   progress S      each rank SETs mcprun/progress/<rank> once a second for S seconds, spread over
//                   each second (a record as mcprun's progress reporter writes it), then PINGs.
// The end of stdin closes every connection and ends the program.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "load_generator.hpp"
#include "torch_requests.hpp"

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace store_load {
namespace {

/// The value each rank sets in the init pattern: NCCL's unique id is 128 bytes, gloo's addresses
/// fewer; 64 is what scripts/store_load.py sets too.
const std::string kInitValue(64, 'v');
/// How often the progress phase looks for records that have come due.
constexpr auto kProgressTick = std::chrono::milliseconds(2);

/// One simulated rank: its connection, the bytes being written and those queued behind them.
struct Rank {
  explicit Rank(asio::io_context& io) : socket(io) {}
  tcp::socket socket;
  std::string writing, queued;
  std::string reply;
  bool lost = false;  ///< Closed after an error or a phase's timeout; never used again.
  bool busy = false;  ///< Still owes the current phase its end.
};

/// A progress record as worker_helper/mcprun/_progress.py writes it for a healthy loop.
std::string progress_record(size_t rank, uint64_t number) {
  std::ostringstream out;
  out << R"({"v":1,"rank":)" << rank << R"(,"pid":)" << 100000 + rank << R"(,"n":)" << number
      << R"(,"source":"flight_recorder","completed":)" << number
      << R"(,"pending":[],"cpu_s":1.0,"frames":["train.py:41 in main"]})";
  return out.str();
}

/// The ranks and the one phase they run at a time.
class LoadGenerator {
 public:
  using Report = std::function<void(const nlohmann::json&)>;

  LoadGenerator(asio::io_context& io, tcp::endpoint server, size_t sources,
                std::chrono::milliseconds timeout)
      : io_(io), server_(server), sources_(sources), timeout_(timeout), deadline_(io), tick_(io) {}

  /// Runs one command line; `report` hears its answer once it ends.
  void run(const std::string& line, Report report) {
    std::istringstream words(line);
    std::string command, argument;
    words >> command >> argument;
    if (command == "connect") {
      begin("connect", std::move(report), {});
      connect(std::stoul(argument));
    } else if (command == "barrier") {
      begin("barrier", std::move(report), live());
      barrier(argument);
    } else if (command == "init") {
      begin("init", std::move(report), live());
      init();
    } else if (command == "progress") {
      begin("progress", std::move(report), live());
      progress(std::stoul(argument));
    } else {
      report({{"error", "unknown command: " + line}});
    }
  }

  void close_all() {
    for (auto& rank : ranks_) close(*rank);
  }

 private:
  std::vector<size_t> live() const {
    std::vector<size_t> indices;
    for (size_t i = 0; i < ranks_.size(); ++i)
      if (!ranks_[i]->lost) indices.push_back(i);
    return indices;
  }

  void begin(std::string name, Report report, std::vector<size_t> members) {
    phase_ = name;
    report_ = std::move(report);
    members_ = std::move(members);
    outstanding_ = members_.size();
    errors_ = 0;
    error_names_.clear();
    for (size_t i : members_) ranks_[i]->busy = true;
    start_ = Clock::now();
    deadline_.expires_after(timeout_);
    deadline_.async_wait([this](boost::system::error_code ec) {
      if (!ec) end(false);
    });
  }

  /// One rank is through the phase (or failed in it).
  void done(Rank& rank) {
    if (!rank.busy) return;
    rank.busy = false;
    if (--outstanding_ == 0) end(true);
  }

  void fail(Rank& rank, const boost::system::error_code& ec) {
    if (rank.lost) return;  // Its socket was closed here: the abort is ours, not the server's.
    ++errors_;
    error_names_.insert(ec.message());
    close(rank);
    done(rank);
  }

  void close(Rank& rank) {
    rank.lost = true;
    boost::system::error_code ignored;
    rank.socket.close(ignored);
  }

  /// Reports the phase; past the deadline, the ranks still in it are closed, so that nothing of
  /// it runs into the next phase.
  void end(bool in_time) {
    if (!report_) return;
    deadline_.cancel();
    tick_.cancel();
    double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    size_t busy = 0;
    for (auto& rank : ranks_) {
      if (!rank->busy) continue;
      ++busy;
      rank->busy = false;
      close(*rank);
    }
    size_t lost =
        std::count_if(ranks_.begin(), ranks_.end(), [](auto& rank) { return rank->lost; });
    nlohmann::json answer{
        {"phase", phase_},
        {"seconds", in_time ? nlohmann::json(seconds) : nlohmann::json(nullptr)},
        {"ranks", phase_ == "connect" ? ranks_.size() : members_.size()},
        {"completed", (phase_ == "connect" ? ranks_.size() : members_.size()) - errors_ - busy},
        {"errors", errors_},
        {"error_names", error_names_},
        {"lost", lost}};
    auto report = std::move(report_);
    report_ = nullptr;
    report(answer);
  }

  void send(Rank& rank, std::string bytes) {
    if (rank.lost) return;
    if (!rank.writing.empty()) {
      rank.queued += bytes;
      return;
    }
    rank.writing = std::move(bytes);
    asio::async_write(rank.socket, asio::buffer(rank.writing),
                      [this, &rank](boost::system::error_code ec, size_t) {
                        if (ec) return fail(rank, ec);
                        rank.writing.clear();
                        if (!rank.queued.empty()) send(rank, std::exchange(rank.queued, {}));
                      });
  }

  /// Reads `size` bytes of reply, then calls `then` with them.
  void read(Rank& rank, size_t size, std::function<void(std::string_view)> then) {
    if (rank.lost) return;
    rank.reply.resize(size);
    asio::async_read(rank.socket, asio::buffer(rank.reply),
                     [this, &rank, then = std::move(then)](boost::system::error_code ec, size_t) {
                       if (ec) return fail(rank, ec);
                       then(rank.reply);
                     });
  }

  template <class T>
  static T decode(std::string_view bytes) {
    T value;
    std::memcpy(&value, bytes.data(), sizeof(T));
    return value;
  }

  void connect(size_t count) {
    if (count == 0) return end(true);
    uint32_t nonce = static_cast<uint32_t>(::getpid());  // torch's client PINGs with its pid.
    outstanding_ += count;  // All at once: a rank that fails here must not end the phase early.
    for (size_t n = 0; n < count; ++n) {
      ranks_.push_back(std::make_unique<Rank>(io_));
      Rank& rank = *ranks_.back();
      rank.busy = true;
      if (auto ec = load_generator::open_from(rank.socket, server_, sources_, n)) {
        fail(rank, ec);
        continue;
      }
      rank.socket.async_connect(server_, [this, &rank, nonce](boost::system::error_code ec) {
        if (ec) return fail(rank, ec);
        rank.socket.set_option(tcp::no_delay(true), ec);  // As torch's client and asyncio do.
        send(rank, validate() + ping(nonce));
        read(rank, sizeof nonce, [this, &rank, nonce](std::string_view reply) {
          if (decode<uint32_t>(reply) != nonce)
            return fail(rank, make_error_code(boost::system::errc::protocol_error));
          done(rank);
        });
      });
    }
  }

  void barrier(const std::string& prefix) {
    if (members_.empty()) return end(true);
    int64_t size = static_cast<int64_t>(members_.size());
    std::string last = prefix + "/last";
    for (size_t i : members_) {
      Rank& rank = *ranks_[i];
      send(rank, add(prefix + "/count", 1));
      read(rank, sizeof(int64_t), [this, &rank, size, last](std::string_view reply) {
        std::string next = decode<int64_t>(reply) == size ? set(last, "1") : std::string();
        send(rank, next + wait({last}));
        read(rank, 1, [this, &rank](std::string_view answer) {
          if (static_cast<uint8_t>(answer[0]) != kStopWaiting)
            return fail(rank, make_error_code(boost::system::errc::protocol_error));
          done(rank);
        });
      });
    }
  }

  void init() {
    size_t size = members_.size();
    if (size == 0) return end(true);
    for (size_t index = 0; index < size; ++index) {
      Rank& rank = *ranks_[members_[index]];
      send(rank, set("init/" + std::to_string(index), kInitValue));
      std::set<size_t> needed{0, (index + 1) % size, (index + size - 1) % size};
      auto keys = std::make_shared<std::vector<std::string>>();
      for (size_t each : needed) keys->push_back("init/" + std::to_string(each));
      get_each(rank, keys, 0);
    }
  }

  /// torch's get: a WAIT for the key, then a GET, one key after the other.
  void get_each(Rank& rank, std::shared_ptr<std::vector<std::string>> keys, size_t next) {
    if (next == keys->size()) return done(rank);
    const std::string& key = (*keys)[next];
    send(rank, wait({key}));
    read(rank, 1, [this, &rank, keys, next, key](std::string_view answer) {
      if (static_cast<uint8_t>(answer[0]) != kStopWaiting)
        return fail(rank, make_error_code(boost::system::errc::protocol_error));
      send(rank, get(key));
      read(rank, sizeof(uint64_t), [this, &rank, keys, next](std::string_view length) {
        read(rank, decode<uint64_t>(length), [this, &rank, keys, next](std::string_view value) {
          if (value != kInitValue)
            return fail(rank, make_error_code(boost::system::errc::protocol_error));
          get_each(rank, keys, next + 1);
        });
      });
    });
  }

  void progress(size_t seconds) {
    if (members_.empty()) return end(true);
    progress_sent_ = 0;
    progress_total_ = seconds * members_.size();
    progress_tick();
  }

  /// Sends every record that has come due: rank i's record of second s at start + s + i/N.
  void progress_tick() {
    size_t size = members_.size();
    double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    size_t due = std::min(progress_total_, static_cast<size_t>(elapsed * size) + 1);
    for (; progress_sent_ < due; ++progress_sent_) {
      size_t index = progress_sent_ % size, second = progress_sent_ / size;
      send(*ranks_[members_[index]],
           set("mcprun/progress/" + std::to_string(index), progress_record(index, second + 1)));
    }
    if (progress_sent_ < progress_total_) {
      tick_.expires_after(kProgressTick);
      tick_.async_wait([this](boost::system::error_code ec) {
        if (!ec) progress_tick();
      });
      return;
    }
    // One round trip per rank: every record sent has been acted on.
    for (size_t i : members_) {
      Rank& rank = *ranks_[i];
      send(rank, ping(7));
      read(rank, sizeof(uint32_t), [this, &rank](std::string_view) { done(rank); });
    }
  }

  asio::io_context& io_;
  tcp::endpoint server_;
  size_t sources_;  ///< Loopback source addresses the ranks connect from (127.0.0.1 up).
  std::chrono::milliseconds timeout_;
  asio::steady_timer deadline_, tick_;
  std::vector<std::unique_ptr<Rank>> ranks_;  // unique_ptr: handlers hold references to them.

  std::string phase_;
  Report report_;
  std::vector<size_t> members_;  ///< The ranks in the phase (connect's: every one it opens).
  size_t outstanding_ = 0, errors_ = 0;
  std::set<std::string> error_names_;
  Clock::time_point start_;
  size_t progress_sent_ = 0, progress_total_ = 0;
};

}  // namespace
}  // namespace store_load

int main(int argc, char** argv) {
  return load_generator::main<store_load::LoadGenerator>(argc, argv, "store_load");
}
