#include "optim/checkpoint_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/owner_process.h"
#include "common/unique_fd.h"

namespace strata::optim {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the checkpoint format is little-endian; add byte swapping for this host");

constexpr char kMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'O', 'P'};
constexpr char kTrailerMagic[8] = {'S', 'T', 'R', 'A', 'T', 'E', 'N', 'D'};
constexpr uint64_t kFixedHeaderBytes = 64;
constexpr uint64_t kGroupBytes = 48;
constexpr uint64_t kRecordHeadBytes = 16;  // name size, group, elements
constexpr uint64_t kTrailerBytes = 24;
constexpr uint64_t kStateBytesPerElement = 12;  // master, exp_avg, exp_avg_sq: fp32 each
constexpr size_t kIoBufferBytes = size_t{4} << 20;

template <typename T>
void put_le(unsigned char* at, T value) {
  std::memcpy(at, &value, sizeof value);
}
template <typename T>
T get_le(const unsigned char* at) {
  T value;
  std::memcpy(&value, at, sizeof value);
  return value;
}

Status corrupt(const std::string& path, const std::string& what) {
  return Status::error(STRATA_E_CORRUPT, "checkpoint '" + path + "': " + what);
}

struct StateDeleter {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};
using HashState = std::unique_ptr<XXH3_state_t, StateDeleter>;

Result<HashState> new_hash() {
  HashState state(XXH3_createState());
  if (!state) return Status::error(STRATA_E_NOMEM, "checkpoint: no memory for a hash state");
  XXH3_64bits_reset(state.get());
  return state;
}

// Temporaries sit beside the checkpoint as ".<name>.tmp.<stamp>.<counter>". The name is unique
// per process and call, so concurrent exports to one directory never collide (O_EXCL would refuse
// them), and the writer's stamp (common/owner_process.h) with the flock it holds on the file lets
// a later export or import tell a temporary whose writer is gone from one still being written.
std::string temp_prefix_for(const std::filesystem::path& target) {
  return "." + target.filename().string() + ".tmp.";
}

std::string temp_name_for(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  const std::filesystem::path target(path);
  const std::string name = temp_prefix_for(target) + format_stamp(this_process_stamp()) + "." +
                           std::to_string(counter.fetch_add(1));
  return (target.parent_path() / name).string();
}

}  // namespace

uint32_t remove_stale_temporaries(const std::string& path) {
  const std::filesystem::path target(path);
  const std::filesystem::path dir =
      target.parent_path().empty() ? std::filesystem::path(".") : target.parent_path();
  const std::string prefix = temp_prefix_for(target);
  uint32_t removed = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    // "<stamp>.<counter>": the stamp is what comes before the last dot. A name that does not
    // parse (another program's, an older Strata's) is never touched.
    const std::string rest = name.substr(prefix.size());
    const size_t dot = rest.rfind('.');
    if (dot == std::string::npos) continue;
    const std::optional<OwnerStamp> owner = parse_stamp(std::string_view(rest).substr(0, dot));
    if (!owner || owner_alive(*owner)) continue;
    // The writer's lock covers what the stamp cannot see (a writer in another pid namespace).
    UniqueFd fd(::open(it->path().c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    struct stat st {};
    if (!fd.valid() || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) continue;
    if (::unlink(it->path().c_str()) == 0) ++removed;
  }
  return removed;
}

namespace {

Status write_all(int fd, const void* data, uint64_t bytes, const std::string& path) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, std::min<uint64_t>(bytes, uint64_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      return errno_status(e == ENOSPC ? STRATA_E_NOSPACE : STRATA_E_IO,
                          "writing checkpoint '" + path + "'", e);
    }
    p += n;
    bytes -= static_cast<uint64_t>(n);
  }
  return Status::ok();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Writer

struct CheckpointWriter::Hasher {
  HashState state;
};

CheckpointWriter::CheckpointWriter(std::string path, std::string temp_path, UniqueFd fd)
    : path_(std::move(path)), temp_path_(std::move(temp_path)), fd_(std::move(fd)) {}

Result<std::unique_ptr<CheckpointWriter>> CheckpointWriter::create(const std::string& path) {
  if (path.empty()) return invalid_argument("checkpoint path is empty");
  remove_stale_temporaries(path);
  const std::string temp = temp_name_for(path);
  UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    const int e = errno;
    const int code = e == ENOENT || e == ENOTDIR ? STRATA_E_INVALID
                     : e == ENOSPC               ? STRATA_E_NOSPACE
                                                 : STRATA_E_IO;
    return errno_status(code, "creating '" + temp + "' beside checkpoint '" + path + "'", e);
  }
  // Held until the file is renamed or removed: a remover in any pid namespace sees it is in use.
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    ::unlink(temp.c_str());
    return errno_status(STRATA_E_IO, "locking '" + temp + "'", e);
  }
  std::unique_ptr<CheckpointWriter> writer(new CheckpointWriter(path, temp, std::move(fd)));
  writer->buffer_.resize(kIoBufferBytes);
  writer->record_hash_ = std::make_unique<Hasher>();
  STRATA_ASSIGN_OR_RETURN(writer->record_hash_->state, new_hash());
  return writer;
}

CheckpointWriter::~CheckpointWriter() {
  if (!committed_) {
    fd_.reset();
    ::unlink(temp_path_.c_str());
  }
}

Status CheckpointWriter::drain() {
  STRATA_TRY(write_all(fd_.get(), buffer_.data(), buffered_, temp_path_));
  buffered_ = 0;
  return Status::ok();
}

Status CheckpointWriter::put(const void* data, uint64_t bytes) {
  if (in_record_) XXH3_64bits_update(record_hash_->state.get(), data, bytes);
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    if (buffered_ == buffer_.size()) STRATA_TRY(drain());
    const uint64_t n = std::min<uint64_t>(bytes, buffer_.size() - buffered_);
    std::memcpy(buffer_.data() + buffered_, p, n);
    buffered_ += n;
    p += n;
    bytes -= n;
  }
  return Status::ok();
}

Status CheckpointWriter::write_header(const CheckpointHeader& header) {
  if (!checksums_.empty()) return Status::error(STRATA_E_INTERNAL, "checkpoint header twice");
  if (header.groups.size() > kMaxCheckpointGroups) {
    return invalid_argument("checkpoint: too many groups");
  }
  const uint64_t header_bytes = kFixedHeaderBytes + kGroupBytes * header.groups.size() + 8;
  std::vector<unsigned char> h(header_bytes, 0);
  std::memcpy(h.data(), kMagic, sizeof kMagic);
  put_le<uint32_t>(&h[8], kCheckpointVersion);
  put_le<uint32_t>(&h[12], static_cast<uint32_t>(header_bytes));
  put_le<uint32_t>(&h[16], static_cast<uint32_t>(header.groups.size()));
  put_le<uint32_t>(&h[20], 0);  // flags
  put_le<uint64_t>(&h[24], header.record_count);
  put_le<int64_t>(&h[32], header.step);
  put_le<uint64_t>(&h[40], header.total_elements);
  for (size_t g = 0; g < header.groups.size(); ++g) {
    unsigned char* at = &h[kFixedHeaderBytes + kGroupBytes * g];
    const CheckpointGroup& group = header.groups[g];
    put_le<double>(at + 0, group.lr);
    put_le<double>(at + 8, group.beta1);
    put_le<double>(at + 16, group.beta2);
    put_le<double>(at + 24, group.eps);
    put_le<double>(at + 32, group.weight_decay);
    put_le<uint32_t>(at + 40, group.decoupled ? 1u : 0u);
  }
  const uint64_t checksum = XXH3_64bits(h.data(), header_bytes - 8);
  put_le<uint64_t>(&h[header_bytes - 8], checksum);
  checksums_.push_back(checksum);
  records_expected_ = header.record_count;
  return put(h.data(), h.size());
}

Status CheckpointWriter::begin_record(const std::string& name, uint32_t group, uint64_t elements) {
  if (checksums_.empty() || in_record_ || checksums_.size() > records_expected_) {
    return Status::error(STRATA_E_INTERNAL, "checkpoint: record out of order");
  }
  if (name.size() > kMaxCheckpointNameBytes) {
    return invalid_argument("checkpoint: parameter name longer than " +
                            std::to_string(kMaxCheckpointNameBytes) + " bytes");
  }
  XXH3_64bits_reset(record_hash_->state.get());
  in_record_ = true;
  unsigned char head[kRecordHeadBytes];
  put_le<uint32_t>(head, static_cast<uint32_t>(name.size()));
  put_le<uint32_t>(head + 4, group);
  put_le<uint64_t>(head + 8, elements);
  STRATA_TRY(put(head, sizeof head));
  STRATA_TRY(put(name.data(), name.size()));
  record_bytes_left_ = elements * kStateBytesPerElement;
  return Status::ok();
}

Status CheckpointWriter::append(const void* data, uint64_t bytes) {
  if (!in_record_ || bytes > record_bytes_left_) {
    return Status::error(STRATA_E_INTERNAL, "checkpoint: more state bytes than the record has");
  }
  record_bytes_left_ -= bytes;
  return put(data, bytes);
}

Status CheckpointWriter::end_record() {
  if (!in_record_ || record_bytes_left_ != 0) {
    return Status::error(STRATA_E_INTERNAL, "checkpoint: record ended before its states");
  }
  const uint64_t checksum = XXH3_64bits_digest(record_hash_->state.get());
  in_record_ = false;
  checksums_.push_back(checksum);
  return put(&checksum, sizeof checksum);
}

Status CheckpointWriter::commit() {
  if (in_record_ || checksums_.size() != records_expected_ + 1) {
    return Status::error(STRATA_E_INTERNAL, "checkpoint: commit with records missing");
  }
  unsigned char trailer[kTrailerBytes];
  std::memcpy(trailer, kTrailerMagic, sizeof kTrailerMagic);
  put_le<uint64_t>(trailer + 8, records_expected_);
  put_le<uint64_t>(trailer + 16,
                   XXH3_64bits(checksums_.data(), checksums_.size() * sizeof(uint64_t)));
  STRATA_TRY(put(trailer, sizeof trailer));
  STRATA_TRY(drain());
  // The data must be durable before the rename makes it the checkpoint: otherwise a crash could
  // leave the new name pointing at a file whose blocks never reached the disk.
  if (::fsync(fd_.get()) != 0) {
    return errno_status(STRATA_E_IO, "fsync of '" + temp_path_ + "'", errno);
  }
  if (::close(fd_.release()) != 0) {
    return errno_status(STRATA_E_IO, "close of '" + temp_path_ + "'", errno);
  }
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int e = errno;
    return errno_status(e == EISDIR || e == ENOTDIR ? STRATA_E_INVALID : STRATA_E_IO,
                        "renaming '" + temp_path_ + "' to '" + path_ + "'", e);
  }
  committed_ = true;
  // The rename itself lives in the directory: fsync it so the new checkpoint survives a crash.
  std::string dir = std::filesystem::path(path_).parent_path().string();
  if (dir.empty()) dir = ".";
  UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dfd.valid() || ::fsync(dfd.get()) != 0) {
    return errno_status(STRATA_E_IO, "fsync of directory '" + dir + "'", errno);
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Reader

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::open(const std::string& path) {
  if (path.empty()) return invalid_argument("checkpoint path is empty");
  remove_stale_temporaries(path);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    const int e = errno;
    return errno_status(e == ENOENT || e == ENOTDIR || e == EISDIR ? STRATA_E_INVALID : STRATA_E_IO,
                        "opening checkpoint '" + path + "'", e);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return errno_status(STRATA_E_IO, "stat of checkpoint '" + path + "'", errno);
  }
  if (!S_ISREG(st.st_mode)) return invalid_argument("checkpoint '" + path + "' is not a file");
  std::unique_ptr<CheckpointReader> reader(
      new CheckpointReader(path, std::move(fd), static_cast<uint64_t>(st.st_size)));
  STRATA_TRY(reader->read_header());
  return reader;
}

Status CheckpointReader::read_at(uint64_t offset, void* dst, uint64_t bytes) const {
  if (offset > size_ || bytes > size_ - offset) {
    return corrupt(path_, "truncated: needs bytes up to " + std::to_string(offset + bytes) +
                              ", the file has " + std::to_string(size_));
  }
  auto* p = static_cast<unsigned char*>(dst);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd_.get(), p, std::min<uint64_t>(bytes, uint64_t{1} << 30),
                              static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status(STRATA_E_IO, "reading checkpoint '" + path_ + "'", errno);
    }
    if (n == 0) return corrupt(path_, "truncated while reading");
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<uint64_t>(n);
  }
  return Status::ok();
}

Status CheckpointReader::read_header() {
  unsigned char fixed[kFixedHeaderBytes];
  if (size_ < kFixedHeaderBytes) {
    return corrupt(path_, "truncated: " + std::to_string(size_) + " bytes, shorter than a header");
  }
  STRATA_TRY(read_at(0, fixed, sizeof fixed));
  if (std::memcmp(fixed, kMagic, sizeof kMagic) != 0) {
    return invalid_argument("'" + path_ + "' is not a Strata optimizer checkpoint (bad magic)");
  }
  const uint64_t header_bytes = get_le<uint32_t>(fixed + 12);
  const uint32_t group_count = get_le<uint32_t>(fixed + 16);
  // The size fields are checked against each other before the checksum can be located: a damaged
  // size is corruption, not a reason to read elsewhere.
  if (group_count > kMaxCheckpointGroups ||
      header_bytes != kFixedHeaderBytes + kGroupBytes * group_count + 8) {
    return corrupt(path_, "header size fields are inconsistent");
  }
  std::vector<unsigned char> h(header_bytes);
  STRATA_TRY(read_at(0, h.data(), header_bytes));
  const uint64_t stored = get_le<uint64_t>(&h[header_bytes - 8]);
  if (XXH3_64bits(h.data(), header_bytes - 8) != stored) {
    return corrupt(path_, "header checksum mismatch");
  }
  const uint32_t version = get_le<uint32_t>(&h[8]);
  if (version != kCheckpointVersion) {
    return invalid_argument("checkpoint '" + path_ + "' has format version " +
                            std::to_string(version) + "; this library reads version " +
                            std::to_string(kCheckpointVersion));
  }
  header_bytes_ = header_bytes;
  header_checksum_ = stored;
  header_.record_count = get_le<uint64_t>(&h[24]);
  header_.step = get_le<int64_t>(&h[32]);
  header_.total_elements = get_le<uint64_t>(&h[40]);
  header_.groups.resize(group_count);
  for (uint32_t g = 0; g < group_count; ++g) {
    const unsigned char* at = &h[kFixedHeaderBytes + kGroupBytes * g];
    CheckpointGroup& group = header_.groups[g];
    group.lr = get_le<double>(at + 0);
    group.beta1 = get_le<double>(at + 8);
    group.beta2 = get_le<double>(at + 16);
    group.eps = get_le<double>(at + 24);
    group.weight_decay = get_le<double>(at + 32);
    group.decoupled = get_le<uint32_t>(at + 40) != 0;
  }
  // Every record takes at least its head and checksum: a count beyond that is damage.
  if (header_.record_count > size_ / (kRecordHeadBytes + 8)) {
    return corrupt(path_, "record count exceeds what the file can hold");
  }
  return Status::ok();
}

Result<uint64_t> CheckpointReader::scan_record(uint64_t start, CheckpointRecord* out, PieceFn piece,
                                               void* context, uint64_t* checksum) const {
  STRATA_ASSIGN_OR_RETURN(auto hash, new_hash());
  unsigned char head[kRecordHeadBytes];
  STRATA_TRY(read_at(start, head, sizeof head));
  const uint32_t name_bytes = get_le<uint32_t>(head);
  const uint32_t group = get_le<uint32_t>(head + 4);
  const uint64_t elements = get_le<uint64_t>(head + 8);
  uint64_t at = start + sizeof head;
  // Bounds before allocation or reading: a damaged count must not make us read the disk dry.
  if (name_bytes > kMaxCheckpointNameBytes || elements > size_ / kStateBytesPerElement ||
      at + name_bytes + elements * kStateBytesPerElement + 8 > size_) {
    return corrupt(path_, "record at offset " + std::to_string(start) +
                              " has sizes beyond the file (truncated or damaged)");
  }
  std::string name(name_bytes, '\0');
  STRATA_TRY(read_at(at, name.data(), name_bytes));
  XXH3_64bits_update(hash.get(), head, sizeof head);
  XXH3_64bits_update(hash.get(), name.data(), name.size());
  at += name_bytes;
  std::vector<unsigned char> buffer(
      std::min<uint64_t>(kIoBufferBytes, std::max<uint64_t>(elements * 4, 4)));
  for (int state = 0; state < 3; ++state) {
    uint64_t left = elements * 4;
    while (left > 0) {
      const uint64_t n = std::min<uint64_t>(left, buffer.size());
      STRATA_TRY(read_at(at, buffer.data(), n));
      XXH3_64bits_update(hash.get(), buffer.data(), n);
      if (piece != nullptr) STRATA_TRY(piece(context, buffer.data(), n));
      at += n;
      left -= n;
    }
  }
  uint64_t stored = 0;
  STRATA_TRY(read_at(at, &stored, sizeof stored));
  at += sizeof stored;
  const uint64_t computed = XXH3_64bits_digest(hash.get());
  if (computed != stored) {
    return corrupt(path_, "checksum mismatch in the record of '" + name + "' (offset " +
                              std::to_string(start) + ")");
  }
  if (out != nullptr) {
    out->name = std::move(name);
    out->group = group;
    out->elements = elements;
    out->offset = start;
  }
  *checksum = computed;
  return at;
}

Status CheckpointReader::verify() {
  records_.clear();
  std::vector<uint64_t> checksums;
  checksums.reserve(header_.record_count + 1);
  checksums.push_back(header_checksum_);
  uint64_t at = header_bytes_;
  uint64_t total = 0;
  for (uint64_t i = 0; i < header_.record_count; ++i) {
    CheckpointRecord record;
    uint64_t checksum = 0;
    STRATA_ASSIGN_OR_RETURN(auto next, scan_record(at, &record, nullptr, nullptr, &checksum));
    at = next;
    total += record.elements;
    checksums.push_back(checksum);
    records_.push_back(std::move(record));
  }
  unsigned char trailer[kTrailerBytes];
  STRATA_TRY(read_at(at, trailer, sizeof trailer));
  if (std::memcmp(trailer, kTrailerMagic, sizeof kTrailerMagic) != 0 ||
      get_le<uint64_t>(trailer + 8) != header_.record_count ||
      get_le<uint64_t>(trailer + 16) !=
          XXH3_64bits(checksums.data(), checksums.size() * sizeof(uint64_t))) {
    return corrupt(path_, "trailer does not match the records");
  }
  if (at + kTrailerBytes != size_) {
    return corrupt(
        path_, std::to_string(size_ - at - kTrailerBytes) + " unexpected bytes after the trailer");
  }
  if (total != header_.total_elements) {
    return corrupt(path_, "element total does not match the header");
  }
  verified_ = true;
  return Status::ok();
}

}  // namespace strata::optim
