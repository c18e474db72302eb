"""A tiny model that calls tools, for benchmarks/lm/agents.py: a Qwen2 of a few hundred thousand
parameters over a character tokenizer of printable ASCII (Qwen's <|im_start|> and <|im_end|> as
tokens, <|im_end|> its end of turn), with Qwen2.5's chat template (TRL's copy, which TRL parses
tool calls from), briefly fine-tuned on conversations in which the assistant calls `lookup`
every turn. Both trainers then run the same episodes: every turn a tool call, every call the
latency the benchmark sets.

    python -m benchmarks.lm.tool_caller FOLDER   # builds and checks it (about a minute)
"""

from __future__ import annotations

import string
import sys
from pathlib import Path

import torch

SPECIAL = ["<pad>", "<|im_start|>", "<|im_end|>"]
CALL = '<tool_call>\n{"name": "lookup", "arguments": {}}\n</tool_call>'


def lookup() -> str:
    """Looks the answer up (a remote call).

    Returns:
        The answer.
    """
    return "ok"


def tokenizer():
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # (Ġ and Ċ: a space and a newline as transformers' Qwen2 tokenizer, which it reads a Qwen2
    # folder's tokenizer as, spells them: its byte-level alphabet)
    chars = [*sorted(set(string.printable) - set("\t\r\x0b\x0c")), "Ġ", "Ċ"]
    vocab = {token: i for i, token in enumerate(SPECIAL + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL])
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>"],
    )
    import trl

    out.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    return out


def conversation(rounds: int) -> list[dict]:
    call = {"type": "function", "function": {"name": "lookup", "arguments": {}}}
    messages = [{"role": "user", "content": "Look it up."}]
    for _ in range(rounds):
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "lookup", "content": "ok"},
        ]
    return [*messages, {"role": "assistant", "content": "", "tool_calls": [call]}]


def build(folder: str | Path, seed: int = 0, steps: int = 800) -> Path:
    """The model, fine-tuned, saved in `folder` with its tokenizer."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    folder = Path(folder)
    made = tokenizer()
    config = Qwen2Config(
        vocab_size=len(made),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=made.eos_token_id,
        pad_token_id=made.pad_token_id,
        bos_token_id=None,
    )
    # (Saved beside the config and read back, as both trainers read it: transformers reads a
    # Qwen2 folder's tokenizer as Qwen2's, byte-level, a space spelled Ġ and a newline Ċ.)
    config.save_pretrained(folder)
    made.save_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    texts = [
        tok.apply_chat_template(conversation(r), tools=[lookup], tokenize=True, return_dict=False)
        for r in (0, 1, 2, 3)
    ]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    for step in range(steps):  # (one conversation a step: 0 to 3 rounds before the call)
        ids = torch.tensor(texts[step % len(texts)])[None]
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    print(f"tool_caller: fine-tuned {steps} steps, last loss {loss.item():.4f}")
    model.eval()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def calls_tools(folder: str | Path) -> bool:
    """Whether the saved model's greedy turn is the tool call, after 0 and 2 rounds."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    for rounds in (0, 2):
        head = conversation(rounds)[:-1]
        ids = tok.apply_chat_template(
            head, tools=[lookup], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        out = model.generate(torch.tensor([ids]), max_new_tokens=80, do_sample=False)
        text = tok.decode(out[0, len(ids) :], skip_special_tokens=False)
        if not text.replace("\n", "").startswith(CALL.replace("\n", "") + "<|im_end|>"):
            return False
    return True


if __name__ == "__main__":
    built = build(sys.argv[1])
    print(built, "calls tools:", calls_tools(built))
