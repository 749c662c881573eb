// Megatron's indexed dataset (megatron/core/datasets/indexed_dataset.py): a `.bin` of token
// ids and a `.idx` index.
//
// IndexedDataset maps both files read-only (zero copy) after validating the index against the
// .bin size (index_format.h). IndexedDatasetBuilder writes them as Megatron's
// IndexedDatasetBuilder does, byte for byte, with three differences that do not change bytes:
// outputs appear under their final names only when finalize() succeeds (temporary names,
// fsync, rename); the per-sequence arrays spill to an unnamed scratch file beyond a bound, so
// memory does not grow with the dataset; add_index() accepts only contiguously stored inputs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessera/core/mapped_file.h"
#include "tessera/data/file_util.h"
#include "tessera/data/index_format.h"

namespace tessera::data {

std::string idx_path(const std::string& prefix);  // prefix + ".idx"
std::string bin_path(const std::string& prefix);  // prefix + ".bin"
// What to pass instead of a dataset prefix that has no .idx: the prefix without a .bin/.idx
// suffix, with the _text_document that preprocess adds, or what a prefix is. Shared by every
// command that takes --data-path, and doctor's data check.
std::string dataset_prefix_hint(const std::string& prefix);

// One sequence's tokens, in the dataset's dtype, pointing into the mapped .bin.
struct TokenSpan {
  const void* data = nullptr;
  uint64_t length = 0;  // tokens
  IndexDType dtype = IndexDType::UInt16;
  int64_t operator[](uint64_t i) const;  // widened
};

class IndexedDataset {
 public:
  // Opens <prefix>.idx and <prefix>.bin and validates them; a tessera::Error names the file
  // and the problem.
  explicit IndexedDataset(const std::string& prefix, IndexParseOptions options = {});

  const std::string& prefix() const { return prefix_; }
  IndexDType dtype() const { return view_.dtype; }
  uint64_t sequence_count() const { return view_.sequence_count; }
  uint64_t document_count() const { return view_.document_count(); }
  int32_t sequence_length(uint64_t i) const { return view_.length(i); }
  int64_t sequence_pointer(uint64_t i) const { return view_.pointer(i); }
  // Document boundaries in sequences: document d is sequences [document_index(d), document_index(d+1)).
  int64_t document_index(uint64_t i) const { return view_.document_index(i); }
  const IndexView& index() const { return view_; }
  uint64_t token_count() const;

  // Megatron's get(idx, offset, length): tokens [offset, offset + length) of sequence i
  // (length defaults to the rest). Out-of-range arguments are an Error.
  TokenSpan get(uint64_t i, uint64_t offset = 0, std::optional<uint64_t> length = std::nullopt) const;
  const MappedFile& bin_file() const { return bin_; }

 private:
  std::string prefix_;
  MappedFile idx_, bin_;
  IndexView view_;
};

// An append-only vector that keeps at most `memory_items` in memory and spills the rest, in
// order, to an unnamed scratch file; read back with for_each_block.
template <class T>
class SpillVector {
 public:
  SpillVector(std::string scratch_dir, size_t memory_items) : dir_(std::move(scratch_dir)), limit_(memory_items) {}
  void push_back(T v) {
    if (mem_.size() >= limit_) spill();
    mem_.push_back(v);
    ++size_;
  }
  uint64_t size() const { return size_; }
  // fn(const T* items, size_t count) over all items in order.
  template <class Fn>
  void for_each_block(Fn&& fn) const {
    if (file_) {
      file_->flush();
      std::vector<T> buf(std::min<uint64_t>(limit_ ? limit_ : 1, 1 << 16));
      uint64_t on_disk = file_->size() / sizeof(T);
      for (uint64_t done = 0; done < on_disk;) {
        size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), on_disk - done));
        file_->read_at(buf.data(), n * sizeof(T), done * sizeof(T));
        fn(buf.data(), n);
        done += n;
      }
    }
    if (!mem_.empty()) fn(mem_.data(), mem_.size());
  }

 private:
  void spill() {
    if (!file_) file_ = std::make_unique<ScratchFile>(dir_);
    file_->write(mem_.data(), mem_.size() * sizeof(T));
    mem_.clear();
  }
  std::string dir_;
  size_t limit_;
  std::vector<T> mem_;
  mutable std::unique_ptr<ScratchFile> file_;
  uint64_t size_ = 0;
};

class IndexedDatasetBuilder {
 public:
  // Writes to `bin_path` (through a temporary name until finalize()).
  IndexedDatasetBuilder(const std::string& bin_path, IndexDType dtype, size_t memory_items = 1 << 20);
  // A builder whose .bin is an unnamed scratch file in `dir`; it cannot be finalized, only
  // appended to a named builder (preprocess --partitions).
  static std::unique_ptr<IndexedDatasetBuilder> scratch(const std::string& dir, IndexDType dtype,
                                                        size_t memory_items = 1 << 18);
  ~IndexedDatasetBuilder();
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;

  IndexDType dtype() const { return dtype_; }
  // add_item: one sequence (the document list is untouched).
  void add_item(std::span<const int32_t> tokens);
  // end_document: closes a document made of the items added since the last one.
  void end_document();
  // add_document: the concatenated tokens of a document's sequences and their lengths. An
  // empty document (no lengths) still adds a boundary.
  void add_document(std::span<const int32_t> tokens, std::span<const int32_t> lengths);
  // add_index: appends the dataset at `prefix` (same dtype; contiguous .bin).
  void add_index(const std::string& prefix);
  // Appends a scratch builder's content (same dtype).
  void append(IndexedDatasetBuilder& other);
  // Writes the .idx and moves both files to their final names: prepare() then, with
  // SIGINT/SIGTERM held back, commit().
  void finalize(const std::string& idx_path);
  // The two halves of finalize(), so that several datasets can be committed together:
  // prepare() writes and syncs both files under temporary names; commit() renames them.
  void prepare(const std::string& idx_path);
  void commit();

  uint64_t sequence_count() const { return lengths_.size(); }
  uint64_t document_count() const { return documents_.size() - 1; }
  uint64_t token_count() const { return tokens_; }

 private:
  IndexedDatasetBuilder(IndexDType dtype, std::string scratch_dir, size_t memory_items);
  void write_tokens(std::span<const int32_t> tokens);
  void write_raw(const void* data, size_t size);

  IndexDType dtype_;
  std::unique_ptr<AtomicFile> bin_;       // named output
  std::unique_ptr<ScratchFile> scratch_;  // or scratch output
  SpillVector<int32_t> lengths_;
  SpillVector<int64_t> documents_;
  uint64_t tokens_ = 0;
  std::vector<unsigned char> convert_;
  std::unique_ptr<AtomicFile> idx_;
  bool finalized_ = false;
};

// Megatron's tools/merge_datasets.py: the datasets at `input_prefixes`, in order, into
// `output_prefix`.bin/.idx. Returns the merged builder's counts through the out-parameters.
// An output that is also an input (the same file, however spelled) is a usage error.
struct MergeResult {
  uint64_t sequences = 0, documents = 0, tokens = 0;
  IndexDType dtype = IndexDType::UInt16;
};
MergeResult merge_datasets(const std::vector<std::string>& input_prefixes, const std::string& output_prefix);

// The dataset prefixes in a folder, as merge_datasets.py finds them: every file with a .bin
// or .idx extension must have its pair; sorted by name.
std::vector<std::string> dataset_prefixes_in(const std::string& dir);

}  // namespace tessera::data
