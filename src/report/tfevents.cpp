// TensorBoard event files: protobuf wire encoding and TFRecord framing (see tfevents.h).
#include "report/tfevents.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "core/file_writer.h"
#include "report/crc32c.h"

namespace tr::report {

namespace fs = std::filesystem;

namespace {

// Protobuf wire format: a key is (field number << 3 | wire type); 0 varint, 1 fixed64, 2 length-delimited,
// 5 fixed32.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, int field, int wire) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | wire);
}

void put_int(std::string& out, int field, int64_t v) {
  put_key(out, field, 0);
  put_varint(out, static_cast<uint64_t>(v));  // negative int64s take ten bytes, as protobuf's own encoder
}

void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

template <typename T>
void put_fixed(std::string& out, int field, T v) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  put_key(out, field, sizeof(T) == 8 ? 1 : 5);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian on every machine we build for
  out.append(b, sizeof(T));
}

// Event: wall_time = 1 (double), step = 2 (int64), then one of file_version = 3, summary = 5,
// session_log = 7. Proto3 omits zero scalars.
std::string event_head(int64_t step, double wall_time) {
  std::string e;
  put_fixed(e, 1, wall_time);
  if (step != 0) put_int(e, 2, step);
  return e;
}

// Summary { repeated Value value = 1 }.
std::string summary_of(const std::string& value) {
  std::string s;
  put_bytes(s, 1, value);
  return s;
}

}  // namespace

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

EventFileWriter::EventFileWriter(const std::string& logdir) {
  std::error_code ec;
  fs::create_directories(logdir, ec);
  TR_CHECK(!ec, "{}: cannot create the logging_dir: {}", logdir, ec.message());
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  const auto now = static_cast<long long>(wall_time_now());
  for (int n = 0;; ++n) {
    path_ = (fs::path(logdir) / fmt::format("events.out.tfevents.{:010d}.{}.{}.{}", now, host, getpid(), n))
                .string();
    if (!fs::exists(path_)) break;
  }
  file_ = std::make_unique<FileWriter>(path_);
  std::string e = event_head(0, wall_time_now());
  put_bytes(e, 3, "brain.Event:2");
  add_event(e);
  flush();
}

EventFileWriter::~EventFileWriter() = default;

void EventFileWriter::add_scalar(const std::string& tag, double value, int64_t step, double wall_time) {
  // Summary.Value: tag = 1, simple_value = 2 (float).
  std::string v;
  put_bytes(v, 1, tag);
  put_fixed(v, 2, static_cast<float>(value));
  std::string e = event_head(step, wall_time);
  put_bytes(e, 5, summary_of(v));
  add_event(e);
}

void EventFileWriter::add_text(const std::string& tag, const std::string& text, int64_t step,
                               double wall_time) {
  // SummaryMetadata { plugin_data = 1: PluginData { plugin_name = 1, content = 2 (TextPluginData{} is
  // empty) } }.
  std::string plugin, metadata;
  put_bytes(plugin, 1, "text");
  put_bytes(metadata, 1, plugin);
  // TensorProto { dtype = 1 (DT_STRING = 7), tensor_shape = 2: { dim = 2: { size = 1: 1 } }, string_val = 8
  // }.
  std::string dim, shape, tensor;
  put_int(dim, 1, 1);
  put_bytes(shape, 2, dim);
  put_int(tensor, 1, 7);
  put_bytes(tensor, 2, shape);
  put_bytes(tensor, 8, text);
  // Summary.Value: tag = 1, tensor = 8, metadata = 9.
  std::string v;
  put_bytes(v, 1, tag + "/text_summary");
  put_bytes(v, 8, tensor);
  put_bytes(v, 9, metadata);
  std::string e = event_head(step, wall_time);
  put_bytes(e, 5, summary_of(v));
  add_event(e);
}

void EventFileWriter::add_session_start(int64_t step, double wall_time) {
  std::string log;
  put_int(log, 1, 1);  // SessionLog.status = START
  std::string e = event_head(step, wall_time);
  put_bytes(e, 7, log);
  add_event(e);
}

void EventFileWriter::add_event(const std::string& event) {
  const uint64_t len = event.size();
  char head[12];
  std::memcpy(head, &len, 8);
  const uint32_t len_crc = masked_crc32c(head, 8);
  std::memcpy(head + 8, &len_crc, 4);
  const uint32_t data_crc = masked_crc32c(event.data(), event.size());
  pending_.append(head, 12);
  pending_ += event;
  pending_.append(reinterpret_cast<const char*>(&data_crc), 4);
}

void EventFileWriter::flush() {
  if (pending_.empty()) return;
  file_->write(pending_);  // one write of whole records: a kill leaves no torn record behind a flush
  pending_.clear();
}

}  // namespace tr::report
