// What `tessera data inspect` reports about a dataset beyond its counts: the distribution of
// document lengths in tokens, and a document's token ids for decoding.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/data/indexed_dataset.h"

namespace tessera::data {

struct DocumentLengthStats {
  uint64_t documents = 0;
  uint64_t empty = 0;  // documents of no tokens
  int64_t min = 0, max = 0;
  double mean = 0;
  // Nearest-rank percentiles: the smallest length with at least p% of the documents at or below it.
  int64_t p10 = 0, median = 0, p90 = 0, p99 = 0;
};
// Over every document of `dataset` (a document is the sum of its sequences' lengths).
DocumentLengthStats document_length_stats(const IndexedDataset& dataset);

// The token ids of document `index`, its sequences concatenated; an Error names the document
// count when `index` is out of range.
std::vector<int32_t> document_tokens(const IndexedDataset& dataset, uint64_t index);

}  // namespace tessera::data
