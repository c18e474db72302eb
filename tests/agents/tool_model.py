"""A tiny Qwen2 over a character tokenizer of printable ASCII, with a chat template that renders
tools and tool calls (Qwen2.5's where TRL ships it, so TRL parses its tool calls too; else a
Hermes-style one of the same markup), saved as a user's model directory."""

import string
from pathlib import Path

# Qwen2.5's markup, shortened: tools in the system turn, calls as <tool_call> JSON, results as
# tool turns.
HERMES = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>\n{%- for tool in tools %}\n"
    "{{ tool | tojson }}{%- endfor %}\n</tools>\nCall a tool as <tool_call>\n"
    '{"name": <name>, "arguments": <args>}\n</tool_call><|im_end|>\n{%- endif %}\n'
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}\n<|im_start|>assistant\n{{ message.content }}"
    "{%- for call in message.tool_calls or [] %}\n<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}'
    "\n</tool_call>{%- endfor %}<|im_end|>"
    "{%- elif message.role == 'tool' %}\n<|im_start|>tool\n{{ message.content }}<|im_end|>"
    "{%- else %}\n<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}\n<|im_start|>assistant\n{%- endif %}"
)


def chat_template() -> str:
    try:
        import trl

        return (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    except (ImportError, OSError):
        return HERMES


def save(folder: Path, seed: int = 0) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from nostall.lm.models import char_tokenizer

    tokenizer = char_tokenizer(sorted(set(string.printable) - set("\t\r\x0b\x0c")))
    tokenizer.chat_template = chat_template()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
