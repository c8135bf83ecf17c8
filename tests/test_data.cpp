// Token shards (llm.c, nanoGPT), sequence datasets, sampling and the DataLoader: round trips, bad files,
// worker-count independence, distributed coverage, and resume by seeking.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "data/loader.h"
#include "data/tokenize.h"
#include "ops/ops.h"
#include "test_util.h"

namespace tr {
namespace {

namespace fs = std::filesystem;

struct Tmp {
  fs::path dir = fs::temp_directory_path() / ("trainer_data_" + std::to_string(::getpid()));
  Tmp() { fs::create_directories(dir); }
  ~Tmp() { fs::remove_all(dir); }
  std::string file(const std::string& n) const { return (dir / n).string(); }
};

std::vector<uint32_t> ramp(size_t n, uint32_t mod) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>((i * 7919) % mod);
  return v;
}

TEST(Shards, LlmcAndNanoGptFilesRoundTrip) {
  Tmp t;
  auto small = ramp(1000, 50257), big = ramp(1000, 128256);
  data::write_llmc_shard(t.file("a.bin"), small, 50257);
  data::write_llmc_shard(t.file("b.bin"), big, 128256);
  EXPECT_EQ(fs::file_size(t.file("a.bin")), 1024u + 2000u);
  EXPECT_EQ(fs::file_size(t.file("b.bin")), 1024u + 4000u);
  auto a = data::TokenFile::open(t.file("a.bin"), 50257), b = data::TokenFile::open(t.file("b.bin"), 128256);
  ASSERT_EQ(a.size(), 1000);
  for (int64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(a.at(i), small[i]);
    EXPECT_EQ(b.at(i), big[i]);
  }
  std::vector<uint16_t> raw(500);
  for (int i = 0; i < 500; ++i) raw[i] = static_cast<uint16_t>(i * 3);
  std::ofstream(t.file("train.bin"), std::ios::binary).write(reinterpret_cast<const char*>(raw.data()), 1000);
  auto n = data::TokenFile::open(t.file("train.bin"));
  EXPECT_FALSE(n.llmc());
  EXPECT_EQ(n.size(), 500);
  EXPECT_EQ(n.at(499), 1497u);
  data::TokenStream s({t.file("a.bin"), t.file("train.bin")});
  EXPECT_EQ(s.size(), 1500);
  std::vector<int64_t> buf(4);
  s.read(998, 4, buf.data());
  EXPECT_EQ(buf, (std::vector<int64_t>{small[998], small[999], 0, 3}));
}

TEST(Shards, BrokenFilesFailNamingTheFile) {
  Tmp t;
  auto expect = [](const std::string& path, const std::string& needle, int64_t vocab = 0) {
    try {
      data::TokenFile::open(path, vocab);
      ADD_FAILURE() << "accepted " << path;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  data::write_llmc_shard(t.file("ok.bin"), ramp(100, 1000), 50257);
  fs::copy_file(t.file("ok.bin"), t.file("short.bin"));
  fs::resize_file(t.file("short.bin"), 1024 + 150);
  expect(t.file("short.bin"), "header says 100 tokens");
  {
    std::fstream f(t.file("ok.bin"), std::ios::in | std::ios::out | std::ios::binary);
    int32_t v = 3;
    f.seekp(4);
    f.write(reinterpret_cast<const char*>(&v), 4);
  }
  expect(t.file("ok.bin"), "version 3");
  std::ofstream(t.file("empty.bin")).close();
  expect(t.file("empty.bin"), "empty");
  std::ofstream(t.file("odd.bin")) << "abc";
  expect(t.file("odd.bin"), "odd size");
  data::write_llmc_shard(t.file("ids.bin"), {1, 2, 60000}, 65536);
  expect(t.file("ids.bin"), "token 60000 at position 2 is >= vocab size 50257", 50257);
  expect(t.file("absent.bin"), "cannot open");
}

std::shared_ptr<data::SequenceDataset> dataset(const std::string& file, data::DatasetOptions o) {
  auto s = std::make_shared<data::TokenStream>(std::vector<std::string>{file});
  return std::make_shared<data::SequenceDataset>(s, o);
}

// datasets' data_files globs: "**" as a whole component matches zero or more folders; hidden ones are
// skipped.
TEST(Inputs, RecursiveGlobsAsDataFiles) {
  const fs::path d = fs::temp_directory_path() / ("globs_" + std::to_string(::getpid()));
  fs::remove_all(d);
  for (const char* f :
       {"a.txt", "x/b.txt", "x/y/c.txt", "x/n.json", ".hidden/h.txt", ".dot.txt", "x/.e.txt"}) {
    fs::create_directories((d / f).parent_path());
    std::ofstream(d / f) << "text";
  }
  const auto rel = [&](const std::vector<std::string>& files) {
    std::vector<std::string> out;
    for (const auto& f : files) out.push_back(fs::relative(f, d).string());
    return out;
  };
  const std::string D = d.string();
  EXPECT_EQ(rel(data::expand_inputs({D + "/**/*.txt"}, "train_file")),
            (std::vector<std::string>{"a.txt", "x/b.txt", "x/y/c.txt"}));
  EXPECT_EQ(rel(data::expand_inputs({D + "/**"}, "train_file")),
            (std::vector<std::string>{"a.txt", "x/b.txt", "x/n.json", "x/y/c.txt"}));
  EXPECT_EQ(rel(data::expand_inputs({D + "/x/**/c.txt", D + "/**/y/*.txt"}, "train_file")),
            (std::vector<std::string>{"x/y/c.txt", "x/y/c.txt"}));
  EXPECT_EQ(rel(data::expand_inputs({D + "/*.txt"}, "train_file")), (std::vector<std::string>{"a.txt"}));
  const auto error_of = [](const std::string& pattern) {
    return test::error_of([&] { data::expand_inputs({pattern}, "train_file"); });
  };
  EXPECT_NE(error_of(D + "/a**").find("** must be a whole path component"), std::string::npos);
  EXPECT_NE(error_of(D + "/**/*.md").find("no such file"), std::string::npos);
  EXPECT_NE(error_of(D + "/x").find("is a folder"), std::string::npos);
  fs::remove_all(d);
}

TEST(Dataset, BlocksShuffleDeterministicallyAndRanksCoverAnEpochDisjointly) {
  Tmp t;
  auto toks = ramp(10 * 16 + 5, 50000);
  data::write_llmc_shard(t.file("d.bin"), toks, 50257);
  data::DatasetOptions o;
  o.block_size = 16;
  auto ds = dataset(t.file("d.bin"), o);
  EXPECT_EQ(ds->num_samples(), 10);
  std::vector<int64_t> s(16);
  ds->sample(0, 3, s.data());
  for (int i = 0; i < 16; ++i) EXPECT_EQ(s[i], toks[3 * 16 + i]);
  EXPECT_EQ(ds->epoch_order(0), dataset(t.file("d.bin"), o)->epoch_order(0));  // same seed, same order
  EXPECT_NE(ds->epoch_order(0), ds->epoch_order(1));
  std::multiset<int64_t> seen;
  for (int r = 0; r < 3; ++r) {
    o.rank = r;
    o.world_size = 3;
    for (int64_t i : dataset(t.file("d.bin"), o)->epoch_order(2)) seen.insert(i);
  }
  EXPECT_EQ(seen.size(), 10u);
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(seen.count(i), 1u);
  o.rank = 0;
  o.world_size = 1;
  o.block_size = 1000;
  EXPECT_THROW(dataset(t.file("d.bin"), o), Error);  // too short for one block
}

std::vector<std::vector<int64_t>> run_epoch(data::DataLoader& dl) {
  std::vector<std::vector<int64_t>> out;
  while (auto b = dl.next()) out.push_back(ops::to_vector<int64_t>(b->input_ids));
  return out;
}

TEST(DataLoader, BatchesDoNotDependOnWorkersAndResumeBySeeking) {
  Tmp t;
  data::write_llmc_shard(t.file("d.bin"), ramp(37 * 8, 50000), 50257);
  data::DatasetOptions o;
  o.block_size = 8;
  auto ds = dataset(t.file("d.bin"), o);
  std::vector<std::vector<int64_t>> ref;
  for (int workers : {0, 1, 2, 3}) {
    data::DataLoaderOptions lo;
    lo.batch_size = 4;
    lo.num_workers = workers;
    data::DataLoader dl(ds, lo);
    EXPECT_EQ(dl.batches_per_epoch(), 10);  // 37 samples, last batch of 1
    auto e0 = run_epoch(dl);
    auto e1 = run_epoch(dl);
    EXPECT_EQ(dl.position(), (data::LoaderPosition{2, 0}));
    e0.insert(e0.end(), e1.begin(), e1.end());
    if (ref.empty()) ref = e0;
    EXPECT_EQ(e0, ref) << workers << " workers";
  }
  // Resume in the middle of epoch 1 by seeking: the same batches as the uninterrupted run.
  data::DataLoaderOptions lo;
  lo.batch_size = 4;
  lo.num_workers = 2;
  data::DataLoader dl(ds, lo);
  dl.seek({1, 6});
  auto rest = run_epoch(dl);
  ASSERT_EQ(rest.size(), 4u);
  for (size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i], ref[10 + 6 + i]);
  lo.drop_last = true;
  data::DataLoader dd(ds, lo);
  EXPECT_EQ(dd.batches_per_epoch(), 9);
  EXPECT_EQ(run_epoch(dd).back().size(), 4u * 8);
}

TEST(DataLoader, StoppingEarlyShutsWorkersDown) {
  Tmp t;
  data::write_llmc_shard(t.file("d.bin"), ramp(4000, 50000), 50257);
  data::DatasetOptions o;
  o.block_size = 4;
  data::DataLoaderOptions lo;
  lo.batch_size = 2;
  lo.num_workers = 3;
  lo.prefetch_factor = 1;
  for (int i = 0; i < 20; ++i) {
    data::DataLoader dl(dataset(t.file("d.bin"), o), lo);
    dl.next();  // workers are now blocked on full queues; the destructor must wake and join them
  }
}

TEST(Dataset, WindowsStayInsideTheStreamAndAreSeeded) {
  Tmp t;
  auto toks = ramp(100, 50000);
  data::write_llmc_shard(t.file("d.bin"), toks, 50257);
  data::DatasetOptions o;
  o.block_size = 10;
  o.sampling = data::Sampling::windows;
  auto ds = dataset(t.file("d.bin"), o);
  std::vector<int64_t> a(10), b(10);
  for (int64_t i = 0; i < ds->num_samples(); ++i) {
    ds->sample(0, i, a.data());
    auto it = std::find(toks.begin(), toks.end(), static_cast<uint32_t>(a[0]));
    ASSERT_NE(it, toks.end());
    const size_t off = static_cast<size_t>(it - toks.begin());
    ASSERT_LE(off + 10, toks.size());
    for (int k = 0; k < 10; ++k) EXPECT_EQ(a[k], toks[off + k]);
  }
  ds->sample(0, 2, a.data());
  ds->sample(0, 2, b.data());
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {

TEST(DataLoader, GpuBatchesNeedAGpuAndHostBatchesArePlain) {
  Tmp t;
  data::write_llmc_shard(t.file("d.bin"), ramp(400, 50000), 50257);
  data::DatasetOptions o;
  o.block_size = 4;
  auto ds = dataset(t.file("d.bin"), o);
  data::DataLoaderOptions lo;
  lo.batch_size = 2;
  lo.pin_memory = true;  // host batches for the CPU stay ordinary memory
  data::DataLoader cpu(ds, lo);
  EXPECT_TRUE(cpu.next()->input_ids.device().is_cpu());
  if (!backend::cuda_available()) {
    lo.device = Device::cuda(0);
    EXPECT_THROW(data::DataLoader(ds, lo), Error);
    GTEST_SKIP() << "no CUDA GPU here: pinned memory and asynchronous copies NOT tested";
  }
  lo.device = Device::cuda(0);
  lo.num_workers = 2;
  data::DataLoader gpu(ds, lo);
  data::DataLoader ref(ds, data::DataLoaderOptions{2, 0, 2, false, false, Device::cpu()});
  for (int i = 0; i < 10; ++i) {
    auto a = gpu.next(), b = ref.next();
    EXPECT_TRUE(a->input_ids.device().is_cuda());
    EXPECT_EQ(ops::to_vector<int64_t>(a->input_ids), ops::to_vector<int64_t>(b->input_ids));
  }
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {

TEST(DataLoader, AWorkersErrorReachesTheCaller) {
  Tmp t;
  auto toks = ramp(400, 999);
  toks[350] = 999;  // within the shard's vocabulary, above the model's
  data::write_llmc_shard(t.file("d.bin"), toks, 50257);
  data::DatasetOptions o;
  o.block_size = 4;
  o.shuffle = false;
  o.vocab_size = 999;
  for (int workers : {0, 2}) {
    data::DataLoaderOptions lo;
    lo.batch_size = 5;
    lo.num_workers = workers;
    data::DataLoader dl(dataset(t.file("d.bin"), o), lo);
    try {
      while (dl.next()) {
      }
      ADD_FAILURE() << "no error with " << workers << " workers";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("token 999 at stream position 350"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace tr
