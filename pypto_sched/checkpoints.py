"""``pypto_sched.checkpoints``: the public path of :mod:`pypto_sched.models.qwen3`, its home.

Everything that module exports is importable from here, as before the layering.
"""

from __future__ import annotations

from .models.qwen3 import (
    CONFIG_FILE as CONFIG_FILE,
)
from .models.qwen3 import (
    EMBED_TOKENS as EMBED_TOKENS,
)
from .models.qwen3 import (
    FINAL_NORM as FINAL_NORM,
)
from .models.qwen3 import (
    FLOAT_DTYPES as FLOAT_DTYPES,
)
from .models.qwen3 import (
    INDEX_FILE as INDEX_FILE,
)
from .models.qwen3 import (
    LAYER_TENSORS as LAYER_TENSORS,
)
from .models.qwen3 import (
    LM_HEAD as LM_HEAD,
)
from .models.qwen3 import (
    MAX_DIMENSION as MAX_DIMENSION,
)
from .models.qwen3 import (
    MAX_HEADER_BYTES as MAX_HEADER_BYTES,
)
from .models.qwen3 import (
    MAX_JSON_BYTES as MAX_JSON_BYTES,
)
from .models.qwen3 import (
    SAFETENSORS_DTYPES as SAFETENSORS_DTYPES,
)
from .models.qwen3 import (
    WEIGHTS_FILE as WEIGHTS_FILE,
)
from .models.qwen3 import (
    Checkpoint as Checkpoint,
)
from .models.qwen3 import (
    ModelConfig as ModelConfig,
)
from .models.qwen3 import (
    SafetensorsHeader as SafetensorsHeader,
)
from .models.qwen3 import (
    Tensor as Tensor,
)
from .models.qwen3 import (
    TensorInfo as TensorInfo,
)
from .models.qwen3 import (
    encode_safetensors as encode_safetensors,
)
from .models.qwen3 import (
    expected_tensors as expected_tensors,
)
from .models.qwen3 import (
    layer_tensor_names as layer_tensor_names,
)
from .models.qwen3 import (
    load_checkpoint as load_checkpoint,
)
from .models.qwen3 import (
    parse_safetensors_header as parse_safetensors_header,
)
from .models.qwen3 import (
    parse_shard_index as parse_shard_index,
)
from .models.qwen3 import (
    read_config as read_config,
)
from .models.qwen3 import (
    read_safetensors as read_safetensors,
)
from .models.qwen3 import (
    read_safetensors_header as read_safetensors_header,
)

__all__ = [
    "CONFIG_FILE",
    "EMBED_TOKENS",
    "FINAL_NORM",
    "FLOAT_DTYPES",
    "INDEX_FILE",
    "LAYER_TENSORS",
    "LM_HEAD",
    "MAX_DIMENSION",
    "MAX_HEADER_BYTES",
    "MAX_JSON_BYTES",
    "SAFETENSORS_DTYPES",
    "WEIGHTS_FILE",
    "Checkpoint",
    "ModelConfig",
    "SafetensorsHeader",
    "Tensor",
    "TensorInfo",
    "encode_safetensors",
    "expected_tensors",
    "layer_tensor_names",
    "load_checkpoint",
    "parse_safetensors_header",
    "parse_shard_index",
    "read_config",
    "read_safetensors",
    "read_safetensors_header",
]
