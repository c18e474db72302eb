"""Generation's memory does not grow with vocabulary times length: at a 151,936-token
vocabulary (Qwen2's) the sampling noise is drawn a step at a time once the batch's would pass
64 MiB. (Before: drawn up front as [max_new_tokens, B, V] float32, 1.2 GiB here at 128 new
tokens.)"""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

PEAK = r"""
import json, resource, sys, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from nostall.lm.decoder import Decoder
from nostall.lm.generation import Completions, GenerationEngine, SamplingConfig
C = int(sys.argv[1])
torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(vocab_size=151936, hidden_size=16, intermediate_size=32,
    num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True,
    max_position_embeddings=256)).eval()
engine = GenerationEngine(Decoder(model), SamplingConfig(max_new_tokens=C), eos_token_id=2,
                          pad_token_id=0, banned_token_ids=[0, 1])
batch = Completions.empty(16, 6, C)
batch.prompt_ids.random_(3, 100)
batch.prompt_mask.fill_(True)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
engine.generate(batch, torch.Generator().manual_seed(0), 4)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"added_mib": (after - before) / 1024}))
"""


def _added_mib(new_tokens: int) -> float:
    run = subprocess.run(
        [sys.executable, "-c", PEAK, str(new_tokens)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])["added_mib"]


def test_generation_memory_is_bounded_at_a_real_vocabulary():
    short, long = _added_mib(8), _added_mib(128)
    # 128 new tokens' noise up front would add 1,187 MiB over 8's; a step at a time, the cache
    # and a few [B, V] rows (9.3 MiB each) are all that grow.
    assert long - short < 96, (short, long)
