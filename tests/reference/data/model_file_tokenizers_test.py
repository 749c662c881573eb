#!/usr/bin/env python3
"""`tessera preprocess` with HuggingFaceTokenizer, Llama2Tokenizer and GPTSentencePieceTokenizer
against Megatron's tools/preprocess_data.py logic with its own tokenizer classes
(preprocess_ref.py + megatron_tokenizers.py on transformers, tokenizers and sentencepiece):
the .bin/.idx must be byte-identical, on English, Chinese, tricky strings and every code point.

No tokenizer can be downloaded here, so the tests train small ones first, on
tests/data/corpora/tinyshakespeare.txt and chinese_daodejing.txt: byte-level BPE
tokenizer.json files with the split regexes of Llama-3, Qwen2 and GPT-2 (tokenizers), and a
SentencePiece BPE model with byte fallback (sentencepiece).

Run with the test venv's python (scripts/setup.sh); -k hf or -k sp selects one family.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import DATA, expect, tessera  # noqa: E402
from indexed_writer import read_index  # noqa: E402

os.environ["HF_HUB_OFFLINE"] = "1"  # transformers must read the folder, never the hub
os.environ["TOKENIZERS_PARALLELISM"] = "false"

# The split patterns of the published tokenizer.json files.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

TRICKY = [
    "", "Hello world", "  leading spaces", "trailing   ", "tabs\t\tand\nnew\n\n\nlines\n", "\r\n windows\r\n",
    "multiple     spaces     between", "1234567890 12 123 1234 3.14159 1,000,000 ２０２４",
    "I'm you're he's we'll they've she'd don't CAN'T I'M 'S 'Re 'ſ", "😀 👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷!!",
    "中文文本，混合 English 和 数字123。", "日本語のテキスト、한국어 텍스트", "नमस्ते दुनिया", "مرحبا بالعالم",
    "<|begin_of_text|>Hello<|end_of_text|>", "x<|end_of_text|>y", "<|end_of_text|><|end_of_text|>",
    " <|end_of_text|> ", "<|end_of_te", "a <mask>  b", "a<mask>b", "  <mask>", "<|endoftext|>x",
    "e\u0301 A\u030a \u212b \ufb01x caf\u00e9 cafe\u0301", "\u00a0nbsp\u2003em\u3000ideo\u180emongol\u200bzw\x1c\x1f\x85",
    "a" * 500, "ab" * 300, " " * 70 + "x", "\n" * 20, "!!!???...,,,;;;", "The year 1984 had 365 days.",
]


def corpus_texts():
    with open(os.path.join(DATA, "corpora", "tinyshakespeare.txt"), encoding="utf-8") as f:
        english = [p for p in f.read().split("\n\n") if p.strip()]
    with open(os.path.join(DATA, "corpora", "chinese_daodejing.txt"), encoding="utf-8") as f:
        chinese = [line for line in f.read().split("\n") if line]
    return english, chinese


def nfc_version_differences():
    """The code points Unicode 14 assigns whose NFC in tokenizers differs from Unicode 14's
    (Python's unicodedata; for these ICU 72's Unicode 15 is the same): tokenizers' normalization
    tables are older, so combining marks added since (e.g. U+0898-U+089F) have no combining
    class there and are not reordered."""
    import unicodedata
    from tokenizers import normalizers
    nfc = normalizers.NFC()
    expect(unicodedata.unidata_version == "14.0.0", f"Unicode {unicodedata.unidata_version}")
    differ = set()
    for c in range(1, 0x110000):
        ch = chr(c)
        if 0xD800 <= c <= 0xDFFF or unicodedata.category(ch) == "Cn":
            continue
        for s in (ch, ch + "\u0334", "\u0334" + ch, "a" + ch + "\u0301", ch + "\u0301"):
            if nfc.normalize_str(s) != unicodedata.normalize("NFC", s):
                differ.add(ch)
                break
    expect(len(differ) < 200, f"{len(differ)} code points normalize differently: more than Unicode versions explain")
    return differ


def every_code_point_documents(nfc_comparable=False):
    """Every Unicode scalar value, 1,000 per document with spaces and digits between some;
    optionally only those assigned by Unicode 14 whose NFC tokenizers computes as Unicode does."""
    import unicodedata
    chars = [chr(c) for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF]
    if nfc_comparable:
        differ = nfc_version_differences()
        chars = [c for c in chars if unicodedata.category(c) != "Cn" and c not in differ]
    docs = []
    for i in range(0, len(chars), 1000):
        piece = chars[i:i + 1000]
        docs.append("".join(c + (" " if j % 7 == 0 else "") + ("1" if j % 11 == 0 else "")
                            for j, c in enumerate(piece)))
    return docs


MODELS = tempfile.mkdtemp(prefix="tessera-tokenizers-")


def train_hf(name, pattern, specials, template_bos, tokenizer_class, config_tokens, normalizer=True,
             byte_level_regex=False, prefix_space=False, ignore_merges=True):
    """A byte-level BPE trained on English and Chinese; returns its folder."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, \
        processors, trainers
    folder = os.path.join(MODELS, name)
    if os.path.exists(os.path.join(folder, "tokenizer.json")):
        return folder
    os.makedirs(folder)
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer:
        tok.normalizer = normalizers.NFC()
    steps = [pre_tokenizers.Split(Regex(pattern), behavior="isolated")] if pattern else []
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=prefix_space, use_regex=byte_level_regex))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps) if len(steps) > 1 else steps[0]
    tok.decoder = decoders.ByteLevel()
    english, chinese = corpus_texts()
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(english + chinese * 20, trainer)
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, special=True, normalized=False)])
    tok.add_tokens([AddedToken("\ufb01x", normalized=True)])  # matched in the normalized text
    post = [processors.ByteLevel(trim_offsets=False)]
    if template_bos:
        post.append(processors.TemplateProcessing(single=f"{template_bos} $A", pair=f"{template_bos} $A $B",
                                                  special_tokens=[(template_bos, tok.token_to_id(template_bos))]))
    tok.post_processor = processors.Sequence(post)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": tokenizer_class, **config_tokens}, f)
    return folder


def llama3(normalizer=True):
    return train_hf("llama3" if normalizer else "llama3_raw", LLAMA3_PATTERN,
                    ["<|begin_of_text|>", "<|end_of_text|>"], "<|begin_of_text|>", "PreTrainedTokenizerFast",
                    {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}, normalizer=normalizer)


def qwen2():  # eos comes from Qwen2TokenizerFast's default, <|endoftext|>
    return train_hf("qwen2", QWEN2_PATTERN, ["<|endoftext|>", "<|im_start|>"], None, "Qwen2Tokenizer", {})


def gpt2_style():  # ByteLevel alone, with GPT-2's pattern and a prefix space; no normalizer
    return train_hf("gpt2style", None, ["<|endoftext|>"], None, "PreTrainedTokenizerFast",
                    {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}, normalizer=False,
                    byte_level_regex=True, prefix_space=True, ignore_merges=False)


def train_sp():
    """A SentencePiece BPE model with byte fallback, trained on English and Chinese."""
    import sentencepiece as spm
    prefix = os.path.join(MODELS, "sp_bpe")
    if not os.path.exists(prefix + ".model"):
        english, chinese = corpus_texts()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter([t.replace("\n", " ") for t in english] + chinese * 20), model_prefix=prefix,
            model_type="bpe", vocab_size=2000, byte_fallback=True, character_coverage=0.9995,
            num_threads=1, minloglevel=2)
    return prefix + ".model"


def write_jsonl(path, texts):
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")


def documents(prefix):
    """The token ids of each document of an indexed dataset."""
    import numpy as np
    dtype, lengths, pointers, docs = read_index(prefix + ".idx")
    tokens = np.fromfile(prefix + ".bin", dtype=dtype)
    seq_tokens = []
    start = 0
    for n in lengths:
        seq_tokens.append(tokens[start:start + n].tolist())
        start += n
    return [sum(seq_tokens[docs[i]:docs[i + 1]], []) for i in range(len(docs) - 1)]


def compare_preprocess(texts, tokenizer_type, model, extra=()):
    """tessera preprocess and the Megatron reference on the same JSONL: byte-identical."""
    write_jsonl("in.jsonl", texts)
    args = ["--input", "in.jsonl", "--tokenizer-type", tokenizer_type, "--tokenizer-model", model,
            "--append-eod", *extra]
    tessera("preprocess", *args, "--output-prefix", "t", "--workers", "2", "--no-progress-bar")
    harness.reference(*args, "--output-prefix", "r", "--workers", "1")
    try:
        harness.same_dataset("t_text_document", "r_text_document")
    except AssertionError:
        mine, theirs = documents("t_text_document"), documents("r_text_document")
        for i, (a, b) in enumerate(zip(mine, theirs)):
            if a != b:
                k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
                raise AssertionError(f"document {i} {texts[i][:60]!r}: token {k} differs: tessera "
                                     f"{a[max(0, k - 3):k + 8]} vs reference {b[max(0, k - 3):k + 8]}")
        raise


def hf_cases(folder):
    english, chinese = corpus_texts()
    compare_preprocess(english + chinese, "HuggingFaceTokenizer", folder)


def test_hf_llama3_english_chinese():
    hf_cases(llama3())


def test_hf_llama3_tricky_strings():
    compare_preprocess(TRICKY, "HuggingFaceTokenizer", llama3())


def test_hf_llama3_every_code_point_split():
    """The split pattern's classes (\\s, \\p{L}, \\p{N}) on every code point, without NFC."""
    compare_preprocess(every_code_point_documents(), "HuggingFaceTokenizer", llama3(normalizer=False))


def test_hf_llama3_every_assigned_code_point_nfc():
    """With NFC, every code point whose normalization tokenizers and Unicode agree on."""
    compare_preprocess(every_code_point_documents(nfc_comparable=True), "HuggingFaceTokenizer", llama3())


def test_hf_qwen2_english_chinese_tricky():
    english, chinese = corpus_texts()
    compare_preprocess(TRICKY + english[:500] + chinese, "HuggingFaceTokenizer", qwen2())


def test_hf_gpt2_style_english_chinese_tricky():
    english, chinese = corpus_texts()
    compare_preprocess(TRICKY + english[:500] + chinese, "HuggingFaceTokenizer", gpt2_style())


def test_sp_llama2_english_chinese_tricky():
    english, chinese = corpus_texts()
    compare_preprocess(TRICKY + english + chinese, "Llama2Tokenizer", train_sp())


def test_sp_gpt_english_chinese_tricky():
    english, chinese = corpus_texts()
    compare_preprocess(TRICKY + english + chinese, "GPTSentencePieceTokenizer", train_sp())


def inspect_decode_cases(tokenizer_type, model):
    """`data inspect --decode N` with preprocess's tokenizer flags prints document N as
    Megatron's tokenizer detokenizes its ids."""
    import megatron_tokenizers
    english, chinese = corpus_texts()
    write_jsonl("in.jsonl", TRICKY[1:12] + english[:3] + chinese[:3])
    tok = ["--tokenizer-type", tokenizer_type, "--tokenizer-model", model]
    tessera("preprocess", "--input", "in.jsonl", "--output-prefix", "d", *tok, "--append-eod", "--no-progress-bar")
    reference = megatron_tokenizers.build(tokenizer_type, model)
    for n, ids in enumerate(documents("d_text_document")):
        p = subprocess.run([harness.TESSERA, "data", "inspect", "d_text_document", "--decode", str(n), *tok],
                           capture_output=True, timeout=60)  # bytes: text mode would turn "\r\n" into "\n"
        expect(p.returncode == 0, p.stderr.decode())
        out = p.stdout.decode("utf-8")
        head = "  document %d (%d tokens):\n" % (n, len(ids))
        expect(head in out, out)
        want = reference.detokenize(ids)
        got = out.split(head, 1)[1][:-1]  # the text, then one newline
        expect(got == want, f"document {n}: tessera decodes {got!r}, Megatron's tokenizer {want!r}")


def test_hf_inspect_decode():
    inspect_decode_cases("HuggingFaceTokenizer", llama3())


def test_sp_inspect_decode():
    inspect_decode_cases("Llama2Tokenizer", train_sp())
    inspect_decode_cases("GPTSentencePieceTokenizer", train_sp())


SMALL_MODEL = ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "16",
               "--max-position-embeddings", "16", "--micro-batch-size", "2", "--lr", "1e-3"]


def test_hf_train_and_doctor_read_the_tokenizer():
    """train runs on data preprocessed with the tokenizer (vocabulary 3002 padded to 3072), and
    doctor's tokenizer row names it."""
    folder = llama3()
    english, _ = corpus_texts()
    write_jsonl("in.jsonl", english[:400])
    tok = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", folder]
    tessera("preprocess", "--input", "in.jsonl", "--output-prefix", "d", *tok, "--append-eod", "--no-progress-bar")
    p = tessera("train", *SMALL_MODEL, "--global-batch-size", "2", "--train-iters", "2", "--eval-iters", "1",
                "--eval-interval", "2", "--log-interval", "1", *tok, "--data-path", "d_text_document",
                "--split", "90,10,0", "--data-cache-path", "cache", timeout=300)
    expect("padded vocab (size: 3002) with 70 dummy tokens (new size: 3072)" in p.stdout + p.stderr,
           p.stdout[-2000:])
    p = tessera("doctor", *SMALL_MODEL, "--train-iters", "2", *tok, "--mock-data", check=False, timeout=300)
    expect("HuggingFaceTokenizer, 3002 tokens, EOD 1" in p.stdout, p.stdout)


def edited_copy(folder, name, edit):
    """A copy of a tokenizer folder whose tokenizer.json `edit` changes."""
    out = os.path.join(os.getcwd(), name)
    os.makedirs(out)
    for f in os.listdir(folder):
        with open(os.path.join(folder, f), encoding="utf-8") as src:
            text = src.read()
        if f == "tokenizer.json":
            j = json.loads(text)
            edit(j)
            text = json.dumps(j)
        with open(os.path.join(out, f), "w", encoding="utf-8") as dst:
            dst.write(text)
    return out


def expect_error(args, *needles, code=1):
    p = tessera(*args, check=False)
    expect(p.returncode == code, f"exit {p.returncode}, expected {code}: {p.stderr}")
    for n in needles:
        expect(n in p.stderr, f"{n!r} not in: {p.stderr}")


def preprocess_args(tokenizer_type, model):
    write_jsonl("in.jsonl", ["hello"])
    return ["preprocess", "--input", "in.jsonl", "--output-prefix", "o", "--tokenizer-type", tokenizer_type,
            "--tokenizer-model", model, "--no-progress-bar"]


def test_error_unsupported_components_are_named():
    folder = llama3()
    cases = [
        ("normalizer", lambda j: j.__setitem__("normalizer", {"type": "Lowercase"}), "normalizer.type",
         "\"Lowercase\""),
        ("model", lambda j: j["model"].__setitem__("type", "WordPiece"), "model.type", "\"WordPiece\""),
        ("pretok", lambda j: j["pre_tokenizer"]["pretokenizers"].__setitem__(
            0, {"type": "Metaspace", "replacement": "_"}), "pre_tokenizer.pretokenizers[0].type", "\"Metaspace\""),
        ("post", lambda j: j.__setitem__("post_processor", {"type": "Dummy"}), "post_processor.type", "\"Dummy\""),
        ("dropout", lambda j: j["model"].__setitem__("dropout", 0.1), "model.dropout"),
        ("badid", lambda j: j["added_tokens"][0].__setitem__("id", "x"), "added_tokens[0].id",
         "expected a token id"),
        ("wrongtype", lambda j: j["post_processor"].__setitem__("processors", 3), "unexpected JSON structure"),
    ]
    for name, edit, *needles in cases:
        expect_error(preprocess_args("HuggingFaceTokenizer", edited_copy(folder, name, edit)), "tokenizer.json",
                     *needles)


def test_error_missing_model_files():
    expect_error(preprocess_args("Llama2Tokenizer", "nope.model"), "--tokenizer-model nope.model", "no such file")
    expect_error(preprocess_args("GPTSentencePieceTokenizer", "in.jsonl"), "not a SentencePiece model")
    os.makedirs("empty")
    expect_error(preprocess_args("HuggingFaceTokenizer", "empty"), "empty has no tokenizer.json")
    write_jsonl("in.jsonl", ["hello"])
    expect_error(["preprocess", "--input", "in.jsonl", "--output-prefix", "o", "--tokenizer-type",
                  "Llama2Tokenizer"], "needs --tokenizer-model", code=2)


def test_error_vocab_larger_than_flags_allow():
    train = ["train", "--num-layers", "1", "--hidden-size", "8", "--num-attention-heads", "2", "--seq-length",
             "8", "--max-position-embeddings", "8", "--micro-batch-size", "1", "--mock-data", "--lr", "1e-3",
             "--train-iters", "1", "--vocab-size", "100"]
    expect_error([*train, "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", llama3()],
                 "--vocab-size 100 is smaller than the vocabulary of --tokenizer-model", code=2)
    expect_error([*train, "--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", train_sp()],
                 "--vocab-size 100 is smaller", code=2)
    # Ids with a gap: a token numbered past len(tokenizer) would index past the embedding.
    gap = edited_copy(llama3(), "gap", lambda j: j["added_tokens"].append(
        {"id": 100000, "content": "<far>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}))
    expect_error(preprocess_args("HuggingFaceTokenizer", gap), "token id 100000 is not below the vocabulary size")


if __name__ == "__main__":
    harness.run_module(dict(globals()))
