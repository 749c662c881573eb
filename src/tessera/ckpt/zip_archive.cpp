#include "tessera/ckpt/zip_archive.h"

#include <zlib.h>

#include <algorithm>
#include <limits>

#include "tessera/core/error.h"

namespace tessera::zip {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50, kCentralHeader = 0x02014b50, kEndRecord = 0x06054b50,
                   kZip64EndRecord = 0x06064b50, kZip64Locator = 0x07064b50;
constexpr uint64_t kAlign = 64;  // PyTorch aligns every record's data to 64 bytes
// Deflate cannot expand data by more than this factor (zlib's documented 1032:1 limit).
constexpr uint64_t kMaxDeflateRatio = 1032;

uint16_t u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
uint32_t u32(const uint8_t* p) { return u16(p) | static_cast<uint32_t>(u16(p + 2)) << 16; }
uint64_t u64(const uint8_t* p) { return u32(p) | static_cast<uint64_t>(u32(p + 4)) << 32; }

void put16(std::vector<uint8_t>& o, uint64_t v) {
  o.push_back(static_cast<uint8_t>(v));
  o.push_back(static_cast<uint8_t>(v >> 8));
}
void put32(std::vector<uint8_t>& o, uint64_t v) {
  put16(o, v & 0xffff);
  put16(o, (v >> 16) & 0xffff);
}
void put64(std::vector<uint8_t>& o, uint64_t v) {
  put32(o, v & 0xffffffff);
  put32(o, v >> 32);
}

uint32_t crc_of(std::span<const uint8_t> data) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const uint8_t* p = data.data();
  for (size_t left = data.size(); left > 0;) {  // zlib takes 32-bit lengths
    const uInt n = static_cast<uInt>(std::min<size_t>(left, 1u << 30));
    crc = crc32(crc, p, n);
    p += n;
    left -= n;
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace

Reader::Reader(std::string label, FileBytes file)
    : label_(std::move(label)), file_(std::move(file)), data_(file_.data()), size_(file_.size()) {
  parse();
}

Reader Reader::open(const std::string& path) { return Reader(path, FileBytes::map(path)); }

Reader Reader::from_bytes(std::string label, std::vector<uint8_t> bytes) {
  return Reader(std::move(label), FileBytes::own(std::move(bytes)));
}

Reader Reader::from_view(std::string label, std::span<const uint8_t> bytes, std::shared_ptr<const void> owner) {
  return Reader(std::move(label), FileBytes::view(bytes, std::move(owner)));
}

void Reader::parse() {
  auto bad = [&](const std::string& what) {
    return runtime_error(label_ + " is not a valid zip archive (" + what + ")",
                         "the file is truncated or damaged; copy it again from its source");
  };
  if (size_ < 22) throw bad("shorter than an end-of-archive record");
  // The end record sits in the last 22 + 65535 (comment) bytes.
  uint64_t end = UINT64_MAX;
  for (uint64_t at = size_ - 22;; --at) {
    if (u32(data_ + at) == kEndRecord && at + 22 + u16(data_ + at + 20) == size_) {
      end = at;
      break;
    }
    if (at == 0 || size_ - at > 22 + 65535) break;
  }
  if (end == UINT64_MAX) throw bad("no end-of-archive record");
  uint64_t count = u16(data_ + end + 10), dir_size = u32(data_ + end + 12), dir_offset = u32(data_ + end + 16);
  if (count == 0xffff || dir_size == 0xffffffff || dir_offset == 0xffffffff) {
    if (end < 20 || u32(data_ + end - 20) != kZip64Locator) throw bad("ZIP64 locator missing");
    const uint64_t rec = u64(data_ + end - 20 + 8);
    if (rec > size_ - 56 || u32(data_ + rec) != kZip64EndRecord) throw bad("ZIP64 end record out of bounds");
    count = u64(data_ + rec + 32);
    dir_size = u64(data_ + rec + 40);
    dir_offset = u64(data_ + rec + 48);
  }
  if (dir_offset > size_ || dir_size > size_ - dir_offset) throw bad("central directory out of bounds");
  if (count > dir_size / 46) throw bad("more entries than the central directory holds");
  uint64_t at = dir_offset;
  const uint64_t dir_end = dir_offset + dir_size;
  for (uint64_t i = 0; i < count; ++i) {
    if (dir_end - at < 46 || u32(data_ + at) != kCentralHeader) throw bad("central directory entry " + std::to_string(i));
    const uint8_t* h = data_ + at;
    const uint16_t flags = u16(h + 8), name_len = u16(h + 28), extra_len = u16(h + 30), comment_len = u16(h + 32);
    if (dir_end - at - 46 < uint64_t{name_len} + extra_len + comment_len) throw bad("entry " + std::to_string(i) + " overruns the directory");
    Entry e;
    e.name.assign(reinterpret_cast<const char*>(h + 46), name_len);
    e.method = u16(h + 10);
    e.crc32 = u32(h + 16);
    e.compressed_size = u32(h + 20);
    e.size = u32(h + 24);
    uint64_t local = u32(h + 42);
    // ZIP64 extra field: the 64-bit values of the fields that hold 0xffffffff, in this order.
    for (const uint8_t *x = h + 46 + name_len, *x_end = x + extra_len; x_end - x >= 4;) {
      const uint16_t id = u16(x), len = u16(x + 2);
      if (x_end - x - 4 < len) throw bad("entry " + e.name + ": extra field overruns");
      if (id == 0x0001) {
        const uint8_t* v = x + 4;
        auto take = [&](uint64_t& field) {
          if (field != 0xffffffff) return;
          if (v + 8 > x + 4 + len) throw bad("entry " + e.name + ": short ZIP64 field");
          field = u64(v);
          v += 8;
        };
        take(e.size);
        take(e.compressed_size);
        take(local);
      }
      x += 4 + len;
    }
    if (flags & 1) throw bad("entry " + e.name + " is encrypted");
    if (e.method != 0 && e.method != 8)
      throw bad("entry " + e.name + " uses compression method " + std::to_string(e.method) + ", not stored or deflate");
    if (e.method == 0 && e.size != e.compressed_size) throw bad("stored entry " + e.name + " has two sizes");
    if (local > size_ || size_ - local < 30 || u32(data_ + local) != kLocalHeader)
      throw bad("entry " + e.name + ": local header out of bounds");
    const uint64_t data_start = local + 30 + u16(data_ + local + 26) + u16(data_ + local + 28);
    if (data_start > size_ || e.compressed_size > size_ - data_start) throw bad("entry " + e.name + ": data out of bounds");
    if (e.method == 8 && e.size > e.compressed_size * kMaxDeflateRatio + 64)
      throw bad("entry " + e.name + " claims " + std::to_string(e.size) + " bytes from " +
                std::to_string(e.compressed_size) + " compressed");
    e.data_offset = data_start;
    entries_.push_back(std::move(e));
    at += 46 + uint64_t{name_len} + extra_len + comment_len;
  }
}

const Entry* Reader::find(const std::string& name) const {
  for (const Entry& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

void Reader::check_crc(const Entry& e, std::span<const uint8_t> data) const {
  if (crc_of(data) != e.crc32)
    throw runtime_error(label_ + ": entry " + e.name + " fails its CRC-32 check",
                        "the file is damaged; copy it again from its source");
}

std::span<const uint8_t> Reader::stored(const Entry& e) const {
  if (e.method != 0) throw runtime_error(label_ + ": entry " + e.name + " is compressed, not stored");
  return {data_ + e.data_offset, static_cast<size_t>(e.size)};
}

std::vector<uint8_t> Reader::read(const Entry& e) const {
  if (e.method == 0) {
    std::span<const uint8_t> s = stored(e);
    check_crc(e, s);
    return {s.begin(), s.end()};
  }
  std::vector<uint8_t> out(static_cast<size_t>(e.size));
  z_stream z{};
  if (inflateInit2(&z, -MAX_WBITS) != Z_OK) throw runtime_error("zlib: inflateInit2 failed");
  const uint8_t* in = data_ + e.data_offset;
  uint64_t in_left = e.compressed_size, out_done = 0;
  int rc = Z_OK;
  while (rc == Z_OK) {
    const uInt in_n = static_cast<uInt>(std::min<uint64_t>(in_left, 1u << 30));
    const uInt out_n = static_cast<uInt>(std::min<uint64_t>(out.size() - out_done, 1u << 30));
    z.next_in = const_cast<Bytef*>(in);
    z.avail_in = in_n;
    z.next_out = out.data() + out_done;
    z.avail_out = out_n;
    rc = inflate(&z, Z_NO_FLUSH);
    in += in_n - z.avail_in;
    in_left -= in_n - z.avail_in;
    out_done += out_n - z.avail_out;
    if (rc == Z_OK && z.avail_in == in_n && z.avail_out == out_n) rc = Z_DATA_ERROR;  // no progress
  }
  inflateEnd(&z);
  if (rc != Z_STREAM_END || out_done != e.size)
    throw runtime_error(label_ + ": entry " + e.name + " does not inflate to its recorded " + std::to_string(e.size) +
                            " bytes",
                        "the file is damaged; copy it again from its source");
  check_crc(e, out);
  return out;
}

void StoredWriter::add(const std::string& name, std::span<const uint8_t> data) {
  constexpr uint64_t k32 = 0xffffffff;
  std::vector<uint8_t> out;  // the local header
  const uint64_t offset = offset_, size = data.size();
  const bool big = size >= k32 || offset >= k32;
  const uint32_t crc = crc_of(data);
  // Local header; its extra field pads the data to the alignment (and carries ZIP64 sizes).
  const uint64_t zip64_len = big ? 20 : 0;
  const uint64_t header_end = offset + 30 + name.size() + zip64_len + 4;
  const uint64_t pad = (kAlign - header_end % kAlign) % kAlign;
  put32(out, kLocalHeader);
  put16(out, big ? 45 : 20);
  put16(out, 0);
  put16(out, 0);
  put32(out, 0);  // time, date
  put32(out, crc);
  put32(out, big ? k32 : size);
  put32(out, big ? k32 : size);
  put16(out, name.size());
  put16(out, zip64_len + 4 + pad);
  out.insert(out.end(), name.begin(), name.end());
  if (big) {
    put16(out, 0x0001);
    put16(out, 16);
    put64(out, size);
    put64(out, size);
  }
  put16(out, 0x4246);  // "FB", PyTorch's padding record
  put16(out, pad);
  out.insert(out.end(), pad, 'Z');
  append_(out);
  append_(data);
  offset_ += out.size() + size;
  ++count_;

  std::vector<uint8_t>& directory = directory_;
  put32(directory, kCentralHeader);
  put16(directory, big ? 45 : 20);
  put16(directory, big ? 45 : 20);
  put16(directory, 0);
  put16(directory, 0);
  put32(directory, 0);
  put32(directory, crc);
  put32(directory, big ? k32 : size);
  put32(directory, big ? k32 : size);
  put16(directory, name.size());
  put16(directory, big ? 28 : 0);
  put16(directory, 0);
  put16(directory, 0);
  put16(directory, 0);
  put32(directory, 0);
  put32(directory, big ? k32 : offset);
  directory.insert(directory.end(), name.begin(), name.end());
  if (big) {
    put16(directory, 0x0001);
    put16(directory, 24);
    put64(directory, size);
    put64(directory, size);
    put64(directory, offset);
  }
}

void StoredWriter::finish() {
  constexpr uint64_t k32 = 0xffffffff;
  const uint64_t dir_offset = offset_, dir_size = directory_.size(), count = count_;
  std::vector<uint8_t> out = std::move(directory_);
  const bool zip64 = dir_offset >= k32 || count >= 0xffff;
  if (zip64) {
    const uint64_t record = dir_offset + out.size();
    put32(out, kZip64EndRecord);
    put64(out, 44);
    put16(out, 45);
    put16(out, 45);
    put32(out, 0);
    put32(out, 0);
    put64(out, count);
    put64(out, count);
    put64(out, dir_size);
    put64(out, dir_offset);
    put32(out, kZip64Locator);
    put32(out, 0);
    put64(out, record);
    put32(out, 1);
  }
  put32(out, kEndRecord);
  put16(out, 0);
  put16(out, 0);
  put16(out, zip64 ? 0xffff : count);
  put16(out, zip64 ? 0xffff : count);
  put32(out, zip64 ? k32 : dir_size);
  put32(out, zip64 ? k32 : dir_offset);
  put16(out, 0);
  append_(out);
  offset_ += out.size();
  directory_.clear();
}

std::vector<uint8_t> write_stored(const std::vector<WriteEntry>& entries) {
  std::vector<uint8_t> out;
  StoredWriter writer([&out](std::span<const uint8_t> bytes) { out.insert(out.end(), bytes.begin(), bytes.end()); });
  for (const WriteEntry& e : entries) writer.add(e.name, e.data);
  writer.finish();
  return out;
}

}  // namespace tessera::zip
