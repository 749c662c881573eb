// The restricted pickle reader and the protocol-2 writer (ckpt/pickle.h), and the zip
// container (ckpt/zip_archive.h): what the writer emits reads back as the same values; the
// reader refuses, with an Error naming the file, every global and opcode a Megatron
// checkpoint does not hold, cycles, truncation, and a storage-less persistent id; the zip
// reader refuses a damaged CRC and a truncated archive. (PyTorch reading the writer's files is
// tests/integration/megatron_checkpoint_test.py.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tessera/ckpt/pickle.h"
#include "tessera/ckpt/torch_file.h"
#include "tessera/ckpt/zip_archive.h"
#include "tessera/core/error.h"

namespace tessera {
namespace {

using pickle::Kind;

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// A string literal with its NUL bytes (pickles hold them).
template <size_t N>
std::string raw(const char (&s)[N]) {
  return std::string(s, N - 1);
}

// The Error's message and hint of unpickling `data`, or "" when it reads.
std::string error_of(const std::string& data) {
  try {
    pickle::unpickle(bytes(data), "test.pkl");
  } catch (const Error& e) {
    return std::string(e.what()) + "\nhint: " + e.hint();
  }
  return "";
}

TEST(Pickle, WhatTheWriterEmitsReadsBackAsTheSameValues) {
  pickle::Document doc;
  pickle::Value* root = doc.dict();
  pickle::Value* args = doc.object("argparse.Namespace");
  doc.set(args, "num_layers", doc.integer(24));
  doc.set(args, "big", doc.integer(int64_t{1} << 40));
  doc.set(args, "negative", doc.integer(-3));
  doc.set(args, "lr", doc.real(6e-4));
  doc.set(args, "params_dtype", doc.global("torch.bfloat16"));
  doc.set(args, "model_type", doc.object("megatron.core.enums.ModelType", {doc.integer(1)}));
  pickle::Value* mode = doc.object("megatron.core.rerun_state_machine.RerunMode", {doc.str("DISABLED")});
  mode->integer = 1;  // by name
  doc.set(args, "mode", mode);
  doc.set(args, "paths", doc.list({doc.str("a"), doc.str("b")}));
  doc.set(args, "nothing", doc.none());
  doc.set(root, "args", args);
  doc.set(root, "betas", doc.tuple({doc.real(0.9), doc.real(0.95)}));
  doc.set(root, "w", doc.tensor({{"0", "FloatStorage", "cpu", 6}, 0, {2, 3}, {3, 1}}));
  doc.set(doc.dict(), "unused", doc.none());

  const pickle::Document back = pickle::unpickle(pickle::dump(*root), "round-trip");
  const pickle::Value& r = *back.root;
  const pickle::Value* a = r.get("args");
  ASSERT_TRUE(a && a->kind == Kind::Object && a->text == "argparse.Namespace");
  EXPECT_EQ(a->get("num_layers")->integer, 24);
  EXPECT_EQ(a->get("big")->integer, int64_t{1} << 40);
  EXPECT_EQ(a->get("negative")->integer, -3);
  EXPECT_EQ(a->get("lr")->real, 6e-4);
  EXPECT_EQ(a->get("params_dtype")->text, "torch.bfloat16");
  EXPECT_EQ(pickle::describe(*a->get("model_type")), "megatron.core.enums.ModelType(1)");
  EXPECT_EQ(a->get("mode")->integer, 1);
  EXPECT_TRUE(a->get("mode")->items.at(0)->is_str("DISABLED"));
  EXPECT_EQ(a->get("paths")->items.size(), 2u);
  EXPECT_EQ(a->get("nothing")->kind, Kind::None);
  EXPECT_EQ(r.get("betas")->kind, Kind::Tuple);
  const pickle::Value* w = r.get("w");
  ASSERT_TRUE(w && w->kind == Kind::Tensor);
  EXPECT_EQ(w->tensor.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(w->tensor.stride, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(w->tensor.storage.type, "FloatStorage");
}

TEST(Pickle, RefusesWhatAMegatronCheckpointNeverHolds) {
  // os.system as a hostile __reduce__ pickles it (protocol 2): GLOBAL 'posix system'.
  const std::string system_call = raw("\x80\x02" "cposix\nsystem\nX\x05\x00\x00\x00touch\x85R.");
  EXPECT_NE(error_of(system_call).find("'posix.system'"), std::string::npos) << error_of(system_call);
  EXPECT_NE(error_of(system_call).find("test.pkl"), std::string::npos);
  EXPECT_NE(error_of("\x80\x02" "cbuiltins\neval\n.").find("'builtins.eval'"), std::string::npos);
  // getattr only as an enum member's spelling.
  EXPECT_NE(error_of(raw("\x80\x02" "cbuiltins\ngetattr\ncos\npath\nX\x04\x00\x00\x00join\x86R.")).find("'os.path'"),
            std::string::npos);
  // An allowed class in a role it never has: a storage type called as a function.
  EXPECT_NE(error_of("\x80\x02" "ctorch\nFloatStorage\n)R.").find("called as a function"), std::string::npos);
  // Protocol 0's INST and text opcodes.
  EXPECT_NE(error_of("(ios\nsystem\nS'x'\ni.").find("opcode"), std::string::npos);
  // A list that contains itself: EMPTY_LIST, BINPUT 0, BINGET 0, APPEND.
  EXPECT_NE(error_of(raw("\x80\x02]q\x00h\x00" "a.")).find("contains itself"), std::string::npos);
  // Truncated inside a string, and a stack that does not end with one value.
  EXPECT_NE(error_of(raw("\x80\x02X\xff\x00\x00\x00ab")).find("ends early"), std::string::npos);
  EXPECT_NE(error_of("\x80\x02NN.").find("exactly one value"), std::string::npos);
  // A persistent id that is not a storage.
  EXPECT_NE(error_of(raw("\x80\x02X\x01\x00\x00\x00xQ.")).find("persistent id"), std::string::npos);
  // A memo entry read before it is written.
  EXPECT_NE(error_of("\x80\x02h\x07.").find("memo entry 7"), std::string::npos);
}

// torch_dist's .metadata names TensorProperties' memory format by value or, as Debian 12's
// Python 3.11.2 pickles an enum member, getattr(_MEM_FORMAT_ENCODING, "TORCH_CONTIGUOUS_FORMAT")
// (seen in megatron-core 0.10.0's files under torch 2.5.1): both read as the member; getattr of
// anything else in that dialect is refused.
TEST(Pickle, ADcpMetadataEnumMemberReadsByValueAndByName) {
  const auto dcp = [](const std::string& data) {
    return pickle::unpickle(bytes(data), "test.metadata", pickle::Dialect::DcpMetadata);
  };
  const std::string by_name = raw(
      "\x80\x04" "\x8c\x08" "builtins" "\x8c\x07" "getattr" "\x93"
      "\x8c\x25" "torch.distributed.checkpoint.metadata" "\x8c\x14" "_MEM_FORMAT_ENCODING" "\x93"
      "\x8c\x17" "TORCH_CONTIGUOUS_FORMAT" "\x86R.");
  const pickle::Document named = dcp(by_name);
  EXPECT_EQ(named.root->kind, Kind::Object);
  EXPECT_EQ(named.root->text, "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING");
  const pickle::Document valued = dcp(raw(
      "\x80\x04" "\x8c\x25" "torch.distributed.checkpoint.metadata" "\x8c\x14" "_MEM_FORMAT_ENCODING" "\x93"
      "K\x00\x85R."));
  EXPECT_EQ(valued.root->text, named.root->text);
  try {
    dcp(raw("\x80\x04" "\x8c\x08" "builtins" "\x8c\x07" "getattr" "\x93" "\x8c\x05" "torch" "\x8c\x04" "Size"
            "\x93" "\x8c\x04" "view" "\x86R."));
    ADD_FAILURE() << "getattr(torch.Size, 'view') was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("getattr of anything but an allowed enum"), std::string::npos) << e.what();
  }
}

// nn.Module.state_dict() pickles as OrderedDict() REDUCE, its items, then BUILD with
// {'_metadata': ...}: the dict's attributes, kept beside its items.
TEST(Pickle, BuildOnAnOrderedDictKeepsItsAttributes) {
  const std::string pickled = raw("\x80\x02" "ccollections\nOrderedDict\n)R"
                                  "X\x01\x00\x00\x00wK\x01s"
                                  "}(X\x09\x00\x00\x00_metadataK\x02X\x05\x00\x00\x00otherK\x03u"
                                  "b.");
  const pickle::Document doc = pickle::unpickle(bytes(pickled), "test.pkl");
  ASSERT_EQ(doc.root->kind, Kind::Dict);
  EXPECT_EQ(doc.root->text, "OrderedDict");
  EXPECT_EQ(doc.root->get("w")->integer, 1);
  ASSERT_NE(doc.root->state, nullptr);
  EXPECT_EQ(doc.root->state->get("_metadata")->integer, 2);
  EXPECT_EQ(doc.root->state->get("other")->integer, 3);
}

// Transformer Engine 1.x's _extra_state is an io.BytesIO: pickle.dumps({'s': BytesIO(b'PK\x03\xff')
// at position 4}, protocol=2) as CPython 3.11 writes it reads as the object with its contents; the
// writer's spelling of it (bytes as _codecs.encode) reads back the same.
TEST(Pickle, AnIoBytesIoIsDataWithItsContents) {
  const std::string python = raw(
      "\x80\x02}q\x00X\x01\x00\x00\x00sq\x01" "c_io\nBytesIO\nq\x02)\x81q\x03" "c_codecs\nencode\nq\x04"
      "X\x05\x00\x00\x00PK\x03\xc3\xbfq\x05X\x06\x00\x00\x00latin1q\x06\x86q\x07Rq\x08K\x04N\x87q\tbs.");
  const pickle::Document doc = pickle::unpickle(bytes(python), "test.pkl");
  const pickle::Value* s = doc.root->get("s");
  ASSERT_TRUE(s && s->kind == Kind::Object && s->text == "_io.BytesIO");
  ASSERT_TRUE(s->state && s->state->kind == Kind::Tuple && s->state->items.size() == 3);
  EXPECT_EQ(s->state->items[0]->kind, Kind::Bytes);
  EXPECT_EQ(s->state->items[0]->text, raw("PK\x03\xff"));
  EXPECT_EQ(s->state->items[1]->integer, 4);
  const pickle::Document back = pickle::unpickle(pickle::dump(*doc.root), "round-trip");
  EXPECT_EQ(back.root->get("s")->state->items[0]->text, raw("PK\x03\xff"));
  // Only the state io.BytesIO pickles: (bytes, position, attributes).
  EXPECT_NE(error_of(raw("\x80\x02" "c_io\nBytesIO\n)\x81K\x01\x85" "b.")).find("io.BytesIO"), std::string::npos);
}

// What the reader does not take is named with its opcode and byte, not called damage.
TEST(Pickle, AnUnsupportedConstructIsNamedNotBlamedOnTheFile) {
  // BUILD on an OrderedDict with a tuple state (at byte 32).
  const std::string e = error_of(raw("\x80\x02" "ccollections\nOrderedDict\n)R" "K\x01\x85" "b."));
  EXPECT_NE(e.find("pickle opcode BUILD at byte 32"), std::string::npos) << e;
  EXPECT_NE(e.find("BUILD on OrderedDict(0) with the state (1) is not supported"), std::string::npos) << e;
  EXPECT_EQ(e.find("truncated"), std::string::npos) << e;
  // BUILD on a plain value.
  EXPECT_NE(error_of(raw("\x80\x02K\x01}b.")).find("BUILD on 1 is not supported"), std::string::npos);
  // Only a file that ends early is called truncated.
  const std::string t = error_of(raw("\x80\x02X\xff\x00\x00\x00ab"));
  EXPECT_NE(t.find("ends early"), std::string::npos) << t;
  EXPECT_NE(t.find("truncated"), std::string::npos) << t;
}

TEST(Pickle, DeepNestingIsRefusedNotACrash) {
  std::string deep = "\x80\x02" "N";
  for (int i = 0; i < 100000; ++i) deep += "\x85";  // TUPLE1, 100000 deep
  deep += ".";
  EXPECT_NE(error_of(deep).find("nested"), std::string::npos);
}

TEST(Zip, StoredRecordsReadBackAlignedAndADamagedRecordFailsItsCrc) {
  const std::vector<uint8_t> a = bytes("hello"), b(1000, 7);
  std::vector<uint8_t> archive = zip::write_stored({{"x/data.pkl", a}, {"x/data/0", b}});
  const zip::Reader r = zip::Reader::from_bytes("test.zip", archive);
  ASSERT_EQ(r.entries().size(), 2u);
  EXPECT_EQ(r.read(*r.find("x/data.pkl")), a);
  EXPECT_EQ(r.read(*r.find("x/data/0")), b);
  EXPECT_EQ(r.find("x/data/0")->data_offset % 64, 0u);  // PyTorch's alignment

  archive[r.find("x/data/0")->data_offset + 10] ^= 1;
  const zip::Reader damaged = zip::Reader::from_bytes("test.zip", archive);
  try {
    damaged.read(*damaged.find("x/data/0"));
    ADD_FAILURE() << "a flipped byte passed the CRC check";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CRC-32"), std::string::npos) << e.what();
  }
  for (size_t keep : {archive.size() / 2, size_t{21}, size_t{0}}) {
    std::vector<uint8_t> cut(archive.begin(), archive.begin() + static_cast<std::ptrdiff_t>(keep));
    EXPECT_THROW(zip::Reader::from_bytes("test.zip", cut), Error) << keep;
  }
}

TEST(TorchFile, ATensorPastItsStorageIsAnErrorBeforeAnyElementIsRead) {
  pickle::Document doc;
  pickle::Value* root = doc.dict();
  doc.set(root, "ok", doc.tensor({{"0", "FloatStorage", "cpu", 4}, 1, {3}, {1}}));
  doc.set(root, "past_end", doc.tensor({{"0", "FloatStorage", "cpu", 4}, 2, {3}, {1}}));
  doc.set(root, "repeated", doc.tensor({{"0", "FloatStorage", "cpu", 4}, 0, {1000000000}, {0}}));
  const float values[4] = {1, 2, 3, 4};
  const std::vector<uint8_t> storage(reinterpret_cast<const uint8_t*>(values),
                                     reinterpret_cast<const uint8_t*>(values) + sizeof values);
  const TorchFile f = TorchFile::from_bytes("test.pt", torch_file_bytes("test", *root, {{"0", storage}}));
  EXPECT_EQ(f.f32(f.root().get("ok")->tensor, "ok"), (std::vector<float>{2, 3, 4}));
  EXPECT_THROW(f.f32(f.root().get("past_end")->tensor, "past_end"), Error);
  EXPECT_THROW(f.f32(f.root().get("repeated")->tensor, "repeated"), Error);
}

}  // namespace
}  // namespace tessera
