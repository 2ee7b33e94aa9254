"""gg.models: real models through gg's graphs. `m = gg.models.load(path)` loads a GGUF file or a
Hugging Face checkpoint directory (llama, qwen2); `m.generate(prompt)` streams text."""
from .model import Model, load

__all__ = ["Model", "load"]
