// Preprocess internals: Python's float repr (Megatron's progress lines), --text-template,
// the record reader across every buffer boundary (JSONL and JSON arrays), and in-process runs.
#include <gtest/gtest.h>

#include "tessera/core/python_format.h"
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tessera/core/error.h"
#include "tessera/data/indexed_dataset.h"
#include "tessera/data/preprocess.h"
#include "tessera/data/record_reader.h"
#include "tessera/data/text_template.h"

namespace td = tessera::data;
namespace fs = std::filesystem;

namespace {

class DataPreprocess : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(TESSERA_BINARY_DIR) / ("preprocess_test_" + std::to_string(::getpid()) + "_" +
                                          ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& bytes) {
    std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  struct Rec {
    std::string text;
    uint64_t index, line, column;
    bool operator==(const Rec&) const = default;
    friend void PrintTo(const Rec& r, std::ostream* os) {
      *os << "{" << r.text << " #" << r.index << " at " << r.line << ":" << r.column << "}";
    }
  };
  std::vector<Rec> read_all(const std::vector<std::string>& files, size_t chunk, size_t read_bytes) {
    td::RecordReader reader(files, chunk, {}, read_bytes);
    std::vector<Rec> out;
    td::Chunk c;
    do {
      reader.next(c);
      if (c.error) std::rethrow_exception(c.error);
      for (const auto& r : c.records) out.push_back(Rec{c.data.substr(r.offset, r.size), r.index, r.line, r.column});
    } while (!c.last);
    return out;
  }

  fs::path dir_;
};

FILE* devnull() {
  static FILE* f = std::fopen("/dev/null", "w");
  return f;
}

}  // namespace

TEST(DataPreprocessFormat, PythonFloatRepr) {
  EXPECT_EQ(tessera::python_float_repr(0.0), "0.0");
  EXPECT_EQ(tessera::python_float_repr(1.0), "1.0");
  EXPECT_EQ(tessera::python_float_repr(1234.5678912), "1234.5678912");
  EXPECT_EQ(tessera::python_float_repr(0.1), "0.1");
  EXPECT_EQ(tessera::python_float_repr(1e16), "1e+16");
  EXPECT_EQ(tessera::python_float_repr(1.5e16), "1.5e+16");
  EXPECT_EQ(tessera::python_float_repr(123456789012345.6), "123456789012345.6");
  EXPECT_EQ(tessera::python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(tessera::python_float_repr(0.00001), "1e-05");
  EXPECT_EQ(tessera::python_float_repr(2.5e-7), "2.5e-07");
  EXPECT_EQ(tessera::python_float_repr(-3.25), "-3.25");
  EXPECT_EQ(tessera::python_float_repr(1.0 / 3.0), "0.3333333333333333");
  EXPECT_EQ(tessera::python_float_repr(52044.52392), "52044.52392");
}

TEST(DataPreprocessFormat, TextTemplate) {
  td::TextTemplate t("{instruction}\\n{input}\\n{output} {{x}} \\\\n {instruction}");
  ASSERT_EQ(t.fields(), (std::vector<std::string>{"instruction", "input", "output"}));
  std::string out;
  std::vector<std::string_view> v{"I", "", "O"};
  t.render(v, out);
  EXPECT_EQ(out, "I\n\nO {x} \\n I");
  EXPECT_THROW(td::TextTemplate("{a:>3}"), tessera::Error);
  EXPECT_THROW(td::TextTemplate("{0}"), tessera::Error);
  EXPECT_THROW(td::TextTemplate("{a.b}"), tessera::Error);
  EXPECT_THROW(td::TextTemplate("{a"), tessera::Error);
  EXPECT_THROW(td::TextTemplate("a}"), tessera::Error);
  EXPECT_THROW(td::TextTemplate("plain"), tessera::Error);
}

TEST_F(DataPreprocess, ReaderSplitsLinesAtEveryBoundary) {
  std::string text = "\xEF\xBB\xBF{\"a\": 1}\r\n{\"text\": \"x\\ny\"}\n\n  {\"b\": \"\xC3\xA9\"}\n{\"last\": 0}";
  std::string f = write("in.jsonl", text);
  std::vector<Rec> want = {{"{\"a\": 1}\r", 0, 1, 1}, {"{\"text\": \"x\\ny\"}", 1, 2, 1}, {"", 2, 3, 1},
                           {"  {\"b\": \"\xC3\xA9\"}", 3, 4, 1}, {"{\"last\": 0}", 4, 5, 1}};
  for (size_t read = 1; read <= text.size() + 1; ++read)
    for (size_t chunk : {1, 7, 1000}) ASSERT_EQ(read_all({f}, chunk, read), want) << read << " " << chunk;
}

TEST_F(DataPreprocess, ReaderSplitsJsonArraysAtEveryBoundary) {
  std::string text =
      "  [\n {\"t\": \"a ] } , [ { \\\" \\\\\"},\n\t{\"n\": [1, {\"x\": []}]} ,\"s\\\"\", 12 ,true,\n"
      " {\"\xC3\xA9\": \"\xE4\xB8\xAD\"}, null]\n  ";
  std::string f = write("in.json", text);
  std::vector<Rec> want = {{"{\"t\": \"a ] } , [ { \\\" \\\\\"}", 0, 2, 2},
                           {"{\"n\": [1, {\"x\": []}]}", 1, 3, 2},
                           {"\"s\\\"\"", 2, 3, 25},
                           {"12", 3, 3, 32},
                           {"true", 4, 3, 36},
                           {"{\"\xC3\xA9\": \"\xE4\xB8\xAD\"}", 5, 4, 2},
                           {"null", 6, 4, 14}};
  for (size_t read = 1; read <= text.size() + 1; ++read)
    for (size_t chunk : {1, 5, 1000}) ASSERT_EQ(read_all({f}, chunk, read), want) << read << " " << chunk;
  // Several files: indices continue, lines restart.
  std::string g = write("in2.jsonl", "{\"k\": 1}\n");
  auto both = read_all({f, g, write("empty.jsonl", ""), f}, 3, 4);
  ASSERT_EQ(both.size(), 15u);
  EXPECT_EQ(both[7], (Rec{"{\"k\": 1}", 7, 1, 1}));
  EXPECT_EQ(both[14].index, 14u);
  // Structural errors name the place.
  for (auto [bad, where] : {std::pair<std::string, std::string>{"[{\"a\": 1} {\"b\": 2}]", ":1:11:"},
                            {"[1,]", ":1:4:"}, {"[1, 2", ":1:5:"}, {"[{\"a\": \"x]", ":1:2:"}, {"[1] x", ":1:5:"}}) {
    std::string p = write("bad.json", bad);
    try {
      read_all({p}, 100, 2);
      ADD_FAILURE() << bad;
    } catch (const tessera::Error& e) {
      EXPECT_NE(std::string(e.what()).find(p + where), std::string::npos) << e.what();
    }
  }
}

TEST_F(DataPreprocess, InProcessRunAndKeysAndTemplate) {
  std::string in = write("in.json", R"([{"a": "1 2", "b": "3", "c": "x"}, {"a": "", "b": ["4", "", "5 6"], "c": "y"}])");
  td::PreprocessOptions o;
  o.inputs = {in};
  o.json_keys = {"a", "b"};
  o.output_prefix = path("out");
  o.tokenizer.type = "NullTokenizer";
  o.tokenizer.vocab_size = 10;
  o.append_eod = true;
  o.workers = 2;
  o.out = o.err = devnull();
  td::PreprocessResult r = td::preprocess(o);
  ASSERT_EQ(r.outputs.size(), 2u);
  EXPECT_EQ(r.documents, 2u);
  td::IndexedDataset a(path("out_a_document")), b(path("out_b_document"));
  EXPECT_EQ(a.document_count(), 2u);
  EXPECT_EQ(a.sequence_count(), 1u);  // the empty document has no sequence
  EXPECT_EQ(a.get(0)[2], 10);          // EOD = --vocab-size
  EXPECT_EQ(b.sequence_count(), 3u);   // sentences "4" and "5 6" (+EOD); "" is dropped
  EXPECT_EQ(b.sequence_length(2), 3);
  EXPECT_EQ(b.document_index(2), 3);
  // --text-template: the output is named by the (single) json key.
  o.json_keys = {"text"};
  o.text_template = "{b}";
  EXPECT_THROW(td::preprocess(o), tessera::Error);  // "b" is a list in the 2nd record
  EXPECT_FALSE(fs::exists(path("out_text_document.bin")));
  o.skip_bad_records = true;
  r = td::preprocess(o);
  EXPECT_EQ(r.skipped, 1u);
  td::IndexedDataset t(path("out_text_document"));
  EXPECT_EQ(t.document_count(), 1u);
  EXPECT_EQ(t.get(0)[0], 3);
}

TEST_F(DataPreprocess, ProgressLinesAndBar) {
  std::string lines;
  for (int i = 0; i < 25; ++i) lines += "{\"text\": \"" + std::to_string(i) + "\"}\n";
  td::PreprocessOptions o;
  o.inputs = {write("in.jsonl", lines)};
  o.output_prefix = path("out");
  o.tokenizer.type = "NullTokenizer";
  o.tokenizer.vocab_size = 100;
  o.log_interval = 10;
  o.progress_bar = td::PreprocessOptions::Progress::Always;
  FILE* out = std::tmpfile();
  FILE* err = std::tmpfile();
  o.out = out;
  o.err = err;
  td::preprocess(o);
  auto contents = [](FILE* f) {
    std::fflush(f);
    std::rewind(f);
    std::string s;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
    std::fclose(f);
    return s;
  };
  std::string so = contents(out), se = contents(err);
  EXPECT_EQ(so.rfind("Opening " + o.inputs[0] + "\nTime to startup: ", 0), 0u) << so;
  EXPECT_NE(se.find("Processed 10 documents ("), std::string::npos) << se;
  EXPECT_NE(se.find("Processed 20 documents ("), std::string::npos) << se;
  EXPECT_EQ(se.find("Processed 30"), std::string::npos) << se;
  EXPECT_NE(se.find("ETA"), std::string::npos) << se;
}
