"""A tiny random-weight Llama model and its tokenizer, built locally for tests.

Nothing is downloaded: the tokenizer is a word-level ``tokenizers`` model over a
fixed word list, wrapped as ``PreTrainedTokenizerFast``; the model is a
``LlamaForCausalLM`` with a few thousand parameters. Both are written with
``save_pretrained`` so any server that loads a Hugging Face folder can serve it.

Why the special tokens are suppressed: random weights pick any token, and a
server stops at EOS or holds back text it cannot decode. A word-level vocabulary
has no byte tokens, so every id decodes to a whole word; the special tokens get
zero output rows and are listed in ``generation_config.suppress_tokens`` (zero
rows alone do not keep a logit from being the largest), so with temperature 0 the
model emits exactly ``max_tokens`` words, deterministically.
"""

from __future__ import annotations

from pathlib import Path

SPECIAL_TOKENS = ("<unk>", "<pad>", "<s>", "</s>")

# A fixed vocabulary: ids are stable across runs, so outputs are reproducible.
WORDS = tuple(
    """the a an of to in on at by for with from and or but not is are was were be
    been model token server engine commit flag boot sample metric verify draft
    target cycle graph cache batch prefill decode kernel thread worker rank node
    river stone cloud light green blue red yellow quick slow bright dark small large
    north south east west spring summer autumn winter morning evening night day
    apple bread cheese honey lemon olive pepper salt sugar tea water wine garden
    house window door table chair paper pencil letter number answer question story
    one two three four five six seven eight nine ten hundred thousand first last
    run walk jump read write speak listen think build break measure count compare
    """.split()
)

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def build_tokenizer():
    """A word-level fast tokenizer over ``SPECIAL_TOKENS + WORDS``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    # Words are joined by single spaces when decoded; a streamed token is " word".
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_tiny_llama(path: str | Path, *, seed: int = 0, hidden_size: int = 32, heads: int = 4,
                     kv_heads: int = 2, layers: int = 2) -> Path:
    """Write a tiny random Llama and its tokenizer to ``path``; return the path.

    >>> build_tiny_llama(tmp_path / "tiny")     # doctest: +SKIP

    vLLM's CPU attention takes head sizes of 32 and up (``hidden_size / heads``):
    ``build_tiny_llama(path, hidden_size=128, heads=2, kv_heads=2)``.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    special_ids = [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight[special_ids] = 0.0
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        suppress_tokens=special_ids,
        do_sample=False,
    )
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
