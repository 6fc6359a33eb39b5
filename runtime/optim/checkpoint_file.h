// The optimizer checkpoint file: what strata_optimizer_export writes and strata_optimizer_import
// reads. Layout (little-endian, docs/optimizer.md "Checkpoint format"):
//
//   header   64 bytes: magic "STRATAOP", version, header size, group count, record count, step,
//            total elements; then 48 bytes per group; then XXH3-64 of all of the above
//   records  per parameter: name size, group, element count, name, then master, exp_avg and
//            exp_avg_sq as fp32 arrays; then XXH3-64 of the record
//   trailer  "STRATEND", record count, XXH3-64 of the header's and every record's checksum
//
// Writing is atomic: the writer fills a temporary file beside the target (O_EXCL, 0600), and
// commit() fsyncs it, renames it over the target and fsyncs the directory; a writer destroyed
// before commit() removes its temporary file, and a process killed mid-export leaves the target
// untouched. Reading checks sizes and checksums before anything is believed, so a damaged file is
// STRATA_E_CORRUPT and never silently wrong.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace strata::optim {

inline constexpr uint32_t kCheckpointVersion = 1;
// Explicit limits: beyond them a header field is damage, not a plan.
inline constexpr uint32_t kMaxCheckpointGroups = 1u << 16;
inline constexpr uint32_t kMaxCheckpointNameBytes = 4096;

struct CheckpointGroup {
  double lr = 0;
  double beta1 = 0;
  double beta2 = 0;
  double eps = 0;
  double weight_decay = 0;
  bool decoupled = true;
};

struct CheckpointHeader {
  int64_t step = 0;
  uint64_t record_count = 0;
  uint64_t total_elements = 0;
  std::vector<CheckpointGroup> groups;
};

// One record as found by CheckpointReader::verify: where its three state arrays are.
struct CheckpointRecord {
  std::string name;
  uint32_t group = 0;
  uint64_t elements = 0;
  uint64_t offset = 0;  // file offset of the record's first byte
};

// Removes the temporaries an export to `path` left when its process died before finishing (killed,
// crashed): those whose writer is certainly gone (common/owner_process.h), never one still being
// written. Export and import call it first. Returns how many were removed.
uint32_t remove_stale_temporaries(const std::string& path);

// Streams one record at a time. Typical use: create, write_header, then per parameter
// begin_record / append (master, exp_avg, exp_avg_sq: exactly 12 bytes per element in total)
// / end_record, then commit.
class CheckpointWriter {
 public:
  static Result<std::unique_ptr<CheckpointWriter>> create(const std::string& path);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  Status write_header(const CheckpointHeader& header);
  Status begin_record(const std::string& name, uint32_t group, uint64_t elements);
  Status append(const void* data, uint64_t bytes);
  Status end_record();
  // Trailer, fsync, rename over the target, fsync of the directory. After an error the target
  // is unchanged and the temporary file is removed.
  Status commit();

 private:
  struct Hasher;
  CheckpointWriter(std::string path, std::string temp_path, UniqueFd fd);
  Status put(const void* data, uint64_t bytes);  // buffered write, hashed into the record
  Status drain();

  std::string path_;
  std::string temp_path_;
  UniqueFd fd_;
  std::unique_ptr<Hasher> record_hash_;
  std::vector<unsigned char> buffer_;
  size_t buffered_ = 0;
  bool in_record_ = false;
  bool committed_ = false;
  uint64_t record_bytes_left_ = 0;
  uint64_t records_expected_ = 0;
  std::vector<uint64_t> checksums_;  // the header's, then one per record: the trailer's input
};

// Two passes, as an import needs: verify() reads the whole file once (sizes, checksums, trailer)
// and lists the records; read_states() then streams one record's arrays again, checking its
// checksum once more at the end (the file is held open, so an export renamed over the path
// meanwhile does not change what is read).
class CheckpointReader {
 public:
  static Result<std::unique_ptr<CheckpointReader>> open(const std::string& path);
  const CheckpointHeader& header() const { return header_; }
  Status verify();
  const std::vector<CheckpointRecord>& records() const { return records_; }

  // Calls sink(state, first_element, data, count) for consecutive pieces of the record's three
  // arrays, in file order, then checks the record's checksum. The sink returns a Status.
  template <typename Sink>
  Status read_states(const CheckpointRecord& record, Sink&& sink);

 private:
  explicit CheckpointReader(std::string path, UniqueFd fd, uint64_t size)
      : path_(std::move(path)), fd_(std::move(fd)), size_(size) {}
  Status read_at(uint64_t offset, void* dst, uint64_t bytes) const;
  Status read_header();
  // Reads the record that starts at `start`, checks its checksum, fills *out (when not null) and
  // hands its state arrays to piece(context, data, bytes) in pieces that are whole elements and
  // never straddle two arrays (when piece is not null). Returns the offset after the record.
  using PieceFn = Status (*)(void* context, const unsigned char* data, uint64_t bytes);
  Result<uint64_t> scan_record(uint64_t start, CheckpointRecord* out, PieceFn piece, void* context,
                               uint64_t* checksum) const;

  std::string path_;
  UniqueFd fd_;
  uint64_t size_ = 0;
  uint64_t header_bytes_ = 0;
  uint64_t header_checksum_ = 0;
  CheckpointHeader header_;
  std::vector<CheckpointRecord> records_;
  bool verified_ = false;
};

template <typename Sink>
Status CheckpointReader::read_states(const CheckpointRecord& record, Sink&& sink) {
  if (!verified_) return Status::error(STRATA_E_INTERNAL, "checkpoint: read before verify");
  using SinkFn = std::remove_reference_t<Sink>;
  struct Context {
    SinkFn* sink;
    uint64_t elements;
    uint64_t position = 0;  // in elements over the three arrays
  } context{&sink, record.elements};
  const PieceFn piece = [](void* raw, const unsigned char* data, uint64_t bytes) -> Status {
    auto& c = *static_cast<Context*>(raw);
    // Pieces are whole elements and never straddle two arrays (scan_record cuts them so).
    const uint64_t count = bytes / 4;
    const uint32_t state = static_cast<uint32_t>(c.position / c.elements);
    const uint64_t first = c.position % c.elements;
    c.position += count;
    return (*c.sink)(state, first, reinterpret_cast<const float*>(data), count);
  };
  uint64_t checksum = 0;
  return scan_record(record.offset, nullptr, piece, &context, &checksum).status();
}

}  // namespace strata::optim
