"""Integrations with Hugging Face Transformers (attention registry), Trainer / TRL and Accelerate data loading.

Call :func:`register` once (``import hf_hsap`` does it) before ``attn_implementation="hsap"`` is used.
"""
from .transformers import ATTN_NAME, hsap_attention_forward, hsap_mask_function, is_registered, register

__all__ = ["ATTN_NAME", "hsap_attention_forward", "hsap_mask_function", "is_registered", "register"]
