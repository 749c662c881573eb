"""Megatron-LM's model-file tokenizers as tools/preprocess_data.py uses them, written after
megatron/training/tokenizer/tokenizer.py (core_r0.10.0) on the real libraries: transformers'
AutoTokenizer for _HuggingFaceTokenizer, sentencepiece for _Llama2Tokenizer and
_GPTSentencePieceTokenizer. Each has what preprocess_data.py reads: tokenize(text), eod and
vocab_size, and detokenize(ids). Test-only: needs the test venv (scripts/setup.sh), never Debian's python3.
"""


class HuggingFaceTokenizer:
    """_HuggingFaceTokenizer: AutoTokenizer.from_pretrained(path); tokenize = tok(text).input_ids
    (add_special_tokens stays True); eod = eos_token_id; vocab_size = len(tok)."""

    def __init__(self, path):
        import transformers
        self._tokenizer = transformers.AutoTokenizer.from_pretrained(pretrained_model_name_or_path=path)
        self.vocab_size = len(self._tokenizer)
        self.eod = self._tokenizer.eos_token_id

    def tokenize(self, text):
        return self._tokenizer(text).input_ids

    def detokenize(self, ids):
        return self._tokenizer.decode(ids)


class _SentencePiece:
    def __init__(self, model_file):
        import sentencepiece
        self.tokenizer = sentencepiece.SentencePieceProcessor(model_file=model_file)
        # _populate_vocab: one entry per piece id, so len(vocab) is the piece count.
        self.vocab_size = len({self.tokenizer.id_to_piece(i): i for i in range(len(self.tokenizer))})
        self.eod = self.tokenizer.eos_id()

    def detokenize(self, ids):
        return self.tokenizer.decode_ids(ids)


class Llama2Tokenizer(_SentencePiece):
    """_Llama2Tokenizer: [bos] + sp.encode(text), no eos; eod = eos_id."""

    def tokenize(self, text):
        return [self.tokenizer.bos_id()] + self.tokenizer.encode(text)


class GPTSentencePieceTokenizer(_SentencePiece):
    """_GPTSentencePieceTokenizer: sp.encode_as_ids(text); eod = eos_id."""

    def tokenize(self, text):
        return self.tokenizer.encode_as_ids(text)


def build(tokenizer_type, tokenizer_model):
    return {"HuggingFaceTokenizer": HuggingFaceTokenizer, "Llama2Tokenizer": Llama2Tokenizer,
            "GPTSentencePieceTokenizer": GPTSentencePieceTokenizer}[tokenizer_type](tokenizer_model)
