"""Ready models built from `einjit.nn`: a GPT (`models.gpt`), its generation routines
(`models.generate`) and the Hugging Face GPT-2 loader (`models.gpt2`)."""

from einjit.models.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
