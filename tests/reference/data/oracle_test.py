#!/usr/bin/env python3
"""`tessera preprocess` against the Python oracle preprocess_ref.py (Megatron's
preprocess_data.py with GPT-2 BPE on python3-regex), byte for byte, on a few hundred
documents: tinyshakespeare paragraphs as JSONL, the Alpaca JSON arrays with --text-template,
random Unicode documents with several keys and --partitions, and odd JSONL spellings."""
import gzip
import json
import os
import random

from harness import DATA, GPT2, expect, reference, run_module, same_dataset, tessera

TEMPLATE = r"{instruction}\n{input}\n{output}"


def both(input_path, *flags, workers=2, chunk_bytes=65536):
    tessera("preprocess", "--input", input_path, "--output-prefix", "t", *GPT2, "--workers", workers, *flags,
            "--chunk-bytes", chunk_bytes)
    reference("--input", input_path, "--output-prefix", "r", *GPT2, "--workers", 1, *flags)


def test_tinyshakespeare_paragraphs():
    with open(os.path.join(DATA, "corpora", "tinyshakespeare.txt"), encoding="utf-8") as f:
        paragraphs = f.read().split("\n\n")[:400]
    with open("ts.jsonl", "w", encoding="utf-8") as f:
        for p in paragraphs:
            f.write(json.dumps({"text": p}) + "\n")
    both("ts.jsonl", "--append-eod", chunk_bytes=4096)
    same_dataset("t_text_document", "r_text_document")


def test_alpaca_seed_json_array_with_template():
    both(os.path.join(DATA, "corpora", "alpaca_self_instruct_seed.json"), "--text-template", TEMPLATE,
         "--append-eod")
    same_dataset("t_text_document", "r_text_document")


def test_alpaca_gsm8k_slice_as_gzip_jsonl():
    with open(os.path.join(DATA, "corpora", "alpaca_gsm8k_test.json"), encoding="utf-8") as f:
        records = json.load(f)[:200]
    with gzip.open("gsm.jsonl.gz", "wt", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    with open("gsm.json", "w", encoding="utf-8") as f:
        json.dump(records, f, indent=1, ensure_ascii=True)
    tessera("preprocess", "--input", "gsm.jsonl.gz", "--output-prefix", "t", *GPT2, "--workers", 2,
            "--text-template", TEMPLATE, "--json-keys", "doc")
    reference("--input", "gsm.json", "--output-prefix", "r", *GPT2, "--workers", 1, "--text-template", TEMPLATE,
              "--json-keys", "doc")
    same_dataset("t_doc_document", "r_doc_document")


def random_text(rng, n):
    pools = [
        "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789 ,.;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`",
        " \t\n\r\u00a0\u2003\u3000\u0085\u001c\u001f\ufeff",
        "éèêëàâäôöûüçñßøåæœ ÉÈÀÖÜ",
        "中文字符测试日本語ひらがなカタカナ한국어",
        "Ελληνικάрусскийעבריתالعربيةहिन्दीไทย",
        "😀🙃👍🏽🇫🇷🧑‍💻𝔘𝔫𝔦𝔠𝔬𝔡𝔢\U00010348\U0001F9EA",
        "\u0301\u0308\u20dd\u200d\u200b\u2028\u2029",
        "'s 't 're 've 'm 'll 'd 'S <|endoftext|> ",
    ]
    out = []
    for _ in range(n):
        pool = rng.choice(pools)
        out.append("".join(rng.choice(pool) for _ in range(rng.randrange(1, 12))))
    return "".join(out)


def test_random_unicode_several_keys_partitions():
    rng = random.Random(2024)
    with open("u.jsonl", "w", encoding="utf-8") as f:
        for i in range(300):
            rec = {"text": random_text(rng, rng.randrange(0, 30)), "title": random_text(rng, rng.randrange(0, 4))}
            if i % 7 == 0:
                rec["text"] = ""
            f.write(json.dumps(rec, ensure_ascii=(i % 2 == 0)) + "\n")
    both("u.jsonl", "--json-keys", "text", "title", "--append-eod", "--partitions", 3, chunk_bytes=2000)
    for key in ("text", "title"):
        same_dataset(f"t_{key}_document", f"r_{key}_document")


def test_crlf_bom_and_no_final_newline():
    rng = random.Random(5)
    lines = [json.dumps({"text": random_text(rng, 10)}) for _ in range(50)]
    with open("lf.jsonl", "w", encoding="utf-8", newline="") as f:
        f.write("\n".join(lines))  # no newline at the end
    with open("crlf.jsonl", "w", encoding="utf-8", newline="") as f:
        f.write("\ufeff" + "\r\n".join(lines) + "\r\n")
    tessera("preprocess", "--input", "crlf.jsonl", "--output-prefix", "c", *GPT2, "--workers", 1)
    reference("--input", "lf.jsonl", "--output-prefix", "r", *GPT2, "--workers", 1)
    same_dataset("c_text_document", "r_text_document")


def test_json_spellings():
    # Duplicate keys (the last wins, as in json.loads), escapes and surrogate pairs, numbers
    # beyond 64 bits in other fields (simdjson refuses them; the nlohmann path takes over),
    # nested values, whitespace around the object.
    lines = [
        '{"text": "first", "n": 1, "text": "second wins \\u00e9 \\ud83d\\ude00 \\" \\\\ \\/ \\t"}',
        '{"n": 123456789012345678901234567890, "text": "big number elsewhere", "x": [1, {"y": null}]}',
        '   {"text":"spaces around"}   ',
        '{"text": "<|endoftext|> is text, \\r\\n too"}',
        '{"meta": {"text": "nested is not the key"}, "text": ""}',
    ]
    with open("j.jsonl", "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    both("j.jsonl", "--append-eod")
    same_dataset("t_text_document", "r_text_document")


def test_workers_and_chunks_do_not_change_bytes():
    rng = random.Random(8)
    with open("w.jsonl", "w", encoding="utf-8") as f:
        for _ in range(200):
            f.write(json.dumps({"text": random_text(rng, rng.randrange(0, 20))}) + "\n")
    tessera("preprocess", "--input", "w.jsonl", "--output-prefix", "a", *GPT2, "--workers", 1)
    tessera("preprocess", "--input", "w.jsonl", "--output-prefix", "b", *GPT2, "--workers", 4, "--chunk-bytes", 1)
    same_dataset("a_text_document", "b_text_document")
    expect(os.path.getsize("a_text_document.idx") > 34, "empty output")


if __name__ == "__main__":
    run_module(globals())
