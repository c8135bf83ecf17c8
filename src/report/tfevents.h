// TensorBoard event files, written the way torch's SummaryWriter writes them: TFRecord framing (length,
// masked CRC-32C of the length, the serialized Event, masked CRC-32C of it) around hand-encoded protobuf
// messages (Event, Summary, SessionLog, TensorProto: the few fields a scalar and a text summary use; a
// generated encoder would add protoc to the build for 60 lines of wire format).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace tr {
class FileWriter;
}

namespace tr::report {

// One events.out.tfevents.<10-digit time>.<host>.<pid>.<n> file in `logdir` (created if missing; n is the
// first suffix not taken, so a second writer in the same second never overwrites a file). The first record
// is the file_version "brain.Event:2" event. Records are buffered until flush(), which writes whole records
// only: a run killed at any moment leaves a file TensorBoard reads up to the last flush.
class EventFileWriter {
 public:
  explicit EventFileWriter(const std::string& logdir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // A scalar as Summary.Value.simple_value (float, as TensorBoard stores it).
  void add_scalar(const std::string& tag, double value, int64_t step, double wall_time);
  // Text as torch's add_text: tag "<tag>/text_summary", the text plugin's metadata and a DT_STRING tensor.
  void add_text(const std::string& tag, const std::string& text, int64_t step, double wall_time);
  // SessionLog START at `step`: TensorBoard drops what earlier files logged at steps >= step (a resumed run
  // repeats the steps after its checkpoint).
  void add_session_start(int64_t step, double wall_time);
  // Appends the buffered records to the file; throws naming the file and the reason.
  void flush();
  const std::string& path() const { return path_; }

 private:
  void add_event(const std::string& event);

  std::string path_;
  std::unique_ptr<FileWriter> file_;
  std::string pending_;
};

// Seconds since the epoch (Event.wall_time).
double wall_time_now();

}  // namespace tr::report
