// safetensors: round trips in every dtype, zero-copy loads, sharded checkpoints, and broken files that must
// fail with one clear message naming the file and the tensor.
#include <filesystem>
#include <fstream>

#include "io/safetensors.h"
#include "test_util.h"

namespace tr {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / fmt::format("trainer_test_{}_{}", ::getpid(), counter()++);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::string file(const std::string& n) const { return (path / n).string(); }
};

std::vector<std::pair<std::string, Tensor>> sample_tensors() {
  return {{"a.weight", test::randn({3, 4}, 1)},
          {"b.bf16", ops::to_dtype(test::randn({5}, 2), DType::bf16)},
          {"c.f16", ops::to_dtype(test::randn({2, 2}, 3), DType::f16)},
          {"d.f64", test::randn({7}, 4, DType::f64)},
          {"e.ids", ops::from_vector<int64_t>({1, -2, 3}, {3})},
          {"f.bytes", ops::from_vector<uint8_t>({0, 255, 7}, {3})},
          {"g.empty", ops::zeros({0, 3})},
          {"h.scalar", ops::full({}, 2.5)}};
}

TEST(Safetensors, RoundTripsEveryDtypeAndBorrowsTheMapping) {
  TempDir d;
  auto ts = sample_tensors();
  io::save_safetensors(d.file("m.safetensors"), ts, {{"note", "x"}});
  EXPECT_FALSE(fs::exists(d.file("m.safetensors.tmp")));
  auto f = io::SafetensorsFile::open(d.file("m.safetensors"));
  EXPECT_EQ(f.header().metadata.at("format"), "pt");
  EXPECT_EQ(f.header().metadata.at("note"), "x");
  EXPECT_EQ(f.header().data_offset % 8, 0u);
  for (const auto& [name, t] : ts) {
    Tensor got = f.load(name);
    EXPECT_EQ(got.dtype(), t.dtype()) << name;
    EXPECT_EQ(got.shape(), t.shape()) << name;
    EXPECT_EQ(test::values(got), test::values(t)) << name;
  }
  EXPECT_TRUE(f.load("a.weight").storage()->borrowed());  // no copy
  Tensor as64 = f.load("b.bf16", DType::f64);
  EXPECT_EQ(as64.dtype(), DType::f64);
  EXPECT_EQ(test::values(as64), test::values(ts[1].second));
  EXPECT_THROW(f.load("e.ids", DType::f32), Error);
  EXPECT_THROW(f.load("nope"), Error);
  // A borrowed tensor outlives the file object and can be written without touching the file.
  Tensor w = f.load("a.weight");
  { auto moved = std::move(f); }
  w.data<float>()[0] = 42.0f;
  EXPECT_NE(io::SafetensorsFile::open(d.file("m.safetensors")).load("a.weight").item_at(0), 42.0);
}

TEST(Safetensors, ShardedSaveAndLoadRoundTrip) {
  TempDir d;
  auto ts = sample_tensors();
  io::save_sharded(d.path.string(), ts, 60);  // tiny shards: several files
  EXPECT_TRUE(fs::exists(d.file("model.safetensors.index.json")));
  EXPECT_FALSE(fs::exists(d.file("model.safetensors")));
  int shards = 0;
  for (auto& e : fs::directory_iterator(d.path))
    shards += e.path().string().find("-of-") != std::string::npos;
  EXPECT_GT(shards, 2);
  io::CheckpointReader r(d.path.string());
  EXPECT_EQ(r.names().size(), ts.size());
  for (const auto& [name, t] : ts) EXPECT_EQ(test::values(r.load(name)), test::values(t)) << name;
  // Saving again unsharded replaces the index with a single file.
  io::save_sharded(d.path.string(), ts, io::parse_size("5GB"));
  EXPECT_TRUE(fs::exists(d.file("model.safetensors")));
  EXPECT_FALSE(fs::exists(d.file("model.safetensors.index.json")));
  EXPECT_EQ(test::values(io::CheckpointReader(d.path.string()).load("d.f64")), test::values(ts[3].second));
}

// A streamed save asks for each tensor once, in order, across shards, holding none but the one it writes; the
// files are those of the in-memory save. A tensor unlike its header entry is refused, naming it, and leaves
// no file.
TEST(Safetensors, StreamedSaveMakesEachTensorOnceInOrder) {
  TempDir whole, streamed;
  const auto ts = sample_tensors();
  io::save_sharded(whole.path.string(), ts, 60);
  std::vector<io::TensorEntry> entries;
  for (const auto& [name, t] : ts) entries.push_back({name, t.dtype(), t.shape()});
  std::vector<size_t> asked;
  std::weak_ptr<Storage> previous;
  io::save_sharded(
      streamed.path.string(), entries,
      [&](size_t i) {
        EXPECT_TRUE(previous.expired()) << "tensor " << i << ": the previous one is still held";
        asked.push_back(i);
        Tensor t = ops::clone(ts[i].second);
        previous = t.storage();
        return t;
      },
      60);
  std::vector<size_t> want(ts.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = i;
  EXPECT_EQ(asked, want);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(whole.path)) {
    ++files;
    const auto read = [](const fs::path& p) {
      std::ifstream in(p, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    EXPECT_EQ(read(e.path()), read(streamed.path / e.path().filename())) << e.path().filename();
  }
  EXPECT_GT(files, 2u);
  TempDir bad;
  const std::string path = bad.file("model.safetensors");
  try {
    io::save_safetensors(path, entries, [&](size_t i) { return i == 2 ? ts[1].second : ts[i].second; });
    ADD_FAILURE() << "saved a tensor unlike its header";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'" + ts[2].first + "'"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(Safetensors, ParsesSizes) {
  EXPECT_EQ(io::parse_size("5GB"), 5000000000ull);
  EXPECT_EQ(io::parse_size("2GiB"), 2ull << 30);
  EXPECT_EQ(io::parse_size("500MB"), 500000000ull);
  EXPECT_EQ(io::parse_size("1234"), 1234ull);
  EXPECT_THROW(io::parse_size("5 parsecs"), Error);
  EXPECT_THROW(io::parse_size("GB"), Error);
}

// Writes a file with the given header text and `data_bytes` bytes of data.
std::string craft(const TempDir& d, const std::string& name, const std::string& header, size_t data_bytes,
                  int64_t len_override = -1) {
  std::string path = d.file(name);
  std::ofstream out(path, std::ios::binary);
  uint64_t n = len_override >= 0 ? static_cast<uint64_t>(len_override) : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
  out << header << std::string(data_bytes, '\0');
  return path;
}

void expect_error(const std::string& path, std::initializer_list<std::string> needles) {
  try {
    io::SafetensorsFile::open(path);
    ADD_FAILURE() << "no error for " << path;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    for (const auto& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

TEST(Safetensors, BrokenFilesFailWithAMessageNamingFileAndTensor) {
  TempDir d;
  const std::string ok = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  EXPECT_NO_THROW(io::SafetensorsFile::open(craft(d, "ok.st", ok, 16)));
  expect_error(craft(d, "truncated.st", ok, 12), {"'w'", "past the end"});
  expect_error(craft(d, "longheader.st", ok, 16, 100000), {"header length 100000"});
  expect_error(craft(d, "tiny.st", "", 0, 0).substr(0), {"not valid JSON"});
  expect_error(craft(d, "badjson.st", R"({"w":{"dtype":"F32",)", 0), {"not valid JSON"});
  expect_error(craft(d, "notobject.st", "[1,2]", 0), {"JSON object"});
  expect_error(craft(d, "dtype.st", R"({"w":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2),
               {"'w'", "unknown or unsupported dtype 'F8_E4M3'"});
  expect_error(craft(d, "size.st", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
               {"'w'", "needs 12"});
  expect_error(craft(d, "missing.st", R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", 8),
               {"'w'", "'shape'"});
  expect_error(
      craft(
          d, "overlap.st",
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          12),
      {"'b'", "overlaps"});
  expect_error(
      craft(
          d, "gap.st",
          R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
          12),
      {"'b'", "gap"});
  expect_error(craft(d, "reversed.st", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8),
               {"'w'", "reversed"});
  expect_error(craft(d, "negative.st", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
               {"'w'", "non-negative"});
  expect_error(craft(d, "padded.st", ok, 20), {"truncated or padded"});
  std::ofstream(d.file("short.st")) << "abc";
  expect_error(d.file("short.st"), {"shorter than the 8-byte header"});
  expect_error(d.file("absent.st"), {"cannot open"});
}

TEST(Safetensors, AFailedSaveLeavesTheExistingFileIntact) {
  TempDir d;
  io::save_safetensors(d.file("m.safetensors"), {{"w", ops::ones({2})}});
  EXPECT_THROW(
      io::save_safetensors(d.file("m.safetensors"), {{"w", ops::zeros({2})}, {"w", ops::zeros({2})}}), Error);
  EXPECT_EQ(test::values(io::SafetensorsFile::open(d.file("m.safetensors")).load("w")),
            (std::vector<double>{1, 1}));
  // A crash mid-write leaves only the temporary behind; the real file is still the last good one.
  std::ofstream(d.file("m.safetensors.tmp")) << "partial";
  EXPECT_EQ(test::values(io::SafetensorsFile::open(d.file("m.safetensors")).load("w")),
            (std::vector<double>{1, 1}));
}

TEST(Safetensors, ShardIndexErrorsNameTheIndex) {
  TempDir d;
  std::ofstream(d.file("model.safetensors.index.json")) << R"({"weight_map":{"w":"../evil.safetensors"}})";
  try {
    io::CheckpointReader r(d.path.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the folder"), std::string::npos) << e.what();
  }
  EXPECT_THROW(io::CheckpointReader((d.path / "nothing").string()), Error);
}

}  // namespace
}  // namespace tr
