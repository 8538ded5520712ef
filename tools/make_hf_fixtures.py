"""Writes tests/golden/hf/: small Hugging Face fixtures for loom's tokenizer.json reader, its
import of GPT-2 (and, later, Llama) checkpoints and its export (tools/make_hf_fixtures.sh runs
this in its own venv; the C++ tests read the outputs and need neither Python nor a network).

  tokenizers/<variant>.json   byte-level BPE tokenizers trained here with `tokenizers` on tiny
                              Shakespeare plus a multilingual paragraph, one per pre-tokenizer
                              style: gpt2 (ByteLevel regex), smollm (Digits + ByteLevel), llama3
                              (Split regex + ByteLevel, ignore_merges, BOS template, one vocabulary
                              token no merge reaches), qwen2 (NFC + Split regex + ByteLevel, Qwen2's
                              <|endoftext|>, <|im_start|> and <|im_end|>)
  tokenizers/expected.json    {"texts": [...], "ids": {variant: [[ids of text k], ...]}}: what
                              `tokenizers` gives with add_special_tokens=False
  gpt2/                       GPT2LMHeadModel, 2 layers, hidden 32, 4 heads, vocab of the gpt2
                              tokenizer, 64 positions, tied head, random weights (every parameter,
                              LayerNorm scales around 1): config.json, model.safetensors,
                              tokenizer.json, expected.safetensors
  llama_tied/, llama_untied/  LlamaForCausalLM, 2 layers, hidden 32, 4 heads, 2 key/value heads
                              (GQA), SwiGLU 64, RoPE theta 10000, vocab of the llama3 tokenizer,
                              tied / untied head; same files
  llama3/                     llama_untied's shape with rope_type llama3 (factor 8, low/high 1/4,
                              original_max_position_embeddings 64: of the four frequencies one is
                              kept, one blended, two divided by 8), 128 positions
  qwen2_tied/, qwen2_untied/  Qwen2ForCausalLM of that shape (random q/k/v biases), theta 1e6, the
                              qwen2 tokenizer
  mistral/                    MistralForCausalLM of that shape, sliding_window 4 (shorter than the
                              fixtures' 8 tokens and the 40 of the greedy continuation)
  qwen3/                      Qwen3ForCausalLM, 2 layers, hidden 32, 4 heads of head_dim 16 (so
                              q_proj is 64 wide, not 32), 2 key/value heads, q_norm and k_norm
                              weights 1 + N(0, 0.1^2), tied head, the qwen2 tokenizer (Qwen3
                              keeps Qwen2's); same files, and in
                              expected.safetensors "greedy/prompt" (int32 [1, 8]) and
                              "greedy/tokens" (int32 [32]): transformers' greedy continuation
  gemma3/                     Gemma3ForCausalLM (text), 3 layers (local, global, local: sliding_window 4,
                              rope bases 1e4 and 1e6), hidden 32, 4 heads of head_dim 16, 2 key/value
                              heads, query_pre_attn_scalar 12, tied head, the gemma SentencePiece-style
                              tokenizer (vocabulary 676)

expected.safetensors holds "inputs" and "labels" (int32 [2, 8]: fixed ids), "logits" (float32
[2, 8, V]), "loss" (float32 []: mean cross-entropy of logits against labels) and "grad/<name>"
(float32: the gradient of that loss with respect to parameter <name>, for a few parameters);
llama3/, qwen2_*/, mistral/ and gemma3/ also "greedy" (int32 [32]): the 32 tokens transformers' greedy
decoding (argmax of a full forward pass per token, first maximum) appends to inputs[0].

qwen2_tied/, qwen2_untied/, qwen3/, mistral/ and gemma3/ are chat models as transformers 5 saves
one: chat_template.jinja (the family's chat format, from tools/chat_templates/) and
tokenizer_config.json (the family's bos, eos and pad tokens, as the fixture's tokenizer spells them).

Deterministic: running it twice gives the same files.
"""

import argparse
import json
import os
import shutil
import unicodedata

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

import hf_tokenizer_fixtures
from hf_tokenizer_fixtures import MULTILINGUAL

LLAMA3 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN2 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Encoded by every tokenizer variant; expected ids come from `tokenizers`. All NFC (the qwen2
# variant's normalizer would change a non-NFC text, which loom refuses instead).
TEXTS = [
    "Hello world! It's 2024.\n\n  ok",
    "I'm sure they'll go; WE'VE won, YOU'RE 'right' I'D say, isn't it? 'ſ and K",
    "a   b\tc\r\n\r\n  \r\n x 12345678 1,234.5 0.000001",
    "café 日本語, naïve½ x²\u00a0y — \u2028 \u3000end  \n\t\n   \nfoo!!\r\n\r\nbar?\n:-)  😀😀 ٣٤٥ ١٢ 𝟘𝟙",
    "it<|endoftext|> the<|endoftext|><|endoftext|>x",
    "<|begin_of_text|>ROMEO: zebra zebras, a zebra!<|end_of_text|>",
    "",
    " ",
    "  leading and trailing spaces  ",
]

# The token added to the llama3 variant's vocabulary that no merge produces: with
# ignore_merges = true a pre-token equal to it is that one token.
UNREACHABLE = "Ġzebra"


def train_tokenizer(texts, vocab_size, pre_tokenizer, normalizer=None, specials=("<|endoftext|>",)):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=list(specials),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def make_tokenizers(out, corpus):
    variants = {}
    variants["gpt2"] = train_tokenizer(
        corpus, 320, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    variants["smollm"] = train_tokenizer(
        corpus, 320,
        pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]))
    llama = train_tokenizer(
        corpus, 320,
        pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]),
        specials=("<|begin_of_text|>", "<|end_of_text|>", "<|endoftext|>"))
    llama.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B:1",
                                      special_tokens=[("<|begin_of_text|>", llama.token_to_id("<|begin_of_text|>"))]),
    ])
    # ignore_merges and a vocabulary token that the merges never build (Llama 3's tokenizer.json
    # has both): rebuilt from its JSON.
    j = json.loads(llama.to_str())
    j["model"]["ignore_merges"] = True
    assert UNREACHABLE not in j["model"]["vocab"]
    j["model"]["vocab"][UNREACHABLE] = len(j["model"]["vocab"])
    variants["llama3"] = Tokenizer.from_str(json.dumps(j))
    variants["qwen2"] = train_tokenizer(
        corpus, 320,
        pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]),
        normalizer=normalizers.NFC(), specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"))

    os.makedirs(out, exist_ok=True)
    expected = {"texts": TEXTS, "ids": {}}
    for name, tok in variants.items():
        tok.save(os.path.join(out, name + ".json"))
        expected["ids"][name] = [tok.encode(t, add_special_tokens=False).ids for t in TEXTS]
        for t in TEXTS:
            assert unicodedata.is_normalized("NFC", t)
            assert tok.decode(tok.encode(t, add_special_tokens=False).ids, skip_special_tokens=False) == t, (name, t)
    # The ignore_merges token is actually used, so the test would see its absence.
    assert variants["llama3"].token_to_id(UNREACHABLE) in sum(expected["ids"]["llama3"], [])
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=0)
        f.write("\n")
    return variants


def randomize(model, gen):
    """Every parameter random, so a misplaced or misread tensor changes the logits: norm scales
    1 + N(0, 0.1^2), everything else N(0, 0.1^2)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * 0.1
            is_scale = p.dim() == 1 and ("ln_" in name or "norm" in name) and name.endswith("weight")
            p.copy_(noise + 1.0 if is_scale else noise)


def greedy(model, prompt, n):
    ids = prompt.reshape(1, -1)
    with torch.no_grad():
        for _ in range(n):
            nxt = model(input_ids=ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.reshape(1, 1)], dim=1)
    return ids[0, prompt.numel():]


def write_expected(model, out, vocab_size, grad_names, gen, with_greedy=False, generate=0):
    inputs = torch.randint(0, vocab_size, (2, 8), generator=gen)
    labels = torch.randint(0, vocab_size, (2, 8), generator=gen)
    model.zero_grad()
    logits = model(input_ids=inputs).logits.float()
    loss = F.cross_entropy(logits.reshape(-1, vocab_size), labels.reshape(-1))
    loss.backward()
    params = dict(model.named_parameters())
    tensors = {
        "inputs": inputs.to(torch.int32).contiguous(),
        "labels": labels.to(torch.int32).contiguous(),
        "logits": logits.detach().contiguous(),
        "loss": loss.detach().reshape(()).contiguous(),
    }
    for n in grad_names:
        tensors["grad/" + n] = params[n].grad.detach().contiguous()
    if with_greedy:
        tensors["greedy"] = greedy(model, inputs[0], 32).to(torch.int32).contiguous()
    if generate:
        prompt = torch.randint(0, vocab_size, (1, 8), generator=gen)
        with torch.no_grad():
            out_ids = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                     max_new_tokens=generate, min_new_tokens=generate, eos_token_id=None,
                                     pad_token_id=0)
        tensors["greedy/prompt"] = prompt.to(torch.int32).contiguous()
        tensors["greedy/tokens"] = out_ids[0, prompt.shape[1]:].to(torch.int32).contiguous()
    save_file(tensors, os.path.join(out, "expected.safetensors"), metadata={"loss": repr(loss.item())})


# The chat format of each family (tools/chat_templates/<name>.jinja) and the special tokens its
# tokenizer_config.json names, in the fixture tokenizer's spelling: Qwen's Instruct models end a
# sequence with <|im_end|>; Mistral's <s>/</s> are the llama3 tokenizer's begin and end of text.
CHAT = {
    "qwen2": ("qwen2.5", {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "qwen3": ("qwen3", {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "mistral": ("mistral", {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}),
    "gemma3": ("gemma3", {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}),
}
TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat_templates")


def save_model(model, out, tokenizer_file, chat=None):
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out, safe_serialization=True)
    gen_cfg = os.path.join(out, "generation_config.json")
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)  # not read by loom
    shutil.copy(tokenizer_file, os.path.join(out, "tokenizer.json"))
    if chat is not None:
        template, tokens = CHAT[chat]
        shutil.copy(os.path.join(TEMPLATES, template + ".jinja"), os.path.join(out, "chat_template.jinja"))
        with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump({**tokens, "tokenizer_class": "TokenizersBackend"}, f, indent=2)
            f.write("\n")


def make_gpt2(out, tokenizer_file, vocab_size):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=vocab_size, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                     activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     layer_norm_epsilon=1e-5, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg).float().eval()
    gen = torch.Generator().manual_seed(1)
    randomize(model, gen)
    save_model(model, out, tokenizer_file)
    write_expected(model, out, vocab_size,
                   ["transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.attn.c_attn.weight",
                    "transformer.h.0.attn.c_attn.bias", "transformer.h.1.mlp.c_proj.weight", "transformer.ln_f.weight"],
                   gen)


def make_causal_lm(out, model_class, cfg, tokenizer_file, vocab_size, seed, grads, with_greedy=False, chat=None):
    torch.manual_seed(seed)
    model = model_class(cfg).float().eval()
    gen = torch.Generator().manual_seed(seed + 1)
    randomize(model, gen)
    save_model(model, out, tokenizer_file, chat)
    grads = grads + ["model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"]  # the head's
    write_expected(model, out, vocab_size, grads, gen, with_greedy)


LLAMA_GRADS = ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
               "model.layers.1.mlp.gate_proj.weight", "model.layers.1.post_attention_layernorm.weight",
               "model.norm.weight"]
# The shape every Llama-style fixture shares.
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             rms_norm_eps=1e-6, hidden_act="silu", attention_dropout=0.0, bos_token_id=0, eos_token_id=1,
             attn_implementation="eager")


def make_llama(out, tokenizer_file, vocab_size, tied, seed):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab_size, max_position_embeddings=64, rope_theta=10000.0, attention_bias=False,
                      mlp_bias=False, tie_word_embeddings=tied, **SMALL)
    make_causal_lm(out, LlamaForCausalLM, cfg, tokenizer_file, vocab_size, seed, LLAMA_GRADS)


def make_llama3(out, tokenizer_file, vocab_size, seed):
    from transformers import LlamaConfig, LlamaForCausalLM

    # head_dim 8: inverse frequencies 1, 0.1, 0.01, 0.001, wavelengths 6.3, 63, 628, 6283. With
    # original 64, low 1, high 4 every band is used: 6.3 < 16 is kept, 16 <= 63 <= 64 blended,
    # 628 and 6283 (> 64) divided by 8.
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    cfg = LlamaConfig(vocab_size=vocab_size, max_position_embeddings=128, rope_parameters=rope, attention_bias=False,
                      mlp_bias=False, tie_word_embeddings=False, **SMALL)
    make_causal_lm(out, LlamaForCausalLM, cfg, tokenizer_file, vocab_size, seed, LLAMA_GRADS, with_greedy=True)


# Qwen's config.json: <|endoftext|> begins, <|im_end|> (the Instruct models') ends (ids 0 and 2 of the
# qwen2 tokenizer).
QWEN_SPECIALS = dict(bos_token_id=0, eos_token_id=2)


def make_qwen2(out, tokenizer_file, vocab_size, tied, seed):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=vocab_size, max_position_embeddings=128, rope_parameters={"rope_type": "default",
                      "rope_theta": 1000000.0}, use_sliding_window=False, tie_word_embeddings=tied,
                      **{**SMALL, **QWEN_SPECIALS})
    grads = ["model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.k_proj.weight",
             "model.layers.1.self_attn.v_proj.bias", "model.layers.1.mlp.gate_proj.weight", "model.norm.weight"]
    make_causal_lm(out, Qwen2ForCausalLM, cfg, tokenizer_file, vocab_size, seed, grads, with_greedy=True,
                   chat="qwen2")


def make_mistral(out, tokenizer_file, vocab_size, seed):
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=vocab_size, max_position_embeddings=128, head_dim=8, sliding_window=4,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
                        **SMALL)
    make_causal_lm(out, MistralForCausalLM, cfg, tokenizer_file, vocab_size, seed, LLAMA_GRADS, with_greedy=True,
                   chat="mistral")


def make_qwen3(out, tokenizer_file, vocab_size, seed):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                      rope_theta=10000.0, rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False,
                      tie_word_embeddings=True, attention_dropout=0.0, use_sliding_window=False,
                      attn_implementation="eager", **QWEN_SPECIALS)
    model = Qwen3ForCausalLM(cfg).float().eval()
    gen = torch.Generator().manual_seed(seed + 1)
    randomize(model, gen)
    save_model(model, out, tokenizer_file, "qwen3")
    grads = ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_norm.weight",
             "model.layers.1.self_attn.k_norm.weight", "model.layers.1.self_attn.o_proj.weight",
             "model.norm.weight", "model.embed_tokens.weight"]
    write_expected(model, out, vocab_size, grads, gen, generate=32)


def make_gemma3(out, tokenizer_file, vocab_size, seed):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    # Chosen so that each of Gemma 3's features changes the logits: layers 0 and 2 local (window 4
    # of the 8 and 40 tokens, rope base 1e4), layer 1 global (rope base 1e6); query_pre_attn_scalar
    # 12, not head_dim 16; embeddings times sqrt(32). Norm weights are the w of 1 + w.
    cfg = Gemma3TextConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=12,
                           sliding_window=4, sliding_window_pattern=2, max_position_embeddings=128,
                           rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                           rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                           attention_dropout=0.0, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                           attn_implementation="eager")
    assert cfg.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    grads = ["model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.q_norm.weight",
             "model.layers.0.pre_feedforward_layernorm.weight", "model.layers.1.post_attention_layernorm.weight",
             "model.layers.2.mlp.gate_proj.weight"]
    make_causal_lm(out, Gemma3ForCausalLM, cfg, tokenizer_file, vocab_size, seed, grads, with_greedy=True,
                   chat="gemma3")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shakespeare", required=True)
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    corpus = hf_tokenizer_fixtures.corpus_of(a.shakespeare)
    tok_dir = os.path.join(a.out, "tokenizers")
    variants = make_tokenizers(tok_dir, corpus)
    hf_tokenizer_fixtures.make_all(tok_dir, corpus)
    make_gpt2(os.path.join(a.out, "gpt2"), os.path.join(tok_dir, "gpt2.json"), variants["gpt2"].get_vocab_size())
    llama_vocab = variants["llama3"].get_vocab_size()
    make_llama(os.path.join(a.out, "llama_tied"), os.path.join(tok_dir, "llama3.json"), llama_vocab, True, 10)
    make_llama(os.path.join(a.out, "llama_untied"), os.path.join(tok_dir, "llama3.json"), llama_vocab, False, 20)
    make_llama3(os.path.join(a.out, "llama3"), os.path.join(tok_dir, "llama3.json"), llama_vocab, 30)
    qwen_vocab = variants["qwen2"].get_vocab_size()
    make_qwen2(os.path.join(a.out, "qwen2_tied"), os.path.join(tok_dir, "qwen2.json"), qwen_vocab, True, 40)
    make_qwen2(os.path.join(a.out, "qwen2_untied"), os.path.join(tok_dir, "qwen2.json"), qwen_vocab, False, 50)
    make_mistral(os.path.join(a.out, "mistral"), os.path.join(tok_dir, "llama3.json"), llama_vocab, 60)
    make_qwen3(os.path.join(a.out, "qwen3"), os.path.join(tok_dir, "qwen2.json"), qwen_vocab, 30)
    gemma_tok = os.path.join(tok_dir, "gemma.json")
    make_gemma3(os.path.join(a.out, "gemma3"), gemma_tok, Tokenizer.from_file(gemma_tok).get_vocab_size(), 70)


if __name__ == "__main__":
    main()
