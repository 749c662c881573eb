#!/opt/tessera/tools-venv/bin/python
"""Hugging Face folders written and read by both major versions of transformers: the pinned
4.47.1 (the test venv) and the current 5.x (the tools venv), which write RoPE and tokenizers
differently (transformers 5: "rope_parameters" instead of a top-level rope_theta and
rope_scaling; "tokenizer_class": "TokenizersBackend" for every fast tokenizer).

Runs with the tools venv's python (torch 2); --transformers 4 puts the test venv's
site-packages (transformers 4.47.1, tokenizers 0.21, huggingface_hub 0.x) first on the path.

    hf_versions.py --transformers {4,5} save OUT
        OUT/<case>/: a tiny random model saved by that version, with a byte-level BPE tokenizer
        (bos <|begin_of_text|> = 0, eos <|end_of_text|> = 1, a Llama-3-style template adding
        bos) saved beside it, and expected.safetensors: tokens I32 [2, 256] and that version's
        float32 logits F32 [2, 256, 300] (eager attention). Cases (CASES): llama (GQA 4/2, RoPE
        base 500000), llama3_8 and llama3_32 (the same with rope_type "llama3", Llama 3.1's and
        3.2's factors), qwen2 (q/k/v biases, tied, base 1e6), gpt2. The weights' std is 0.2, so
        that attention is sharp and RoPE's frequencies show in the logits.
        OUT/ids.json: {"texts": [...], "ids": [...]}, the tokenizer's input_ids of each text
        (AutoTokenizer, add_special_tokens as Megatron's HuggingFaceTokenizer calls it).
    hf_versions.py --transformers {4,5} check-logits HF_DIR=EXPECTED.safetensors [...]
        Each folder loads with AutoModelForCausalLM (no missing, unexpected or mismatched
        tensors) and its float32 logits on EXPECTED's tokens match EXPECTED's (the first
        vocab_size columns) within 1e-5 of the largest logit. Exit status 1 when any does not.
"""
import argparse
import json
import os
import sys

TEST_VENV_SITE = "/opt/tessera/test-venv/lib/python%d.%d/site-packages" % sys.version_info[:2]
SEQ, BATCH, VOCAB = 256, 2, 300
CASES = ("llama", "llama3_8", "llama3_32", "qwen2", "gpt2")
TEXTS = ["Hello world", "the quick brown fox jumps over the lazy dog 7 times",
         "<|begin_of_text|>inside<|end_of_text|>", "  spaces  and\ttabs\nnew lines ", "café 中文 😀", ""]
RTOL = 1e-5  # float32 forwards of the same weights (tessera's C++ one, transformers' eager one)


def import_transformers(version):
    if version == "4":
        if not os.path.isdir(TEST_VENV_SITE):
            sys.exit("hf_versions: %s is missing; run scripts/setup.sh (the test venv)" % TEST_VENV_SITE)
        sys.path.insert(0, TEST_VENV_SITE)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import transformers
    if not transformers.__version__.startswith(version + "."):
        sys.exit("hf_versions: wanted transformers %s.x, found %s" % (version, transformers.__version__))
    transformers.logging.set_verbosity_error()
    return transformers


def llama3(factor):
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}


def model_config(transformers, case):
    common = dict(vocab_size=VOCAB, initializer_range=0.2, bos_token_id=0, eos_token_id=1)
    llama = dict(common, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=SEQ, rms_norm_eps=1e-5, hidden_act="silu")
    if case == "gpt2":
        return transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=SEQ, **common)
    if case == "qwen2":
        return transformers.Qwen2Config(rope_theta=1e6, tie_word_embeddings=True, **llama)
    scaling = {"llama": None, "llama3_8": llama3(8.0), "llama3_32": llama3(32.0)}[case]
    return transformers.LlamaConfig(head_dim=16, rope_theta=500000.0, rope_scaling=scaling, attention_bias=False,
                                    mlp_bias=False, tie_word_embeddings=False, **llama)


def save_tokenizer(transformers, folder):
    """A byte-level BPE trained here (nothing can be downloaded), saved by save_pretrained."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog %d times" % i for i in range(200)], trainer)
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", 0)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                                                eos_token="<|end_of_text|>")
    fast.save_pretrained(folder)
    return fast


def forward_logits(model, tokens):
    import torch
    with torch.no_grad():
        return model(input_ids=torch.tensor(tokens, dtype=torch.long), use_cache=False).logits.float().numpy()


def save(transformers, out):
    import numpy as np
    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import safetensors_io
    torch.set_num_threads(1)
    tokens = np.random.RandomState(7).randint(0, VOCAB, size=(BATCH, SEQ)).astype(np.int32)
    for i, case in enumerate(CASES):
        folder = os.path.join(out, case)
        torch.manual_seed(1234 + i)
        model = transformers.AutoModelForCausalLM.from_config(model_config(transformers, case),
                                                              attn_implementation="eager").float().eval()
        model.save_pretrained(folder, safe_serialization=True)
        fast = save_tokenizer(transformers, folder)
        safetensors_io.write(os.path.join(folder, "expected.safetensors"),
                             [("tokens", "I32", tokens), ("logits", "F32", forward_logits(model, tokens))])
    ids = [fast(text).input_ids for text in TEXTS]
    with open(os.path.join(out, "ids.json"), "w") as f:
        json.dump({"transformers": transformers.__version__, "texts": TEXTS, "ids": ids}, f)
    print("hf_versions: transformers %s saved %s in %s" % (transformers.__version__, ", ".join(CASES), out))


def check_logits(transformers, pairs):
    import numpy as np
    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import safetensors_io
    torch.set_num_threads(1)
    ok = True
    for pair in pairs:
        hf_dir, expected = pair.split("=")
        dtype = {"torch_dtype" if transformers.__version__.startswith("4.") else "dtype": torch.float32}
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            hf_dir, attn_implementation="eager", output_loading_info=True, **dtype)
        problems = {k: v for k, v in info.items() if v}
        exp, _, _ = safetensors_io.read(expected, strict=False)
        want = safetensors_io.array(exp["logits"]).astype(np.float64)
        got = forward_logits(model.eval(), safetensors_io.array(exp["tokens"]).astype(np.int64)).astype(np.float64)
        V = model.config.vocab_size
        diff, scale = np.abs(got - want[..., :V]).max(), np.abs(want[..., :V]).max()
        good = not problems and got.shape == want[..., :V].shape and diff <= RTOL * scale
        print("%s transformers %s: %s, logits max |diff| %.3g of max |logit| %.3g%s" % (
            "ok  " if good else "FAIL", transformers.__version__, hf_dir, diff, scale,
            "" if not problems else ", loading: %s" % problems))
        ok = ok and good
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transformers", choices=("4", "5"), required=True)
    ap.add_argument("action", choices=("save", "check-logits"))
    ap.add_argument("paths", nargs="+")
    args = ap.parse_args()
    transformers = import_transformers(args.transformers)
    if args.action == "save":
        save(transformers, args.paths[0])
        return 0
    return 0 if check_logits(transformers, args.paths) else 1


if __name__ == "__main__":
    sys.exit(main())
