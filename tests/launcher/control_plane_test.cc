// ControlServer, ControlClient and EntryCheck over real sockets on 127.0.0.1: every message
// kind round-trips, replies reach only the client they name, stale epochs are dropped, and a
// client that comes early, a peer that vanished, one that is SIGKILLed, garbage on the wire
// and an unanswered request never stall the other end.
#include "launcher/control_plane.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "parallel/socket_util.h"
#include "runtime/check.h"
#include "test_expect.h"

namespace keel {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using control::Envelope;

const std::string kHost = "127.0.0.1";

// poll() may return early (a malformed message, a signal): wait for a real one up to `limit`.
std::optional<ControlServer::Incoming> next(ControlServer& server,
                                            std::chrono::milliseconds limit = 5s) {
  auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (auto in = server.poll(50ms)) return in;
  }
  return std::nullopt;
}

std::optional<Envelope> next(ControlClient& client, std::chrono::milliseconds limit = 5s) {
  auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (auto msg = client.poll(50ms)) return msg;
  }
  return std::nullopt;
}

Envelope heartbeat(int epoch, int slot) {
  Envelope msg = make_envelope(epoch);
  msg.mutable_heartbeat()->set_slot(slot);
  msg.mutable_heartbeat()->add_ranks_alive(2 * slot);
  return msg;
}

// One message of every kind a client sends, with a field set in each to check it arrived.
std::vector<Envelope> client_messages(int epoch) {
  std::vector<Envelope> out;
  Envelope m = make_envelope(epoch);
  auto* reg = m.mutable_registration();
  reg->set_slot(3);
  reg->set_host("10.0.0.3");
  reg->set_pid(1234);
  reg->set_workers(2);
  reg->set_standby(true);
  out.push_back(m);
  out.push_back(heartbeat(epoch, 3));
  m = make_envelope(epoch);
  auto* p = m.mutable_progress();
  p->set_rank(5);
  p->set_step(17);
  p->set_loss(3.25);
  p->set_in_collective(true);
  p->set_in_collective_since(1.5);
  out.push_back(m);
  m = make_envelope(epoch);
  auto* ev = m.mutable_event();
  ev->set_kind(control::Event::worker_exit);
  ev->set_rank(5);
  ev->set_signal(SIGKILL);
  ev->set_last_lines("step 17\nkilled\n");
  out.push_back(m);
  m = make_envelope(epoch);
  m.mutable_status_request();
  out.push_back(m);
  m = make_envelope(epoch);
  m.mutable_inject_request()->set_fault("crash@step=3,rank=1");
  out.push_back(m);
  m = make_envelope(epoch);
  m.mutable_ack()->set_message("done");
  out.push_back(m);
  return out;
}

// One message of every kind the server sends.
std::vector<Envelope> server_messages(int epoch) {
  std::vector<Envelope> out;
  for (auto kind :
       {control::Command::welcome, control::Command::spawn, control::Command::kill,
        control::Command::survey, control::Command::shutdown, control::Command::reset}) {
    Envelope m = make_envelope(epoch);
    auto* c = m.mutable_command();
    c->set_kind(kind);
    c->set_rank(7);
    if (kind == control::Command::spawn) {
      c->set_world(8);
      c->add_args("--steps=30");
      (*c->mutable_env())["KEEL_IFNAME"] = "veth0";
    }
    out.push_back(m);
  }
  Envelope m = make_envelope(epoch);
  auto* s = m.mutable_status_reply();
  s->set_epoch(epoch);
  s->set_step(12);
  s->set_ettr(0.9);
  s->set_state("training");
  auto* slot = s->add_slots();
  slot->set_slot(1);
  slot->set_state("lost");
  slot->add_ranks(2);
  auto* rank = s->add_ranks();
  rank->set_rank(2);
  rank->set_in_collective(true);
  out.push_back(m);
  m = make_envelope(epoch);
  m.mutable_inject_reply()->set_ok(false);
  m.mutable_inject_reply()->set_message("slot 0 hosts the controller");
  out.push_back(m);
  m = make_envelope(epoch);
  m.mutable_ack()->set_message("ok");
  out.push_back(m);
  return out;
}

bool same(const Envelope& a, const Envelope& b) {
  return a.SerializeAsString() == b.SerializeAsString();
}

TEST(ControlPlane, MakeEnvelopeStampsEpochAndTime) {
  double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  Envelope m = make_envelope(4);
  EXPECT_EQ(m.epoch(), 4);
  EXPECT_NEAR(m.sent_at(), now, 5.0);
  EXPECT_EQ(m.body_case(), Envelope::BODY_NOT_SET);
}

TEST(ControlPlane, EveryKindBetweenServerAndThreeClients) {
  ControlServer server(kHost, 0);
  EXPECT_GT(server.port(), 0);
  EXPECT_EQ(server.endpoint(), "tcp://127.0.0.1:" + std::to_string(server.port()));
  std::vector<std::string> ids = {"agent/3", "worker/12", "ctl/99"};
  std::vector<std::unique_ptr<ControlClient>> clients;
  for (const auto& id : ids)
    clients.push_back(std::make_unique<ControlClient>(server.endpoint(), id));

  auto sent = client_messages(2);
  for (auto& c : clients) {
    for (const auto& m : sent) ASSERT_TRUE(c->send(m));
  }
  // Per client, messages arrive in the order sent; clients interleave.
  std::map<std::string, size_t> got;
  for (size_t i = 0; i < sent.size() * clients.size(); ++i) {
    auto in = next(server);
    ASSERT_TRUE(in) << "message " << i << " did not arrive";
    size_t& k = got[in->identity];
    ASSERT_LT(k, sent.size()) << in->identity;
    EXPECT_TRUE(same(in->msg, sent[k]))
        << in->identity << " #" << k << ": " << in->msg.ShortDebugString();
    ++k;
  }
  for (const auto& id : ids) EXPECT_EQ(got[id], sent.size()) << id;

  // Replies go to the identity named, and only there.
  auto replies = server_messages(2);
  for (const auto& m : replies) ASSERT_TRUE(server.send("worker/12", m));
  for (const auto& m : replies) {
    auto msg = next(*clients[1]);
    ASSERT_TRUE(msg);
    EXPECT_TRUE(same(*msg, m)) << msg->ShortDebugString();
  }
  EXPECT_FALSE(clients[1]->poll(50ms).has_value());
  EXPECT_FALSE(clients[0]->poll(50ms).has_value());
  EXPECT_FALSE(clients[2]->poll(0ms).has_value());
  EXPECT_EQ(server.malformed(), 0);
}

TEST(ControlPlane, EntryCheckDropsOlderTermsAndEpochsAndCountsThem) {
  EntryCheck check;
  using Drop = EntryCheck::Drop;
  // Term 7, epoch 3 known to the receiver.
  Envelope cmd = make_envelope(3, 7);
  cmd.mutable_command()->set_kind(control::Command::kill);
  EXPECT_EQ(check.check(cmd, 7, 3), Drop::kNone);
  cmd.set_term(8);  // a newer leader than the receiver knows: etcd told the sender first
  EXPECT_EQ(check.check(cmd, 7, 3), Drop::kNone);
  cmd.set_term(6);  // a deposed leader's
  EXPECT_EQ(check.check(cmd, 7, 3), Drop::kOlderTerm);
  cmd.set_term(7);
  cmd.set_epoch(2);  // an older epoch's command
  EXPECT_EQ(check.check(cmd, 7, 3), Drop::kOlderEpoch);
  cmd.set_epoch(4);  // the receiver is behind
  EXPECT_EQ(check.check(cmd, 7, 3), Drop::kNone);
  // A heartbeat carries facts of no epoch: only its term is checked.
  EXPECT_EQ(check.check(heartbeat(0, 1), 0, 3), Drop::kNone);
  Envelope hb = heartbeat(0, 1);
  hb.set_term(5);
  EXPECT_EQ(check.check(hb, 7, 3), Drop::kOlderTerm);
  // From a sender the receiver does not know (no registration yet).
  EXPECT_EQ(check.check(heartbeat(3, 1), 0, 3, /*known=*/false), Drop::kUnknownSender);
  EXPECT_EQ(check.dropped(Drop::kOlderTerm), 2);
  EXPECT_EQ(check.dropped(Drop::kOlderEpoch), 1);
  EXPECT_EQ(check.dropped(Drop::kUnknownSender), 1);
  EXPECT_EQ(check.dropped(), 4);

  // Valid at any term and epoch, known or not: a (re)starting agent's register, keel-ctl's
  // requests.
  Envelope reg = make_envelope(0);
  reg.mutable_registration()->set_slot(1);
  EXPECT_EQ(check.check(reg, 9, 7, false), Drop::kNone);
  Envelope status = make_envelope(0);
  status.mutable_status_request();
  EXPECT_EQ(check.check(status, 9, 7, false), Drop::kNone);
  Envelope inject = make_envelope(0);
  inject.mutable_inject_request()->set_fault("crash@step=1,rank=0");
  EXPECT_EQ(check.check(inject, 9, 7), Drop::kNone);
  EXPECT_EQ(check.dropped(), 4);

  EXPECT_EQ(check.check(make_envelope(9, 9), 7, 7), Drop::kNoBody);
  EXPECT_EQ(check.dropped(), 5);
  EXPECT_STREQ(drop_name(Drop::kOlderTerm), "older term");
}

TEST(ControlPlane, ADeposedLeadersCommandOverTheWireIsDropped) {
  ControlServer server(kHost, 0);
  ControlClient agent(server.endpoint(), "agent/1");
  // The agent registers; two leaders answer it: the deposed one (term 4) and the one etcd
  // confirmed to the agent (term 9).
  ASSERT_TRUE(agent.send(heartbeat(0, 1)));
  auto in = next(server);
  ASSERT_TRUE(in);
  EntryCheck check;
  for (int64_t term : {4, 9}) {
    Envelope cmd = make_envelope(2, term);
    cmd.mutable_command()->set_kind(control::Command::kill);
    ASSERT_TRUE(server.send(in->identity, cmd));
  }
  auto first = agent.poll(5s);
  ASSERT_TRUE(first);
  EXPECT_FALSE(check.admit(*first, 9, 2));
  auto second = agent.poll(5s);
  ASSERT_TRUE(second);
  EXPECT_TRUE(check.admit(*second, 9, 2));
  EXPECT_EQ(check.dropped(EntryCheck::Drop::kOlderTerm), 1);
}

// Listens on `port` as a plain TCP socket, not a control server, until `n` connection
// attempts came (each is accepted and closed at once, so no ZeroMQ handshake ever completes):
// proof that a client is trying to reach the port. Returns the attempts seen by the deadline.
int connect_attempts(int port, int n, std::chrono::milliseconds deadline = 30s) {
  detail::Fd l = detail::listen_tcp(kHost, port, 8);
  const auto end = Clock::now() + deadline;
  int seen = 0;
  while (seen < n && Clock::now() < end) {
    pollfd p{l.get(), POLLIN, 0};
    if (::poll(&p, 1, 100) != 1) continue;
    int fd = ::accept(l.get(), nullptr, nullptr);
    if (fd >= 0) ::close(fd), ++seen;
  }
  return seen;
}

TEST(ControlPlane, ClientThatConnectsBeforeTheServerBindsGetsThrough) {
  int port;
  {
    ControlServer probe(kHost, 0);  // a port nobody listens on once probe is gone
    port = probe.port();
  }
  ControlClient agent("tcp://127.0.0.1:" + std::to_string(port), "agent/2");
  ASSERT_TRUE(agent.send(heartbeat(0, 2)));  // queued while nobody listens
  // A few failed attempts (connections that never become a control session), then the
  // server binds.
  ASSERT_EQ(connect_attempts(port, 2), 2) << "the client never tried to connect";
  ControlServer server(kHost, port);
  auto in = next(server, 3s);
  ASSERT_TRUE(in);
  EXPECT_EQ(in->identity, "agent/2");
  EXPECT_EQ(in->msg.heartbeat().slot(), 2);
  ASSERT_TRUE(server.send("agent/2", server_messages(0)[0]));
  auto welcome = next(agent);
  ASSERT_TRUE(welcome);
  EXPECT_EQ(welcome->command().kind(), control::Command::welcome);
}

TEST(ControlPlane, ClientReconnectsToARestartedServerByItself) {
  auto server = std::make_unique<ControlServer>(kHost, 0);
  int port = server->port();
  ControlClient agent(server->endpoint(), "agent/9");
  ASSERT_TRUE(agent.send(heartbeat(0, 9)));
  ASSERT_TRUE(next(*server));
  server.reset();  // the controller's end goes away (a cut link looks the same to ZeroMQ)
  // The client noticed and tries to reconnect by itself; then the server comes back.
  ASSERT_GE(connect_attempts(port, 1), 1) << "the client never tried to reconnect";
  server = std::make_unique<ControlServer>(kHost, port);
  // Messages written into the dead connection are lost; the ones after the reconnect arrive.
  auto deadline = Clock::now() + 5s;
  std::optional<ControlServer::Incoming> in;
  while (!in && Clock::now() < deadline) {
    ASSERT_TRUE(agent.send(heartbeat(0, 9)));
    in = server->poll(100ms);
  }
  ASSERT_TRUE(in);
  EXPECT_EQ(in->identity, "agent/9");
  ASSERT_TRUE(server->send("agent/9", server_messages(1)[0]));
  EXPECT_TRUE(next(agent));
}

TEST(ControlPlane, SendToAVanishedOrUnknownPeerDoesNotBlock) {
  ControlServer server(kHost, 0);
  {
    ControlClient gone(server.endpoint(), "agent/4");
    ASSERT_TRUE(gone.send(heartbeat(0, 4)));
    ASSERT_TRUE(next(server));
  }
  // A send that blocked would never return: only sends that do not block end before the
  // deadline.
  Envelope big = make_envelope(0);
  big.mutable_event()->set_last_lines(std::string(4096, 'x'));
  test::expect_returns(
      [&] {
        for (int i = 0; i < 20000; ++i) {
          server.send("agent/4", big);
          server.send("agent/never", big);
        }
      },
      "sends to a vanished and an unknown peer");

  // A client whose server never comes: sends fill the bounded queue, then report false.
  ControlClient lonely("tcp://127.0.0.1:1", "agent/5");
  int queued = 0;
  test::expect_returns(
      [&] {
        for (int i = 0; i < 20000; ++i) queued += lonely.send(big) ? 1 : 0;
      },
      "sends of a client without a server");
  EXPECT_LT(queued, 20000);
}

TEST(ControlPlane, RestartedClientTakesOverItsIdentity) {
  ControlServer server(kHost, 0);
  ControlClient old_agent(server.endpoint(), "agent/6");
  ASSERT_TRUE(old_agent.send(heartbeat(0, 6)));
  ASSERT_TRUE(next(server));
  // The old connection is still open (a partitioned agent not yet known dead) when the
  // restarted one registers under the same identity.
  ControlClient new_agent(server.endpoint(), "agent/6");
  Envelope reg = make_envelope(0);
  reg.mutable_registration()->set_slot(6);
  ASSERT_TRUE(new_agent.send(reg));
  auto in = next(server);
  ASSERT_TRUE(in);
  EXPECT_EQ(in->identity, "agent/6");
  ASSERT_TRUE(in->msg.has_registration());
  ASSERT_TRUE(server.send("agent/6", server_messages(3)[0]));
  auto welcome = next(new_agent);
  ASSERT_TRUE(welcome);
  EXPECT_EQ(welcome->epoch(), 3);
}

TEST(ControlPlane, SigkilledClientProcessLeavesServerServingOthers) {
  // Fork before any ZeroMQ context exists in this process: the child builds its own.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(fds[1]);
    char buf[128] = {};
    ssize_t n = read(fds[0], buf, sizeof(buf) - 1);
    if (n <= 0) _exit(2);
    ControlClient worker(std::string(buf, static_cast<size_t>(n)), "worker/7");
    for (int i = 0; i < 3000; ++i) {  // 30 s at most, should the parent fail to kill it
      Envelope m = make_envelope(0);
      m.mutable_progress()->set_rank(7);
      m.mutable_progress()->set_pid(getpid());
      worker.send(m);
      usleep(10000);
    }
    _exit(0);
  }
  close(fds[0]);
  ControlServer server(kHost, 0);
  ASSERT_EQ(write(fds[1], server.endpoint().data(), server.endpoint().size()),
            static_cast<ssize_t>(server.endpoint().size()));
  close(fds[1]);
  auto in = next(server);
  ASSERT_TRUE(in);
  EXPECT_EQ(in->identity, "worker/7");
  EXPECT_EQ(in->msg.progress().pid(), child);

  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status));

  ControlClient agent(server.endpoint(), "agent/0");
  ASSERT_TRUE(agent.send(heartbeat(0, 0)));
  auto deadline = Clock::now() + 5s;
  bool heard = false;
  while (!heard && Clock::now() < deadline) {
    auto msg = server.poll(50ms);
    heard = msg && msg->identity == "agent/0";  // skip the dead worker's last messages
  }
  ASSERT_TRUE(heard);
  // Its kernel closed its connection: the server names it once, and not the live agent.
  std::vector<std::string> closed;
  ASSERT_TRUE(test::eventually([&] {
    while (server.poll(0ms)) {
    }
    for (const std::string& id : server.take_closed()) closed.push_back(id);
    return !closed.empty();
  })) << "the killed client's connection was never seen closed";
  EXPECT_EQ(closed, std::vector<std::string>{"worker/7"});
  for (int i = 0; i < 1000; ++i) server.send("worker/7", heartbeat(0, 0));
  ASSERT_TRUE(server.send("agent/0", server_messages(0)[0]));
  EXPECT_TRUE(next(agent));
}

// A raw DEALER with the job's CURVE keys: what a broken peer of the job could send.
void curve_client(zmq::socket_t& s, const JobKey& key, const JobKey& server_key) {
  const CurveKeyPair mine = control_curve_keys(key, false);
  s.set(zmq::sockopt::curve_serverkey, zmq::buffer(control_curve_keys(server_key, true).pub));
  s.set(zmq::sockopt::curve_publickey, zmq::buffer(mine.pub));
  s.set(zmq::sockopt::curve_secretkey, zmq::buffer(mine.sec));
}

// Without the job's keys nothing gets through: a plain ZeroMQ client, a CURVE client with a
// key pair of its own (it knows the server's public key), a keel client of another job, and
// bytes that are no ZMTP at all. Each is refused before any message is read, and reported.
TEST(ControlPlane, PeersWithoutTheJobsKeysAreRefusedAndReported) {
  ControlServer server(kHost, 0);
  // Every refusal reported until `want` are in, one report a second at most.
  auto reports_until = [&](int64_t want) {
    std::vector<Refusal> got;
    int64_t total = 0;
    EXPECT_TRUE(test::eventually(
        [&] {
          for (const Refusal& r : server.take_refused()) {
            got.push_back(r);
            total += 1 + r.more;
            EXPECT_NE(r.peer.find("127.0.0.1"), std::string::npos) << r.peer;
          }
          return total >= want;
        },
        5s))
        << total << " refusals";
    return got;
  };
  const std::string good = heartbeat(0, 5).SerializeAsString();
  zmq::context_t ctx;
  // A CURVE client with a key pair of its own (it knows the server's public key): the ZAP
  // handler refuses its key.
  zmq::socket_t own(ctx, zmq::socket_type::dealer);
  own.set(zmq::sockopt::linger, 0);
  std::array<char, 41> pub{}, sec{};
  ASSERT_EQ(zmq_curve_keypair(pub.data(), sec.data()), 0);
  own.set(zmq::sockopt::curve_serverkey,
          zmq::buffer(control_curve_keys(process_job_key(), true).pub));
  own.set(zmq::sockopt::curve_publickey, std::string(pub.data(), 40));
  own.set(zmq::sockopt::curve_secretkey, std::string(sec.data(), 40));
  own.connect(server.endpoint());
  own.send(zmq::buffer(good), zmq::send_flags::dontwait);
  const std::vector<Refusal> first = reports_until(1);
  ASSERT_FALSE(first.empty());
  EXPECT_NE(first[0].why.find("CURVE key that is not this job's"), std::string::npos)
      << first[0].why;
  own.close();
  // A plain ZeroMQ client, a keel client of another job (its server key is not this server's)
  // and bytes that are no ZMTP fail the handshake before the ZAP handler; reported once a
  // second, folded into a count (each client retries every 100 ms).
  zmq::socket_t plain(ctx, zmq::socket_type::dealer);
  plain.set(zmq::sockopt::linger, 0);
  plain.connect(server.endpoint());
  plain.send(zmq::buffer(good), zmq::send_flags::dontwait);
  ControlClient stranger(server.endpoint(), "agent/66", JobKey::generate());
  stranger.send(heartbeat(0, 6));
  {
    detail::Fd raw = detail::connect_tcp(kHost, server.port(), Clock::now() + 5s, "server");
    std::string err;
    const std::string junk = std::string(4, '\xff') + std::string(3, '\0') + "@ garbage";
    detail::send_all(raw.get(), junk.data(), junk.size(), Clock::now() + 1s, &err);
  }
  const std::vector<Refusal> flood = reports_until(10);
  EXPECT_LE(flood.size(), 6u) << "more than one report a second";
  EXPECT_FALSE(server.poll(300ms)) << "a message got through without the job's keys";
  // The job's own client is served all along.
  ControlClient mine(server.endpoint(), "agent/1");
  ASSERT_TRUE(mine.send(heartbeat(0, 1)));
  auto in = next(server);
  ASSERT_TRUE(in);
  EXPECT_EQ(in->identity, "agent/1");
}

TEST(ControlPlane, MalformedFramesAreCountedAndDropped) {
  ControlServer server(kHost, 0);
  zmq::context_t ctx;
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  curve_client(raw, process_job_key(), process_job_key());
  raw.set(zmq::sockopt::linger, 0);
  raw.set(zmq::sockopt::routing_id, "raw/1");
  raw.connect(server.endpoint());
  std::string garbage = "\xff\xff\xff not a protobuf";
  raw.send(zmq::buffer(garbage), zmq::send_flags::none);
  raw.send(zmq::buffer(std::string("a")), zmq::send_flags::sndmore);  // too many frames
  raw.send(zmq::buffer(std::string("b")), zmq::send_flags::sndmore);
  raw.send(zmq::buffer(std::string("c")), zmq::send_flags::none);
  raw.send(zmq::buffer(make_envelope(0).SerializeAsString()), zmq::send_flags::none);  // no body
  std::string good = heartbeat(1, 1).SerializeAsString();
  raw.send(zmq::buffer(good), zmq::send_flags::none);
  auto in = next(server);
  ASSERT_TRUE(in);
  EXPECT_EQ(in->identity, "raw/1");
  EXPECT_EQ(in->msg.heartbeat().slot(), 1);
  EXPECT_EQ(server.malformed(), 3);

  // The same on the client side.
  ControlClient client(server.endpoint(), "agent/8");
  ASSERT_TRUE(client.send(heartbeat(0, 8)));
  ASSERT_TRUE(next(server));
  // A body-less Envelope is the one malformed message ControlServer::send can produce.
  ASSERT_TRUE(server.send("agent/8", make_envelope(0)));
  ASSERT_TRUE(server.send("agent/8", heartbeat(0, 0)));
  auto msg = next(client);
  ASSERT_TRUE(msg);
  EXPECT_TRUE(msg->has_heartbeat());
  EXPECT_EQ(client.malformed(), 1);
}

TEST(ControlPlane, RequestGetsItsAnswerOrTimesOut) {
  ControlServer server(kHost, 0);
  ControlClient ctl(server.endpoint(), "ctl/" + std::to_string(getpid()));

  // Nobody answers: the request gives up after its timeout.
  Envelope req = make_envelope(0);
  req.mutable_status_request();
  // It waits its timeout (a lower bound the clock guarantees, however loaded the machine),
  // and it does give up: a request that waited on would not return before the deadline.
  auto start = Clock::now();
  test::expect_returns([&] { EXPECT_FALSE(ctl.request(req, 200ms).has_value()); },
                       "a request nobody answers");
  EXPECT_GE(Clock::now() - start, 190ms);

  // No server at all: the same.
  ControlClient orphan("tcp://127.0.0.1:1", "ctl/orphan");
  test::expect_returns([&] { EXPECT_FALSE(orphan.request(req, 200ms).has_value()); },
                       "a request to no server");

  // A controller thread answers the next request; the stale request from above, still in
  // the server's queue, is answered too, and that late reply must not confuse the client.
  std::atomic<int> answered{0};
  std::thread controller([&server, &answered] {
    while (answered < 2) {
      auto in = server.poll(100ms);
      if (!in || !in->msg.has_status_request()) continue;
      Envelope reply = make_envelope(3);
      reply.mutable_status_reply()->set_step(answered == 0 ? 1 : 42);
      server.send(in->identity, reply);
      ++answered;
    }
  });
  // The late reply to the first request must be waiting in the client's queue before the
  // next request goes out (request() drains it then).
  ASSERT_TRUE(test::eventually([&] { return answered.load() >= 1 && ctl.queued(); }))
      << "the stale request's late reply never reached the client";
  auto reply = ctl.request(req, 5s);
  controller.join();
  ASSERT_TRUE(reply);
  ASSERT_TRUE(reply->has_status_reply());
  EXPECT_EQ(reply->status_reply().step(), 42);
}

TEST(ControlPlane, BindFailureIsAKeelError) {
  ControlServer server(kHost, 0);
  try {
    ControlServer again(kHost, server.port());
    FAIL() << "bound the same port twice";
  } catch (const Error& e) {
    EXPECT_HAS(e.what(), "cannot bind tcp://127.0.0.1:" + std::to_string(server.port()));
  }
  EXPECT_THROW(ControlClient("not-an-endpoint", "agent/0"), Error);
}

}  // namespace
}  // namespace keel
