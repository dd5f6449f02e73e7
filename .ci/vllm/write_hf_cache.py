"""Write the config.json files vLLM's scheduler tests read into a local Hugging Face cache.

vLLM's tests name Hub models; their scheduler-level tests read only each model's
``config.json``. With ``HF_HUB_OFFLINE=1`` and ``HF_HOME`` pointing here, transformers and vLLM
find these files as cached snapshots, so no network is needed. The configs are written from
transformers' own config classes (no weights, no tokenizer).

Usage: python write_hf_cache.py HF_HOME
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from transformers import (
    LlavaConfig,
    OPTConfig,
    Qwen2_5_VLConfig,
    Qwen3Config,
    Qwen3NextConfig,
)

REVISION = "0" * 40


def configs() -> dict[str, dict[str, object]]:
    opt_350m = OPTConfig(
        hidden_size=1024,
        num_hidden_layers=24,
        ffn_dim=4096,
        num_attention_heads=16,
        word_embed_proj_dim=512,
    )
    return {
        "facebook/opt-125m": {**OPTConfig().to_dict(), "architectures": ["OPTForCausalLM"]},
        "facebook/opt-350m": {**opt_350m.to_dict(), "architectures": ["OPTForCausalLM"]},
        "llava-hf/llava-1.5-7b-hf": {
            **LlavaConfig().to_dict(),
            "architectures": ["LlavaForConditionalGeneration"],
        },
        "Qwen/Qwen3-Next-80B-A3B-Instruct": {
            **Qwen3NextConfig().to_dict(),
            "architectures": ["Qwen3NextForCausalLM"],
        },
        "Qwen/Qwen2.5-VL-3B-Instruct": {
            **Qwen2_5_VLConfig().to_dict(),
            "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        },
        "Qwen/Qwen3-0.6B": {**Qwen3Config().to_dict(), "architectures": ["Qwen3ForCausalLM"]},
    }


def main(hf_home: str) -> None:
    hub = Path(hf_home) / "hub"
    for name, config in configs().items():
        repo = hub / ("models--" + name.replace("/", "--"))
        snapshot = repo / "snapshots" / REVISION
        snapshot.mkdir(parents=True, exist_ok=True)
        # The Hub's configs name their dtype; without one vLLM looks for the weights' dtype
        # online, retrying with a 2-second sleep in every test.
        config = {**config, "dtype": "float16"}
        (snapshot / "config.json").write_text(json.dumps(config, indent=2, default=str))
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(REVISION)


if __name__ == "__main__":
    main(sys.argv[1])
