"""einjit.nn: layers, losses, initializers, optimizers and learning-rate schedules, all written in
einjit's notation so a model's whole training step compiles into one routine."""

from einjit.nn import schedules
from einjit.nn.attention import MLP, MultiHeadAttention, TransformerBlock, scaled_dot_product_attention
from einjit.nn.clip import ClipGradNorm, clip_grad_norm
from einjit.nn.init import init_code, set_init
from einjit.nn.layers import (
                              GELU,
                              Activation,
                              AvgPool2d,
                              BatchNorm,
                              Conv2d,
                              Dropout,
                              Embedding,
                              Flatten,
                              Layer,
                              LayerNorm,
                              Linear,
                              MaxPool2d,
                              ReLU,
                              Sequential,
)
from einjit.nn.losses import bce_with_logits, cross_entropy, hinge, mse, one_hot
from einjit.nn.optim import SGD, Adam, AdamW, Optimizer

__all__ = ["GELU", "MLP", "SGD", "Activation", "Adam", "AdamW", "AvgPool2d", "BatchNorm", "ClipGradNorm", "Conv2d",
           "Dropout", "Embedding", "Flatten", "Layer", "LayerNorm", "Linear", "MaxPool2d", "MultiHeadAttention",
           "Optimizer", "ReLU", "Sequential", "TransformerBlock", "bce_with_logits", "clip_grad_norm", "cross_entropy",
           "hinge", "init_code", "mse", "one_hot", "scaled_dot_product_attention", "schedules", "set_init"]
