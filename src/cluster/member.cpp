// A framework process as its node of a cluster (member.hpp).
#include "nereus/cluster/member.hpp"

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "nereus/base/error.hpp"

namespace nereus::cluster {

namespace {

/// Hands the node's steps from the daemon's thread to the framework's, and back.
class Host final : public StepHost {
 public:
  void step(NodeStep s, std::function<void(StepDone)> done) override {
    {
      std::lock_guard lock(m_);
      asked_.push_back({std::move(s), std::move(done)});
    }
    cv_.notify_all();
  }
  void closed() override {
    {
      std::lock_guard lock(m_);
      asked_.clear();  // never answered: the coordinator is gone or finished
      for (auto& [stream, a] : answers_) a.done = [](StepDone) {};  // the steps in hand are void: reports go nowhere
      ended_ = true;
    }
    cv_.notify_all();
  }
  void stopped(std::string error) {
    {
      std::lock_guard lock(m_);
      stopped_ = true;
      error_ = std::move(error);
    }
    cv_.notify_all();
  }

  bool wait(std::chrono::milliseconds timeout) {
    std::unique_lock lock(m_);
    return cv_.wait_for(lock, timeout, [&] { return ready(); });
  }

  /// A sync job's step must be reported before the next; an async job's framework may hold
  /// one step of each stream (the coordinator never sends a stream's next step before its
  /// report).
  std::optional<NodeStep> next() {
    std::unique_lock lock(m_);
    if (const auto it = answers_.find(StepStream::whole); it != answers_.end())
      throw Error("step " + std::to_string(it->second.step) + " was not reported: report() it before asking for the next");
    if (answers_.size() >= 2) throw Error("a generation and a training step are unreported: report() one before asking for the next");
    cv_.wait(lock, [&] { return ready(); });
    if (!asked_.empty()) {
      Asked a = std::move(asked_.front());
      asked_.pop_front();
      answers_[a.step.stream] = {a.step.step, std::move(a.done)};
      return std::move(a.step);
    }
    if (ended_) {
      ended_ = false;
      return std::nullopt;
    }
    throw Error(error_.empty() ? std::string("the node has stopped") : "the node stopped: " + error_);
  }

  void report(std::optional<StepStream> stream, StepDone d) {
    std::function<void(StepDone)> answer;
    {
      std::lock_guard lock(m_);
      if (answers_.empty() && !stream) throw Error("no step to report: next_step() gave none, or it was reported already");
      auto it = answers_.begin();
      if (stream) {
        it = answers_.find(*stream);
        if (it == answers_.end())
          throw Error(std::string("no ") + to_string(*stream) + " step to report: next_step() gave none, or it was reported already");
      } else if (answers_.size() > 1) {
        throw Error("a generation and a training step are unreported: say which one this report answers");
      }
      answer = std::move(it->second.done);
      answers_.erase(it);
    }
    answer(std::move(d));  // posts to the daemon's loop
  }

  bool stopped() const {
    std::lock_guard lock(m_);
    return stopped_;
  }

 private:
  bool ready() const { return !asked_.empty() || ended_ || stopped_; }

  struct Asked {
    NodeStep step;
    std::function<void(StepDone)> done;
  };
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::deque<Asked> asked_;
  struct Answer {
    std::int64_t step = 0;
    std::function<void(StepDone)> done;
  };
  std::map<StepStream, Answer> answers_;  // the steps handed out and not yet reported, by stream
  bool ended_ = false, stopped_ = false;
  std::string error_;
};

}  // namespace

struct Member::State {
  asio::io_context io;
  std::shared_ptr<Host> host = std::make_shared<Host>();
  std::unique_ptr<Daemon> daemon;
  Endpoint listening;                  // read once bound, before the daemon's thread starts:
  std::optional<Endpoint> metrics;     // the framework's thread never touches the sockets
  std::thread thread;
};

Member::Member(DaemonOptions options) : s_(std::make_unique<State>()) {
  options.step_host = s_->host;
  s_->daemon = std::make_unique<Daemon>(s_->io, std::move(options));
  s_->daemon->bind();
  s_->listening = s_->daemon->listening();
  s_->metrics = s_->daemon->metrics_listening();
  State* s = s_.get();
  asio::co_spawn(s->io, s->daemon->run(), [s](std::exception_ptr e) {
    std::string error;
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        error = x.what();
      }
    }
    s->host->stopped(std::move(error));
    s->io.stop();  // a transfer left behind on a dead peer must not keep the thread alive
  });
  s_->thread = std::thread([s] { s->io.run(); });
}

Member::~Member() {
  // Rank 0 is the coordinator: the job whose end let the framework go is still being
  // reported to its client.
  Daemon* d = s_->daemon.get();
  asio::post(s_->io, [d] { d->stop_after(std::chrono::seconds(10)); });
  if (s_->thread.joinable()) s_->thread.join();
  if (s_->daemon->stuck()) (void)s_->daemon.release();  // a transfer that would not stop still uses it
}

Endpoint Member::listening() const { return s_->listening; }
std::optional<Endpoint> Member::metrics_listening() const { return s_->metrics; }
bool Member::wait(std::chrono::milliseconds timeout) { return s_->host->wait(timeout); }
std::optional<NodeStep> Member::next_step() { return s_->host->next(); }
void Member::report(StepDone measured) { s_->host->report(std::nullopt, std::move(measured)); }
void Member::report(StepStream stream, StepDone measured) { s_->host->report(stream, std::move(measured)); }
bool Member::running() const { return !s_->host->stopped(); }

void Member::stop() {
  Daemon* d = s_->daemon.get();
  asio::post(s_->io, [d] { d->stop(); });
}

}  // namespace nereus::cluster
