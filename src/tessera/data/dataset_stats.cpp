#include "tessera/data/dataset_stats.h"

#include <algorithm>

#include "tessera/core/error.h"

namespace tessera::data {
namespace {

int64_t nearest_rank(const std::vector<int64_t>& sorted, int percent) {
  const size_t rank = (sorted.size() * static_cast<size_t>(percent) + 99) / 100;  // ceil(p/100 * n)
  return sorted[std::max<size_t>(rank, 1) - 1];
}

}  // namespace

DocumentLengthStats document_length_stats(const IndexedDataset& ds) {
  DocumentLengthStats s;
  s.documents = ds.document_count();
  if (s.documents == 0) return s;
  std::vector<int64_t> lengths(s.documents, 0);
  double total = 0;
  for (uint64_t d = 0; d < s.documents; ++d) {
    for (int64_t q = ds.document_index(d); q < ds.document_index(d + 1); ++q)
      lengths[d] += ds.sequence_length(static_cast<uint64_t>(q));
    total += static_cast<double>(lengths[d]);
    s.empty += lengths[d] == 0;
  }
  std::sort(lengths.begin(), lengths.end());
  s.min = lengths.front();
  s.max = lengths.back();
  s.mean = total / static_cast<double>(s.documents);
  s.p10 = nearest_rank(lengths, 10);
  s.median = nearest_rank(lengths, 50);
  s.p90 = nearest_rank(lengths, 90);
  s.p99 = nearest_rank(lengths, 99);
  return s;
}

std::vector<int32_t> document_tokens(const IndexedDataset& ds, uint64_t index) {
  if (index >= ds.document_count())
    throw usage_error("document " + std::to_string(index) + " does not exist: " + ds.prefix() + " has " +
                          std::to_string(ds.document_count()) + " documents",
                      "give --decode a document number from 0 to " +
                          std::to_string(ds.document_count() ? ds.document_count() - 1 : 0));
  std::vector<int32_t> ids;
  for (int64_t q = ds.document_index(index); q < ds.document_index(index + 1); ++q) {
    const TokenSpan span = ds.get(static_cast<uint64_t>(q));
    for (uint64_t i = 0; i < span.length; ++i) ids.push_back(static_cast<int32_t>(span[i]));
  }
  return ids;
}

}  // namespace tessera::data
