#include "tessera/data/preprocess.h"

#include "tessera/core/python_format.h"

#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <simdjson.h>
#include <thread>

#include "tessera/core/error.h"
#include "tessera/data/file_util.h"
#include "tessera/data/indexed_dataset.h"
#include "tessera/data/json_util.h"
#include "tessera/data/record_reader.h"
#include "tessera/data/text_template.h"
#include "tessera/data/utf8.h"

namespace tessera::data {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

const char* kRecordHint = "fix the record, or pass --skip-bad-records to skip bad records and count them";
// Alpaca-style records (instruction/input/output) have no "text": they need a template, and
// skipping them would skip every record.
const char* kAlpacaHint =
    "these look like Alpaca records: build each document from their fields with "
    "--text-template '{instruction}\\n{input}\\n{output}' (docs/data.md)";

// Tokens of one chunk, per output key, with per-record boundaries.
struct ChunkResult {
  struct KeyTokens {
    std::vector<int32_t> tokens;
    std::vector<int32_t> lengths;
  };
  std::vector<KeyTokens> keys;
  std::vector<uint64_t> token_end, length_end;  // [record * keys + k]: end offsets
  std::vector<uint64_t> chars;                  // per record
  std::vector<int32_t> error_of;                // per record: -1, or index into errors
  std::vector<std::pair<std::string, std::string>> errors;  // message, hint
  std::exception_ptr fatal;                     // a failure that is not the record's fault
};

// One value of a record as the workers need it, from simdjson or (slow path) nlohmann.
struct FieldValue {
  enum Kind { Missing, String, StringList, Other } kind = Missing;
  std::vector<std::string_view> strings;  // String: one; StringList: the sentences
  std::string type;                       // for Other: what it is
};

std::string json_type_name(simdjson::dom::element_type t) {
  switch (t) {
    case simdjson::dom::element_type::ARRAY: return "a list";
    case simdjson::dom::element_type::OBJECT: return "an object";
    case simdjson::dom::element_type::INT64:
    case simdjson::dom::element_type::UINT64:
    case simdjson::dom::element_type::DOUBLE: return "a number";
    case simdjson::dom::element_type::STRING: return "a string";
    case simdjson::dom::element_type::BOOL: return "a boolean";
    case simdjson::dom::element_type::NULL_VALUE: return "null";
  }
  return "a value";
}

std::string json_type_name(const nlohmann::json& j) {
  if (j.is_array()) return "a list";
  if (j.is_object()) return "an object";
  if (j.is_number()) return "a number";
  if (j.is_string()) return "a string";
  if (j.is_boolean()) return "a boolean";
  return "null";
}

class RecordProcessor {
 public:
  RecordProcessor(const PreprocessOptions& o, std::unique_ptr<Tokenizer> tokenizer, const TextTemplate* tmpl,
                  const std::vector<std::string>& files)
      : o_(o), tokenizer_(std::move(tokenizer)), tmpl_(tmpl), files_(files) {
    wanted_ = tmpl ? tmpl->fields() : o.json_keys;
    nkeys_ = tmpl ? 1 : o.json_keys.size();
    values_.resize(wanted_.size());
    for (size_t k = 0; k < nkeys_; ++k)
      document_names_.push_back(tmpl ? "the templated text" : "\"" + wanted_[k] + "\"");
    token_mark_.resize(nkeys_);
    length_mark_.resize(nkeys_);
  }

  void process(const Chunk& chunk, ChunkResult& r) {
    r.keys.assign(nkeys_, {});
    for (auto& key : r.keys) key.tokens.reserve(chunk.data.size() / 3);  // English BPE: ~0.27 tokens a byte
    const size_t n = chunk.records.size();
    r.token_end.resize(n * nkeys_);
    r.length_end.resize(n * nkeys_);
    r.chars.resize(n);
    r.error_of.assign(n, -1);
    for (size_t i = 0; i < n; ++i) {
      const Record& rec = chunk.records[i];
      std::string_view text(chunk.data.data() + rec.offset, rec.size);
      uint64_t chars = utf8::count_code_points(text);
      if (rec.newline) chars += text.ends_with('\r') ? 0 : 1;  // universal newlines: "\r\n" is "\n"
      r.chars[i] = chars;
      for (size_t k = 0; k < nkeys_; ++k) {
        token_mark_[k] = r.keys[k].tokens.size();
        length_mark_[k] = r.keys[k].lengths.size();
      }
      try {
        process_record(rec, text, r);
      } catch (const Error& e) {
        for (size_t k = 0; k < nkeys_; ++k) {  // drop what the record had produced
          r.keys[k].tokens.resize(token_mark_[k]);
          r.keys[k].lengths.resize(length_mark_[k]);
        }
        r.error_of[i] = static_cast<int32_t>(r.errors.size());
        r.errors.emplace_back(e.what(), e.hint());
      }
      for (size_t k = 0; k < nkeys_; ++k) {
        r.token_end[i * nkeys_ + k] = r.keys[k].tokens.size();
        r.length_end[i * nkeys_ + k] = r.keys[k].lengths.size();
      }
    }
  }

 private:
  std::string where(const Record& rec, std::string_view text, std::optional<size_t> offset) const {
    std::string s = files_[rec.file] + ":";
    if (offset) {
      TextPosition p = advance_position(text, *offset, TextPosition{rec.line, rec.column});
      return s + std::to_string(p.line) + ":" + std::to_string(p.column);
    }
    s += std::to_string(rec.line);
    if (rec.array_element) s += ":" + std::to_string(rec.column);
    return s;
  }

  [[noreturn]] void fail(const Record& rec, std::string_view text, std::optional<size_t> offset,
                         const std::string& msg, const char* hint = kRecordHint) const {
    throw runtime_error(where(rec, text, offset) + ": " + msg, hint);
  }

  void process_record(const Record& rec, std::string_view text, ChunkResult& r) {
    if (text.find_first_not_of(" \t\r\n") == std::string_view::npos)
      fail(rec, text, std::nullopt, "empty line; expected a JSON object");
    simdjson::dom::element root;
    auto err = parser_.parse(reinterpret_cast<const uint8_t*>(text.data()), text.size(), false).get(root);
    if (err) {
      if (err == simdjson::UTF8_ERROR) {
        size_t bad = utf8::find_invalid(text);
        fail(rec, text, bad == utf8::npos ? 0 : bad, "invalid UTF-8");
      }
      JsonSyntaxError e;
      if (describe_json_error(text, e)) fail(rec, text, e.offset, "malformed JSON: " + e.message);
      // simdjson refuses what nlohmann accepts (e.g. integers beyond 64 bits): slow path.
      nlohmann::json j = nlohmann::json::parse(text.begin(), text.end());
      if (!j.is_object()) fail(rec, text, std::nullopt, "expected a JSON object, found " + json_type_name(j));
      for (auto& v : values_) v = FieldValue{};
      for (auto it = j.begin(); it != j.end(); ++it) {
        auto w = std::find(wanted_.begin(), wanted_.end(), it.key());
        if (w == wanted_.end()) continue;
        FieldValue& fv = values_[static_cast<size_t>(w - wanted_.begin())];
        fv = FieldValue{};
        classify(*it, fv);
      }
      emit(rec, text, r, [&] { return key_list(j); });
      return;
    }
    simdjson::dom::object obj;
    if (root.get_object().get(obj)) fail(rec, text, std::nullopt, "expected a JSON object, found " + json_type_name(root.type()));
    for (auto& v : values_) v = FieldValue{};
    for (auto field : obj) {  // every occurrence: the last duplicate wins, as in json.loads
      auto w = std::find(wanted_.begin(), wanted_.end(), field.key);
      if (w == wanted_.end()) continue;
      FieldValue& fv = values_[static_cast<size_t>(w - wanted_.begin())];
      fv = FieldValue{};
      classify(field.value, fv);
    }
    emit(rec, text, r, [&] {
      std::string keys;
      int n = 0;
      for (auto field : obj) {
        if (n++ == 8) { keys += ", ..."; break; }
        keys += (keys.empty() ? "\"" : ", \"") + std::string(field.key) + "\"";
      }
      return keys;
    });
  }

  static void classify(simdjson::dom::element v, FieldValue& fv) {
    std::string_view s;
    if (!v.get_string().get(s)) {
      fv.kind = FieldValue::String;
      fv.strings.push_back(s);
      return;
    }
    simdjson::dom::array arr;
    if (!v.get_array().get(arr)) {
      fv.kind = FieldValue::StringList;
      for (auto item : arr) {
        if (item.get_string().get(s)) {
          fv.kind = FieldValue::Other;
          fv.type = "a list that contains " + json_type_name(item.type());
          return;
        }
        fv.strings.push_back(s);
      }
      return;
    }
    fv.kind = FieldValue::Other;
    fv.type = json_type_name(v.type());
  }

  static void classify(const nlohmann::json& v, FieldValue& fv) {
    if (v.is_string()) {
      fv.kind = FieldValue::String;
      fv.strings.push_back(v.get_ref<const std::string&>());
      return;
    }
    if (v.is_array()) {
      fv.kind = FieldValue::StringList;
      for (const auto& item : v) {
        if (!item.is_string()) {
          fv.kind = FieldValue::Other;
          fv.type = "a list that contains " + json_type_name(item);
          return;
        }
        fv.strings.push_back(item.get_ref<const std::string&>());
      }
      return;
    }
    fv.kind = FieldValue::Other;
    fv.type = json_type_name(v);
  }

  static std::string key_list(const nlohmann::json& j) {
    std::string keys;
    int n = 0;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (n++ == 8) { keys += ", ..."; break; }
      keys += (keys.empty() ? "\"" : ", \"") + it.key() + "\"";
    }
    return keys;
  }

  template <class KeyList>
  void emit(const Record& rec, std::string_view text, ChunkResult& r, KeyList&& key_list) {
    for (size_t i = 0; i < wanted_.size(); ++i) {
      const FieldValue& fv = values_[i];
      const char* what = tmpl_ ? "field" : "key";
      if (fv.kind == FieldValue::Missing) {
        std::string keys = key_list();
        const bool alpaca = !tmpl_ && keys.find("\"instruction\"") != std::string::npos &&
                            keys.find("\"output\"") != std::string::npos;
        fail(rec, text, std::nullopt,
             std::string("record has no ") + what + " \"" + wanted_[i] + "\"" +
                 (keys.empty() ? " (it is empty)" : " (its keys: " + keys + ")"),
             alpaca ? kAlpacaHint : kRecordHint);
      }
      if (fv.kind == FieldValue::Other || (tmpl_ && fv.kind != FieldValue::String))
        fail(rec, text, std::nullopt, "the value of \"" + wanted_[i] + "\" is " +
                                          (fv.kind == FieldValue::StringList ? std::string("a list") : fv.type) +
                                          ", not a string");
    }
    if (tmpl_) {
      views_.clear();
      for (const auto& fv : values_) views_.push_back(fv.strings[0]);
      tmpl_->render(views_, rendered_);
      sentences_.assign(1, rendered_);
      tokenize_document(rec, text, document_names_[0], sentences_, r.keys[0]);
      return;
    }
    for (size_t k = 0; k < nkeys_; ++k)
      tokenize_document(rec, text, document_names_[k], values_[k].strings, r.keys[k]);
  }

  // Megatron's Encoder.encode for one key: each sentence tokenized on its own, empty results
  // dropped, EOD appended to a non-empty document (counted in its last sentence).
  void tokenize_document(const Record& rec, std::string_view text, const std::string& what,
                         const std::vector<std::string_view>& sentences, ChunkResult::KeyTokens& out) {
    size_t doc_start = out.tokens.size();
    for (std::string_view s : sentences) {
      size_t before = out.tokens.size();
      try {
        tokenizer_->encode(s, out.tokens);
      } catch (const Error& e) {
        fail(rec, text, std::nullopt, "cannot tokenize " + what + ": " + e.what());
      }
      size_t n = out.tokens.size() - before;
      if (n > static_cast<size_t>(INT32_MAX)) fail(rec, text, std::nullopt, what + " has more than 2^31-1 tokens");
      if (n > 0) out.lengths.push_back(static_cast<int32_t>(n));
    }
    if (o_.append_eod && out.tokens.size() > doc_start) {
      out.tokens.push_back(tokenizer_->eod());
      out.lengths.back() += 1;
    }
  }

  const PreprocessOptions& o_;
  std::unique_ptr<Tokenizer> tokenizer_;
  const TextTemplate* tmpl_;
  const std::vector<std::string>& files_;
  std::vector<std::string> wanted_;
  size_t nkeys_;
  std::vector<std::string> document_names_;     // per output key, for errors: "\"text\""
  std::vector<size_t> token_mark_, length_mark_;  // per output key: where the record's output starts
  std::vector<FieldValue> values_;
  std::vector<std::string_view> views_, sentences_;
  std::string rendered_;
  simdjson::dom::parser parser_;
};

// The terminal progress bar (stderr only, when it is a terminal).
class ProgressBar {
 public:
  ProgressBar(FILE* f, bool enabled, uint64_t total) : f_(f), enabled_(enabled && total > 0), total_(total) {}
  void update(uint64_t done, bool force = false) {
    if (!enabled_) return;
    auto now = Clock::now();
    if (!force && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    double elapsed = std::chrono::duration<double>(now - start_).count();
    double frac = std::min(1.0, double(done) / double(total_));
    const int width = 30;
    int filled = static_cast<int>(frac * width);
    std::string bar(filled, '#');
    bar.append(width - filled, '.');
    double rate = elapsed > 0 ? done / elapsed : 0;
    std::string eta = "--:--";
    if (rate > 0) {
      long s = std::lround((total_ - std::min(done, total_)) / rate);
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
      eta = buf;
    }
    std::fprintf(f_, "\r\033[K[%s] %5.1f%% %8.1f MB/s  ETA %s", bar.c_str(), frac * 100, rate / 1e6, eta.c_str());
    std::fflush(f_);
    shown_ = true;
  }
  void clear() {
    if (!shown_) return;
    std::fprintf(f_, "\r\033[K");
    std::fflush(f_);
    shown_ = false;
    last_ = Clock::time_point{};
  }

 private:
  FILE* f_;
  bool enabled_;
  uint64_t total_;
  Clock::time_point start_ = Clock::now(), last_{};
  bool shown_ = false;
};

// The threads and queues. The reader keeps at most max_in_flight chunks between itself and the
// writer; workers take chunks in any order; the writer takes results in sequence order.
class Pipeline {
 public:
  Pipeline(RecordReader& reader, size_t max_in_flight) : reader_(reader), max_in_flight_(max_in_flight) {}
  ~Pipeline() { stop(); }

  void start(std::vector<std::unique_ptr<RecordProcessor>> processors) {
    processors_ = std::move(processors);
    threads_.emplace_back([this] { read_loop(); });
    for (auto& p : processors_) threads_.emplace_back([this, proc = p.get()] { work_loop(*proc); });
  }

  struct Done {
    std::unique_ptr<Chunk> chunk;
    ChunkResult result;
  };

  // The next chunk in input order (blocks).
  std::unique_ptr<Done> next() {
    std::unique_lock lock(m_);
    cv_done_.wait(lock, [&] { return done_.count(next_) > 0; });
    auto it = done_.find(next_);
    auto d = std::move(it->second);
    done_.erase(it);
    ++next_;
    --in_flight_;
    cv_slot_.notify_one();
    return d;
  }

  void stop() {
    {
      std::lock_guard lock(m_);
      stopping_ = true;
    }
    cv_slot_.notify_all();
    cv_work_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }

 private:
  void read_loop() {
    while (true) {
      {
        std::unique_lock lock(m_);
        cv_slot_.wait(lock, [&] { return stopping_ || in_flight_ < max_in_flight_; });
        if (stopping_) return;
        ++in_flight_;
      }
      auto chunk = std::make_unique<Chunk>();
      reader_.next(*chunk);  // never throws: failures travel in chunk->error
      bool last = chunk->last;
      {
        std::lock_guard lock(m_);
        work_.push_back(std::move(chunk));
        if (last) reader_done_ = true;
      }
      cv_work_.notify_one();
      if (last) {
        cv_work_.notify_all();
        return;
      }
    }
  }

  void work_loop(RecordProcessor& proc) {
    while (true) {
      std::unique_ptr<Chunk> chunk;
      {
        std::unique_lock lock(m_);
        cv_work_.wait(lock, [&] { return stopping_ || !work_.empty() || reader_done_; });
        if (stopping_ || work_.empty()) return;
        chunk = std::move(work_.front());
        work_.pop_front();
      }
      auto d = std::make_unique<Done>();
      try {
        proc.process(*chunk, d->result);
      } catch (...) {
        d->result.fatal = std::current_exception();
      }
      d->chunk = std::move(chunk);
      {
        std::lock_guard lock(m_);
        uint64_t seq = d->chunk->sequence;
        done_[seq] = std::move(d);
      }
      cv_done_.notify_all();
    }
  }

  RecordReader& reader_;
  const size_t max_in_flight_;
  std::vector<std::unique_ptr<RecordProcessor>> processors_;
  std::vector<std::thread> threads_;
  std::mutex m_;
  std::condition_variable cv_slot_, cv_work_, cv_done_;
  std::deque<std::unique_ptr<Chunk>> work_;
  std::map<uint64_t, std::unique_ptr<Done>> done_;
  size_t in_flight_ = 0;
  uint64_t next_ = 0;
  bool stopping_ = false, reader_done_ = false;
};

// The output datasets, one per --json-keys key. With --partitions (and without
// --keep-sequential-samples) records go round-robin into scratch partitions, which commit()
// merges in partition order, as Megatron's add_index does.
class OutputDatasets {
 public:
  OutputDatasets(const PreprocessOptions& o, IndexDType dtype, std::vector<PreprocessOutput>& outputs)
      : nparts_(o.partitions > 1 && !o.keep_sequential_samples ? static_cast<size_t>(o.partitions) : 1),
        parts_(o.json_keys.size()) {
    for (size_t k = 0; k < o.json_keys.size(); ++k) {
      std::string prefix = o.output_prefix + "_" + o.json_keys[k] + "_document";
      finals_.push_back(std::make_unique<IndexedDatasetBuilder>(bin_path(prefix), dtype));
      outputs.push_back(PreprocessOutput{o.json_keys[k], prefix});
      if (nparts_ > 1)
        for (size_t p = 0; p < nparts_; ++p)
          parts_[k].push_back(IndexedDatasetBuilder::scratch(parent_dir(prefix), dtype));
    }
  }

  // Where the documents of key `k` of record `record_index` go.
  IndexedDatasetBuilder& builder(size_t k, uint64_t record_index) {
    return nparts_ > 1 ? *parts_[k][record_index % nparts_] : *finals_[k];
  }

  // Merges the partitions, writes every output under its final name (all of them, or none on
  // SIGINT/SIGTERM) and counts what each holds.
  void commit(std::vector<PreprocessOutput>& outputs) {
    for (size_t k = 0; k < finals_.size(); ++k) {
      for (auto& part : parts_[k]) finals_[k]->append(*part);
      parts_[k].clear();
    }
    for (size_t k = 0; k < finals_.size(); ++k) finals_[k]->prepare(idx_path(outputs[k].prefix));
    {
      SignalBlock block;
      for (auto& f : finals_) f->commit();
    }
    for (size_t k = 0; k < finals_.size(); ++k) {
      outputs[k].sequences = finals_[k]->sequence_count();
      outputs[k].documents = finals_[k]->document_count();
      outputs[k].tokens = finals_[k]->token_count();
    }
  }

 private:
  const size_t nparts_;
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> finals_;
  std::vector<std::vector<std::unique_ptr<IndexedDatasetBuilder>>> parts_;  // [key][partition]
};

// Takes the workers' results in input order: adds each good record's documents to the outputs,
// skips (with --skip-bad-records) or throws for a bad one, and logs progress as Megatron does.
class ResultWriter {
 public:
  ResultWriter(const PreprocessOptions& o, OutputDatasets& outputs, ProgressBar& bar, PreprocessResult& result,
               Clock::time_point start)
      : o_(o), nkeys_(o.json_keys.size()), outputs_(outputs), bar_(bar), result_(result), start_(start) {}

  void write(const Chunk& c, const ChunkResult& r) {
    for (size_t i = 0; i < c.records.size(); ++i) {
      ++result_.records;
      if (r.error_of[i] >= 0) {
        skip_bad_record(r.errors[static_cast<size_t>(r.error_of[i])]);
        continue;
      }
      add_documents(i, c.records[i].index, r);
      ++result_.documents;
      result_.chars += r.chars[i];
      if (result_.documents % static_cast<uint64_t>(o_.log_interval) == 0) log_progress();
    }
  }

  // An empty dataset is no result: nothing is written when every record was bad.
  void check_some_documents() const {
    if (result_.documents == 0 && result_.skipped > 0)
      throw runtime_error("all " + std::to_string(result_.skipped) +
                              " records are bad, so there is no dataset to write; the first: " + first_bad_.first,
                          first_bad_.second);
  }

 private:
  // `error` is the record's message and hint.
  void skip_bad_record(const std::pair<std::string, std::string>& error) {
    const auto& [msg, hint] = error;
    if (!o_.skip_bad_records) throw runtime_error(msg, hint);
    if (result_.skipped == 0) first_bad_ = error;
    ++result_.skipped;
    if (warned_ < 10) {
      bar_.clear();
      std::fprintf(o_.err, "warning: skipped bad record: %s\n", msg.c_str());
    } else if (warned_ == 10) {
      bar_.clear();
      std::fprintf(o_.err, "warning: more bad records skipped; not showing them (the total follows at the end)\n");
    }
    ++warned_;
  }

  // Record i of the chunk: its document per key, the slices [end of record i-1, end of record i).
  void add_documents(size_t i, uint64_t record_index, const ChunkResult& r) {
    for (size_t k = 0; k < nkeys_; ++k) {
      const size_t at = i * nkeys_ + k;
      const uint64_t t0 = i == 0 ? 0 : r.token_end[at - nkeys_], t1 = r.token_end[at];
      const uint64_t l0 = i == 0 ? 0 : r.length_end[at - nkeys_], l1 = r.length_end[at];
      const auto& keyed = r.keys[k];
      outputs_.builder(k, record_index)
          .add_document(std::span<const int32_t>(keyed.tokens.data() + t0, t1 - t0),
                        std::span<const int32_t>(keyed.lengths.data() + l0, l1 - l0));
    }
  }

  void log_progress() {
    const double elapsed = seconds_since(start_);
    bar_.clear();
    std::fprintf(o_.err, "Processed %llu documents (%s docs/s, %s MB/s).\n",
                 static_cast<unsigned long long>(result_.documents),
                 python_float_repr(double(result_.documents) / elapsed).c_str(),
                 python_float_repr(double(result_.chars) / elapsed / 1024 / 1024).c_str());
    std::fflush(o_.err);
  }

  const PreprocessOptions& o_;
  const size_t nkeys_;
  OutputDatasets& outputs_;
  ProgressBar& bar_;
  PreprocessResult& result_;
  const Clock::time_point start_;
  uint64_t warned_ = 0;
  std::pair<std::string, std::string> first_bad_;  // message and hint of the first skipped record
};

void validate(const PreprocessOptions& o) {
  if (o.inputs.empty()) throw usage_error("--input is required", "give a JSONL or JSON file (or a glob)");
  if (o.output_prefix.empty()) throw usage_error("--output-prefix is required", "e.g. --output-prefix data/my-gpt2");
  if (o.json_keys.empty()) throw usage_error("--json-keys needs at least one key");
  for (size_t i = 0; i < o.json_keys.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (o.json_keys[i] == o.json_keys[j])
        throw usage_error("--json-keys names \"" + o.json_keys[i] + "\" twice");
  if (o.text_template && o.json_keys.size() != 1)
    throw usage_error("--text-template makes one document per record; give at most one --json-keys (it names the output)",
                      "e.g. --json-keys text gives <prefix>_text_document.bin/.idx");
  if (o.workers < 0) throw usage_error("--workers must be at least 1");
  if (o.partitions < 1) throw usage_error("--partitions must be at least 1");
  if (o.log_interval < 1) throw usage_error("--log-interval must be at least 1");
}

}  // namespace

std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns) {
  std::vector<std::string> files;
  for (const auto& p : patterns) {
    struct stat st{};
    if (::stat(p.c_str(), &st) == 0) {
      files.push_back(p);
      continue;
    }
    if (p.find_first_of("*?[") == std::string::npos) throw_io_error(p, "cannot open input", errno);
    glob_t g{};
    int rc = ::glob(p.c_str(), 0, nullptr, &g);
    if (rc != 0 || g.gl_pathc == 0) {
      ::globfree(&g);
      throw runtime_error("no file matches --input " + p, "check the pattern (quote it so that the shell leaves it alone)");
    }
    for (size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
  }
  return files;
}

PreprocessResult preprocess(const PreprocessOptions& o) {
  validate(o);
  PreprocessResult result;
  const auto files = expand_inputs(o.inputs);
  install_temp_file_cleanup();
  std::mutex out_mutex;
  RecordReader reader(files, o.chunk_bytes, [&, first = true](const std::string& path) mutable {
    if (first) {  // printed below, before the startup time as Megatron does
      first = false;
      return;
    }
    std::lock_guard lock(out_mutex);
    std::fprintf(o.out, "Opening %s\n", path.c_str());
    std::fflush(o.out);
  });
  result.input_bytes = reader.total_bytes();
  std::fprintf(o.out, "Opening %s\n", files.front().c_str());
  std::fflush(o.out);

  const auto startup_start = Clock::now();
  std::unique_ptr<Tokenizer> tokenizer = build_tokenizer(o.tokenizer);
  std::optional<TextTemplate> tmpl;
  if (o.text_template) tmpl.emplace(*o.text_template);
  OutputDatasets outputs(o, optimal_dtype(tokenizer->vocab_size()), result.outputs);
  const int workers = o.workers > 0 ? o.workers : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::unique_ptr<RecordProcessor>> processors;
  for (int w = 0; w < workers; ++w)
    processors.push_back(std::make_unique<RecordProcessor>(o, tokenizer->clone(), tmpl ? &*tmpl : nullptr, files));
  result.startup_seconds = seconds_since(startup_start);
  std::fprintf(o.out, "Time to startup: %s\n", python_float_repr(result.startup_seconds).c_str());
  std::fflush(o.out);

  const bool bar_enabled = o.progress_bar == PreprocessOptions::Progress::Always ||
                           (o.progress_bar == PreprocessOptions::Progress::Auto && ::isatty(::fileno(o.err)));
  ProgressBar bar(o.err, bar_enabled, reader.total_bytes());
  Pipeline pipeline(reader, 4 * static_cast<size_t>(workers) + 2);
  const auto proc_start = Clock::now();
  ResultWriter writer(o, outputs, bar, result, proc_start);
  pipeline.start(std::move(processors));
  while (true) {
    std::unique_ptr<Pipeline::Done> d = pipeline.next();
    if (d->result.fatal) std::rethrow_exception(d->result.fatal);
    writer.write(*d->chunk, d->result);
    bar.update(d->chunk->consumed_bytes);
    if (d->chunk->error) std::rethrow_exception(d->chunk->error);
    if (d->chunk->last) break;
  }
  pipeline.stop();
  bar.clear();
  result.processing_seconds = seconds_since(proc_start);
  writer.check_some_documents();
  outputs.commit(result.outputs);
  return result;
}

}  // namespace tessera::data
