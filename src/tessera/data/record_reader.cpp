#include "tessera/data/record_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <simdjson.h>

#include "tessera/core/error.h"
#include "tessera/data/file_util.h"

namespace tessera::data {
namespace {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual size_t read(char* out, size_t n) = 0;  // 0 at end of file; throws on error
  virtual uint64_t consumed() const = 0;
};

class PlainSource final : public ByteSource {
 public:
  explicit PlainSource(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw_io_error(path, "cannot open input", errno);
    struct stat st{};
    if (::fstat(fd_, &st) == 0 && S_ISDIR(st.st_mode)) {
      ::close(fd_);
      fd_ = -1;
      throw_io_error(path, "cannot read input", EISDIR);
    }
    ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
  }
  ~PlainSource() override {
    if (fd_ >= 0) ::close(fd_);
  }
  size_t read(char* out, size_t n) override {
    while (true) {
      ssize_t r = ::read(fd_, out, n);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw_io_error(path_, "cannot read input", errno);
      consumed_ += static_cast<uint64_t>(r);
      return static_cast<size_t>(r);
    }
  }
  uint64_t consumed() const override { return consumed_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t consumed_ = 0;
};

class GzipSource final : public ByteSource {
 public:
  explicit GzipSource(const std::string& path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw_io_error(path, "cannot open input", errno);
    gz_ = gzdopen(fd, "rb");
    if (!gz_) {
      ::close(fd);
      throw runtime_error("cannot open " + path + " as gzip");
    }
    gzbuffer(gz_, 1 << 18);
  }
  ~GzipSource() override {
    if (gz_) gzclose(gz_);
  }
  size_t read(char* out, size_t n) override {
    int r = gzread(gz_, out, static_cast<unsigned>(std::min<size_t>(n, 1u << 30)));
    if (r < 0) {
      int code = 0;
      const char* msg = gzerror(gz_, &code);
      throw runtime_error("cannot decompress " + path_ + ": " + (msg ? msg : "gzip error"),
                          "the .gz file is damaged or truncated");
    }
    return static_cast<size_t>(r);
  }
  uint64_t consumed() const override {
    z_off_t off = gzoffset(gz_);
    return off > 0 ? static_cast<uint64_t>(off) : 0;
  }

 private:
  std::string path_;
  gzFile gz_ = nullptr;
};

enum class Mode { Unknown, Lines, Array };
enum class ArrayState { BeforeArray, FirstElement, ExpectElement, InElement, AfterElement, AfterArray };

}  // namespace

size_t record_padding() { return simdjson::SIMDJSON_PADDING; }

struct RecordReader::Impl {
  std::vector<std::string> files;
  size_t chunk_bytes;
  size_t read_bytes;
  std::function<void(const std::string&)> on_open;

  size_t file_index = 0;
  std::unique_ptr<ByteSource> source;
  uint64_t consumed_before = 0;  // bytes of the files already closed
  bool eof = false;              // of the current file
  std::string buf;
  size_t pos = 0, end = 0;       // unconsumed bytes are buf[pos, end)
  size_t scanned = 0;            // Lines: no newline in buf[pos, scanned)
  Mode mode = Mode::Unknown;
  uint64_t line = 1, column = 1;  // position of buf[pos] (Array mode; Lines mode counts lines)
  uint64_t record_index = 0;
  uint64_t sequence = 0;
  bool finished = false;

  // Array scanning state.
  ArrayState state = ArrayState::BeforeArray;
  size_t elem_start = 0;
  uint64_t elem_line = 0, elem_column = 0;
  int depth = 0;
  bool in_string = false, escape = false;

  uint64_t consumed() const { return consumed_before + (source ? source->consumed() : 0); }

  void open_file() {
    const std::string& path = files[file_index];
    if (on_open) on_open(path);
    if (path.size() > 3 && path.ends_with(".gz")) source = std::make_unique<GzipSource>(path);
    else source = std::make_unique<PlainSource>(path);
    eof = false;
    pos = end = scanned = 0;
    mode = Mode::Unknown;
    line = column = 1;
    state = ArrayState::BeforeArray;
  }

  void close_file() {
    consumed_before += source->consumed();
    source.reset();
    ++file_index;
  }

  // Reads more bytes, keeping buf[keep, end) (moved to the front). Returns false at EOF.
  bool fill(size_t keep) {
    if (eof) return false;
    if (keep > 0) {
      std::memmove(buf.data(), buf.data() + keep, end - keep);
      end -= keep;
      pos -= keep;
      scanned -= std::min(scanned, keep);
      if (state == ArrayState::InElement) elem_start -= keep;
    }
    if (buf.size() < end + read_bytes) buf.resize(std::max(buf.size() * 2, end + read_bytes));
    size_t n = source->read(buf.data() + end, std::min(buf.size() - end, read_bytes));
    if (n == 0) {
      eof = true;
      return false;
    }
    end += n;
    return true;
  }

  void add(Chunk& chunk, size_t from, size_t size, uint64_t rline, uint64_t rcol, bool newline) {
    Record r;
    r.offset = chunk.data.size();
    r.size = size;
    r.index = record_index++;
    r.line = rline;
    r.column = rcol;
    r.file = static_cast<uint32_t>(file_index);
    r.newline = newline;
    r.array_element = mode == Mode::Array;
    chunk.data.append(buf.data() + from, size);
    chunk.records.push_back(r);
  }

  [[noreturn]] void array_error(uint64_t l, uint64_t c, const std::string& msg) {
    throw runtime_error(files[file_index] + ":" + std::to_string(l) + ":" + std::to_string(c) + ": " + msg,
                        "the input must be JSON Lines (one object per line) or one JSON array of objects");
  }

  // Returns true when the current file is exhausted.
  bool read_lines(Chunk& chunk) {
    while (chunk.data.size() < chunk_bytes) {
      size_t from = std::max(pos, scanned);
      const char* nl = static_cast<const char*>(std::memchr(buf.data() + from, '\n', end - from));
      if (nl) {
        size_t at = static_cast<size_t>(nl - buf.data());
        add(chunk, pos, at - pos, line, 1, true);
        ++line;
        pos = at + 1;
        continue;
      }
      scanned = end;
      if (!fill(pos)) {
        if (end > pos) add(chunk, pos, end - pos, line, 1, false);
        pos = end;
        return true;
      }
    }
    return false;
  }

  void step_position(unsigned char c) {
    if (c == '\n') {
      ++line;
      column = 1;
    } else if ((c & 0xC0) != 0x80) {
      ++column;
    }
  }

  static bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

  bool read_array(Chunk& chunk) {
    while (chunk.data.size() < chunk_bytes) {
      if (pos == end) {
        if (!fill(state == ArrayState::InElement ? elem_start : pos)) {
          if (state == ArrayState::AfterArray) return true;
          if (state == ArrayState::InElement)
            array_error(elem_line, elem_column, "the file ends inside this element of the JSON array");
          array_error(line, column, "the file ends before the JSON array is closed with ']'");
        }
        continue;
      }
      unsigned char c = static_cast<unsigned char>(buf[pos]);
      switch (state) {
        case ArrayState::BeforeArray:
          if (c == '[') state = ArrayState::FirstElement;
          else if (!is_ws(c)) array_error(line, column, "expected '[' to open a JSON array");
          break;
        case ArrayState::FirstElement:
        case ArrayState::ExpectElement:
          if (is_ws(c)) break;
          if (c == ']') {
            if (state == ArrayState::ExpectElement) array_error(line, column, "a ',' is followed by ']' (trailing comma)");
            state = ArrayState::AfterArray;
            break;
          }
          if (c == ',') array_error(line, column, "expected an element, found ','");
          state = ArrayState::InElement;
          elem_start = pos;
          elem_line = line;
          elem_column = column;
          depth = (c == '{' || c == '[') ? 1 : 0;
          in_string = c == '"';
          escape = false;
          break;
        case ArrayState::InElement:
          if (in_string) {
            if (escape) escape = false;
            else if (c == '\\') escape = true;
            else if (c == '"') {
              in_string = false;
              if (depth == 0) {
                add(chunk, elem_start, pos + 1 - elem_start, elem_line, elem_column, false);
                state = ArrayState::AfterElement;
              }
            }
          } else if (c == '"') {
            in_string = true;
          } else if (c == '{' || c == '[') {
            ++depth;
          } else if (c == '}' || c == ']') {
            if (depth == 0) {  // a scalar element ended by the array's ']'
              add(chunk, elem_start, pos - elem_start, elem_line, elem_column, false);
              state = ArrayState::AfterElement;
              continue;  // handle ']' again in AfterElement
            }
            if (--depth == 0) {
              add(chunk, elem_start, pos + 1 - elem_start, elem_line, elem_column, false);
              state = ArrayState::AfterElement;
            }
          } else if (depth == 0 && (c == ',' || is_ws(c))) {
            add(chunk, elem_start, pos - elem_start, elem_line, elem_column, false);
            state = ArrayState::AfterElement;
            continue;
          }
          break;
        case ArrayState::AfterElement:
          if (c == ',') state = ArrayState::ExpectElement;
          else if (c == ']') state = ArrayState::AfterArray;
          else if (!is_ws(c)) array_error(line, column, "expected ',' or ']' after an element of the JSON array");
          break;
        case ArrayState::AfterArray:
          if (!is_ws(c)) array_error(line, column, "unexpected data after the JSON array");
          break;
      }
      step_position(c);
      ++pos;
    }
    return false;
  }

  // Decides the current file's mode from its first non-blank byte; false for a file with
  // nothing but blanks (no records).
  bool detect_mode() {
    while (end < 3 && fill(0)) {
    }
    if (end == 0) return false;
    if (end >= 3 && std::memcmp(buf.data(), "\xEF\xBB\xBF", 3) == 0) pos = 3;  // UTF-8 BOM
    size_t scan = pos;
    while (true) {
      while (scan < end && is_ws(static_cast<unsigned char>(buf[scan]))) ++scan;
      if (scan < end) break;
      size_t shift = pos;
      if (!fill(pos)) return false;
      scan -= shift;
    }
    mode = buf[scan] == '[' ? Mode::Array : Mode::Lines;
    return true;
  }
};

RecordReader::RecordReader(std::vector<std::string> files, size_t chunk_bytes,
                           std::function<void(const std::string&)> on_open, size_t read_bytes)
    : impl_(std::make_unique<Impl>()), files_(std::move(files)) {
  impl_->files = files_;
  impl_->chunk_bytes = std::max<size_t>(chunk_bytes, 1);
  impl_->read_bytes = std::max<size_t>(read_bytes, 1);
  impl_->on_open = std::move(on_open);
  for (const auto& f : files_) {
    struct stat st{};
    if (::stat(f.c_str(), &st) != 0) throw_io_error(f, "cannot open input", errno);
    if (S_ISDIR(st.st_mode)) throw_io_error(f, "cannot read input", EISDIR);
    if (::access(f.c_str(), R_OK) != 0) throw_io_error(f, "cannot read input", errno);
    total_bytes_ += static_cast<uint64_t>(st.st_size);
  }
}

RecordReader::~RecordReader() = default;

void RecordReader::next(Chunk& chunk) {
  Impl& s = *impl_;
  chunk.data.clear();
  chunk.records.clear();
  chunk.last = false;
  chunk.error = nullptr;
  chunk.sequence = s.sequence++;
  try {
    while (!s.finished && chunk.data.size() < s.chunk_bytes) {
      if (!s.source) {
        if (s.file_index >= s.files.size()) {
          s.finished = true;
          break;
        }
        s.open_file();
        if (!s.detect_mode()) {
          s.close_file();
          continue;
        }
      }
      bool done = s.mode == Mode::Lines ? s.read_lines(chunk) : s.read_array(chunk);
      if (done) s.close_file();
    }
  } catch (...) {
    chunk.error = std::current_exception();
    s.finished = true;
  }
  chunk.consumed_bytes = s.consumed();
  chunk.last = s.finished;
  chunk.data.append(record_padding(), ' ');
}

}  // namespace tessera::data
