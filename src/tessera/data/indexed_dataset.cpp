#include "tessera/data/indexed_dataset.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <set>

#include "tessera/core/error.h"

namespace tessera::data {

std::string idx_path(const std::string& prefix) { return prefix + ".idx"; }
std::string bin_path(const std::string& prefix) { return prefix + ".bin"; }

std::string dataset_prefix_hint(const std::string& prefix) {
  for (const std::string ext : {".bin", ".idx"})
    if (prefix.ends_with(ext))
      return "--data-path takes the prefix without " + ext + ": pass " + prefix.substr(0, prefix.size() - ext.size());
  struct stat st{};
  if (::stat(idx_path(prefix + "_text_document").c_str(), &st) == 0)
    return "pass " + prefix + "_text_document: `tessera preprocess` (as Megatron's tools/preprocess_data.py) adds "
           "_text_document to its --output-prefix";
  return "--data-path takes the prefix of a .bin/.idx pair, without the suffix: the --output-prefix of "
         "`tessera preprocess` plus _text_document";
}

namespace {

// The index of `prefix`; a missing one is an Error saying what a prefix is.
MappedFile open_index(const std::string& prefix) {
  struct stat st{};
  if (::stat(idx_path(prefix).c_str(), &st) != 0 && errno == ENOENT)
    throw runtime_error("no dataset at " + prefix + ": " + idx_path(prefix) + " does not exist",
                        dataset_prefix_hint(prefix));
  return MappedFile(idx_path(prefix));
}

}  // namespace

// ---- IndexedDataset ---------------------------------------------------------------------

int64_t TokenSpan::operator[](uint64_t i) const {
  const auto* p = static_cast<const unsigned char*>(data);
  switch (dtype) {
    case IndexDType::UInt8: return p[i];
    case IndexDType::Int8: return static_cast<int8_t>(p[i]);
    case IndexDType::Int16: { int16_t v; std::memcpy(&v, p + 2 * i, 2); return v; }
    case IndexDType::UInt16: { uint16_t v; std::memcpy(&v, p + 2 * i, 2); return v; }
    case IndexDType::Int32: { int32_t v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case IndexDType::Int64: { int64_t v; std::memcpy(&v, p + 8 * i, 8); return v; }
    case IndexDType::Float32: { float v; std::memcpy(&v, p + 4 * i, 4); return static_cast<int64_t>(v); }
    case IndexDType::Float64: { double v; std::memcpy(&v, p + 8 * i, 8); return static_cast<int64_t>(v); }
  }
  return 0;
}

IndexedDataset::IndexedDataset(const std::string& prefix, IndexParseOptions options)
    : prefix_(prefix), idx_(open_index(prefix)), bin_(bin_path(prefix)) {
  view_ = parse_index(idx_.bytes(), bin_.size(), idx_.path(), bin_.path(), options);
}

uint64_t IndexedDataset::token_count() const {
  uint64_t n = 0;
  for (uint64_t i = 0; i < view_.sequence_count; ++i) n += static_cast<uint64_t>(view_.length(i));
  return n;
}

TokenSpan IndexedDataset::get(uint64_t i, uint64_t offset, std::optional<uint64_t> length) const {
  if (i >= view_.sequence_count)
    throw runtime_error(prefix_ + ": sequence " + std::to_string(i) + " does not exist (it has " +
                        std::to_string(view_.sequence_count) + ")");
  uint64_t len = static_cast<uint64_t>(view_.length(i));
  if (offset > len) throw runtime_error(prefix_ + ": offset " + std::to_string(offset) + " is past sequence " + std::to_string(i));
  uint64_t n = length.value_or(len - offset);
  if (n > len - offset)
    throw runtime_error(prefix_ + ": tokens [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
                        ") are past the end of sequence " + std::to_string(i) + " (" + std::to_string(len) + " tokens)");
  size_t item = dtype_size(view_.dtype);
  TokenSpan s;
  s.dtype = view_.dtype;
  s.length = n;
  s.data = bin_.bytes().data() + view_.pointer(i) + offset * item;
  return s;
}

// ---- IndexedDatasetBuilder --------------------------------------------------------------

IndexedDatasetBuilder::IndexedDatasetBuilder(IndexDType dtype, std::string scratch_dir, size_t memory_items)
    : dtype_(dtype), lengths_(scratch_dir, memory_items), documents_(scratch_dir, memory_items) {
  documents_.push_back(0);
}

IndexedDatasetBuilder::IndexedDatasetBuilder(const std::string& bin_path, IndexDType dtype, size_t memory_items)
    : IndexedDatasetBuilder(dtype, parent_dir(bin_path), memory_items) {
  bin_ = std::make_unique<AtomicFile>(bin_path);
}

std::unique_ptr<IndexedDatasetBuilder> IndexedDatasetBuilder::scratch(const std::string& dir, IndexDType dtype,
                                                                      size_t memory_items) {
  std::unique_ptr<IndexedDatasetBuilder> b(new IndexedDatasetBuilder(dtype, dir, memory_items));
  b->scratch_ = std::make_unique<ScratchFile>(dir);
  return b;
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() = default;

void IndexedDatasetBuilder::write_raw(const void* data, size_t size) {
  if (bin_) bin_->write(data, size);
  else scratch_->write(data, size);
}

void IndexedDatasetBuilder::write_tokens(std::span<const int32_t> tokens) {
  if (tokens.empty()) return;
  tokens_ += tokens.size();
  int64_t lo = 0, hi = 0;
  switch (dtype_) {
    case IndexDType::Int32:
      write_raw(tokens.data(), tokens.size() * 4);
      return;
    case IndexDType::UInt16: lo = 0; hi = 65535; break;
    case IndexDType::UInt8: lo = 0; hi = 255; break;
    case IndexDType::Int8: lo = -128; hi = 127; break;
    case IndexDType::Int16: lo = -32768; hi = 32767; break;
    case IndexDType::Int64: lo = std::numeric_limits<int32_t>::min(); hi = std::numeric_limits<int32_t>::max(); break;
    case IndexDType::Float32: case IndexDType::Float64:
      throw usage_error("the builder writes integer token ids; dtype " + std::string(dtype_name(dtype_)) + " is not for tokens");
  }
  size_t item = dtype_size(dtype_);
  convert_.resize(tokens.size() * item);
  unsigned char* out = convert_.data();
  for (size_t i = 0; i < tokens.size(); ++i) {
    int64_t v = tokens[i];
    if (v < lo || v > hi)
      throw runtime_error("token id " + std::to_string(v) + " does not fit the dataset dtype " +
                          std::string(dtype_name(dtype_)),
                          "the tokenizer's vocab_size decides the dtype (uint16 below 65500); check the vocabulary");
    switch (dtype_) {
      case IndexDType::UInt16: { uint16_t x = static_cast<uint16_t>(v); std::memcpy(out + 2 * i, &x, 2); break; }
      case IndexDType::Int16: { int16_t x = static_cast<int16_t>(v); std::memcpy(out + 2 * i, &x, 2); break; }
      case IndexDType::UInt8: case IndexDType::Int8: out[i] = static_cast<unsigned char>(v); break;
      case IndexDType::Int64: std::memcpy(out + 8 * i, &v, 8); break;
      default: break;
    }
  }
  write_raw(convert_.data(), convert_.size());
}

void IndexedDatasetBuilder::add_item(std::span<const int32_t> tokens) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    throw runtime_error("a sequence of " + std::to_string(tokens.size()) + " tokens does not fit the int32 lengths of .idx");
  write_tokens(tokens);
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
}

void IndexedDatasetBuilder::end_document() { documents_.push_back(static_cast<int64_t>(lengths_.size())); }

void IndexedDatasetBuilder::add_document(std::span<const int32_t> tokens, std::span<const int32_t> lengths) {
  uint64_t total = 0;
  for (int32_t l : lengths) {
    TESSERA_CHECK(l >= 0, "negative sequence length");
    total += static_cast<uint64_t>(l);
  }
  TESSERA_CHECK(total == tokens.size(), "document lengths do not add up to its tokens");
  write_tokens(tokens);
  for (int32_t l : lengths) lengths_.push_back(l);
  documents_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetBuilder::add_index(const std::string& prefix) {
  IndexedDataset ds(prefix);
  if (ds.dtype() != dtype_)
    throw runtime_error("cannot merge " + prefix + ": its dtype is " + std::string(dtype_name(ds.dtype())) +
                        ", the output's is " + std::string(dtype_name(dtype_)),
                        "all merged datasets must come from tokenizers of the same vocabulary size class");
  const IndexView& v = ds.index();
  if (!v.contiguous)
    throw runtime_error("cannot merge " + prefix + ": its sequences are not stored one after another in the .bin",
                        "Megatron's merge copies the .bin verbatim and recomputes pointers, which would be wrong here");
  uint64_t offset = lengths_.size();
  uint64_t tokens = 0;
  for (uint64_t i = 0; i < v.sequence_count; ++i) {
    lengths_.push_back(v.length(i));
    tokens += static_cast<uint64_t>(v.length(i));
  }
  for (uint64_t i = 1; i < v.document_index_count; ++i)
    documents_.push_back(static_cast<int64_t>(offset) + v.document_index(i));
  TESSERA_CHECK(bin_ != nullptr, "add_index into a scratch builder");
  copy_file_bytes(ds.bin_file().fd(), 0, v.data_bytes, *bin_, ds.bin_file().path());
  tokens_ += tokens;
}

void IndexedDatasetBuilder::append(IndexedDatasetBuilder& other) {
  TESSERA_CHECK(other.scratch_ != nullptr, "append() takes a scratch builder");
  TESSERA_CHECK(bin_ != nullptr, "append() into a scratch builder");
  TESSERA_CHECK(other.dtype_ == dtype_, "append() of a different dtype");
  uint64_t offset = lengths_.size();
  other.lengths_.for_each_block([&](const int32_t* p, size_t n) {
    for (size_t i = 0; i < n; ++i) lengths_.push_back(p[i]);
  });
  bool first = true;
  other.documents_.for_each_block([&](const int64_t* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if (first) {
        first = false;  // drop the leading 0
        continue;
      }
      documents_.push_back(static_cast<int64_t>(offset) + p[i]);
    }
  });
  other.scratch_->flush();
  copy_file_bytes(other.scratch_->fd(), 0, other.scratch_->size(), *bin_, "a scratch file");
  tokens_ += other.tokens_;
}

void IndexedDatasetBuilder::finalize(const std::string& idx_file) {
  prepare(idx_file);
  SignalBlock block;  // both names appear, or neither
  commit();
}

void IndexedDatasetBuilder::prepare(const std::string& idx_file) {
  TESSERA_CHECK(bin_ != nullptr && !finalized_ && !idx_, "prepare() of a scratch or finalized builder");
  auto idx = std::make_unique<AtomicFile>(idx_file);
  const uint64_t S = lengths_.size(), D = documents_.size();
  unsigned char header[kIndexHeaderSize];
  std::memcpy(header, kIndexMagic, 9);
  std::memcpy(header + 9, &kIndexVersion, 8);
  header[17] = static_cast<unsigned char>(dtype_);
  std::memcpy(header + 18, &S, 8);
  std::memcpy(header + 26, &D, 8);
  idx->write(header, sizeof(header));
  lengths_.for_each_block([&](const int32_t* p, size_t n) { idx->write(p, n * 4); });
  const int64_t item = static_cast<int64_t>(dtype_size(dtype_));
  int64_t pointer = 0;
  std::vector<int64_t> pointers;
  lengths_.for_each_block([&](const int32_t* p, size_t n) {
    pointers.resize(n);
    for (size_t i = 0; i < n; ++i) {
      pointers[i] = pointer;
      pointer += static_cast<int64_t>(p[i]) * item;
    }
    idx->write(pointers.data(), n * 8);
  });
  documents_.for_each_block([&](const int64_t* p, size_t n) { idx->write(p, n * 8); });
  bin_->sync();
  idx->sync();
  idx_ = std::move(idx);
}

void IndexedDatasetBuilder::commit() {
  TESSERA_CHECK(idx_ != nullptr && !finalized_, "commit() before prepare()");
  bin_->commit();
  idx_->commit();
  finalized_ = true;
}

// ---- merge ------------------------------------------------------------------------------

std::vector<std::string> dataset_prefixes_in(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) throw_io_error(dir, "cannot list folder", errno);
  std::set<std::string> bins, idxs;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.size() > 4 && name.ends_with(".bin")) bins.insert(name.substr(0, name.size() - 4));
    if (name.size() > 4 && name.ends_with(".idx")) idxs.insert(name.substr(0, name.size() - 4));
  }
  ::closedir(d);
  std::vector<std::string> out;
  for (const auto& p : bins)
    if (!idxs.count(p)) throw runtime_error(dir + "/" + p + ".bin has no .idx next to it");
  for (const auto& p : idxs) {
    if (!bins.count(p)) throw runtime_error(dir + "/" + p + ".idx has no .bin next to it");
    out.push_back(dir + "/" + p);
  }
  return out;
}

namespace {

// The output must not be one of the inputs: a second merge over a folder would read the
// dataset it is replacing. Compared by file identity, so every spelling of a path counts.
void check_output_is_no_input(const std::vector<std::string>& inputs, const std::string& output_prefix) {
  for (const std::string& out_path : {bin_path(output_prefix), idx_path(output_prefix)}) {
    struct stat out{};
    if (::stat(out_path.c_str(), &out) != 0) continue;
    for (const auto& p : inputs) {
      struct stat in{};
      const std::string in_path = out_path.ends_with(".bin") ? bin_path(p) : idx_path(p);
      if (::stat(in_path.c_str(), &in) == 0 && in.st_dev == out.st_dev && in.st_ino == out.st_ino)
        throw usage_error("--output-prefix " + output_prefix + " is also an input (" + p +
                              "): the merge would read the dataset it replaces",
                          "write the merged dataset to a prefix outside the input folders");
    }
  }
}

}  // namespace

MergeResult merge_datasets(const std::vector<std::string>& inputs, const std::string& output_prefix) {
  if (inputs.empty()) throw usage_error("nothing to merge", "give at least one --input prefix or folder");
  check_output_is_no_input(inputs, output_prefix);
  IndexDType dtype;
  {
    IndexedDataset first(inputs.front());
    dtype = first.dtype();
  }
  IndexedDatasetBuilder builder(bin_path(output_prefix), dtype);
  for (const auto& p : inputs) builder.add_index(p);
  builder.finalize(idx_path(output_prefix));
  return MergeResult{builder.sequence_count(), builder.document_count(), builder.token_count(), dtype};
}

}  // namespace tessera::data
