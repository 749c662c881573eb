"""A tiny byte-level BPE with an end-of-text token, trained with `tokenizers` and saved as a
HuggingFaceTokenizer folder (tokenizer.json and a PreTrainedTokenizerFast tokenizer_config.json),
for the tests that need a real Hugging Face tokenizer. `tokenizers` comes from the caller's
environment (the test venv or the tools venv)."""
import json
import os


def train_hf_tokenizer(folder, lines):
    """Trains on `lines`, writes FOLDER; returns (vocabulary size, id of <|end_of_text|>)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|end_of_text|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer)
    os.makedirs(folder)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|end_of_text|>"}, f)
    return tok.get_vocab_size(), tok.token_to_id("<|end_of_text|>")
