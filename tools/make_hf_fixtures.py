"""Writes the golden fixtures of `tests/test_hf.py`: a small random Hugging Face
`Mamba2ForCausalLM` or `NemotronHForCausalLM` of Mamba layers only (transformers' own PyTorch
code, float32, CPU), its safetensors and config.json, and its logits for a prompt and 20
greedy decode steps.

Needs torch and transformers (not installed by the project; CI only reads the fixtures):

    python -m venv /tmp/hf && /tmp/hf/bin/pip install torch transformers safetensors numpy
    /tmp/hf/bin/python tools/make_hf_fixtures.py --out=tests/fixtures/hf_mamba2
    /tmp/hf/bin/python tools/make_hf_fixtures.py --model=nemotron_h \
        --out=tests/fixtures/hf_nemotron_h

Geometry: 2 layers, d_model 64, 2 heads of head_dim 64, 2 groups, dstate 16, K=4, vocab 64,
chunk_size 16 (a 40-token prompt spans three of transformers' chunks). The SSM parameters
are drawn away from their initial values (A_log, dt_bias, D, norm weights), so that no
term is trivially 1 or 0. The Nemotron-H model has time_step_min = 0.3, so that its
multi-token path (which clamps dt to it) and its one-token decode (which does not) differ.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch
import transformers
from transformers import (Mamba2Config, Mamba2ForCausalLM, NemotronHConfig,
                          NemotronHForCausalLM)

PROMPT_LEN, DECODE_STEPS = 40, 20


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--model", choices=["mamba2", "nemotron_h"], default="mamba2")
  args = parser.parse_args()
  torch.manual_seed(args.seed)
  rng = np.random.default_rng(args.seed)
  common = dict(hidden_size=64, expand=2, n_groups=2, conv_kernel=4, vocab_size=64,
                chunk_size=16, tie_word_embeddings=False, layer_norm_epsilon=1e-5,
                pad_token_id=0, bos_token_id=1, eos_token_id=2)
  if args.model == "mamba2":
    cfg = Mamba2Config(num_heads=2, head_dim=64, state_size=16, num_hidden_layers=2, **common)
    model = Mamba2ForCausalLM(cfg).float().eval()
  else:
    cfg = NemotronHConfig(mamba_num_heads=2, mamba_head_dim=64, ssm_state_size=16,
                          layers_block_type=["linear_attention", "linear_attention"],
                          time_step_min=0.3, **common)
    model = NemotronHForCausalLM(cfg).float().eval()
  H = 2
  with torch.no_grad():
    base = model.backbone if hasattr(model, "backbone") else model.model
    for blk in base.layers:
      mix = blk.mixer
      mix.A_log.copy_(torch.tensor(np.log(rng.uniform(1, 16, H)), dtype=torch.float32))
      dt0 = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), H))
      mix.dt_bias.copy_(torch.tensor(dt0 + np.log(-np.expm1(-dt0)), dtype=torch.float32))
      mix.D.copy_(torch.tensor(rng.uniform(0.5, 1.5, H), dtype=torch.float32))
      mix.norm.weight.copy_(torch.tensor(rng.uniform(0.5, 1.5, mix.norm.weight.shape),
                                         dtype=torch.float32))
      blk.norm.weight.copy_(torch.tensor(rng.uniform(0.5, 1.5, blk.norm.weight.shape),
                                         dtype=torch.float32))
  prompt = torch.tensor(rng.integers(3, cfg.vocab_size, (1, PROMPT_LEN)))
  with torch.no_grad():
    prompt_logits = model(prompt, use_cache=False).logits[0].numpy()
  os.makedirs(args.out, exist_ok=True)
  model.save_pretrained(args.out, safe_serialization=True)
  with open(os.path.join(args.out, "versions.json"), "w") as f:
    json.dump({"torch": torch.__version__, "transformers": transformers.__version__,
               "seed": args.seed}, f, indent=1)
  if args.model == "nemotron_h":
    # transformers 5.24 cannot decode a Nemotron-H of Mamba layers only with its cache
    # (building the attention mask asks the cache for a sequence length, which it keeps for
    # attention layers only), so this fixture has the prompt's logits only.
    np.savez_compressed(os.path.join(args.out, "golden.npz"), prompt=prompt[0].numpy(),
                        prompt_logits=prompt_logits)
    print(f"wrote {args.out}: prompt logits")
    return
  with torch.no_grad():
    gen = model.generate(prompt, max_new_tokens=DECODE_STEPS, do_sample=False,
                         output_logits=True, return_dict_in_generate=True,
                         eos_token_id=None, pad_token_id=0, min_new_tokens=DECODE_STEPS)
  tokens = gen.sequences[0, PROMPT_LEN:].numpy()
  step_logits = torch.stack(gen.logits, 0)[:, 0].numpy()       # [steps, V]
  np.savez_compressed(os.path.join(args.out, "golden.npz"), prompt=prompt[0].numpy(),
                      prompt_logits=prompt_logits, tokens=tokens, step_logits=step_logits)
  print(f"wrote {args.out}: generated {tokens.tolist()}")


if __name__ == "__main__":
  main()
