"""``torch.nn.modules``: the layer classes, one submodule per family as torch has them.

Each family's classes live in the submodule torch keeps them in (``conv``, ``linear``, ``loss``,
``batchnorm``, ``rnn``, ...), so ``from mpitensor.nn.modules.loss import _Loss`` works as
``from torch.nn.modules.loss import _Loss`` does, base classes that programs subclass included
(``_Loss``, ``_WeightedLoss``, ``_BatchNorm``, ``_DropoutNd``). A name torch has there and
mpitensor lacks is missing here too, so importing it fails at once with ImportError
(docs/porting.md lists what is missing). ``utils`` holds ``_pair``,
``consume_prefix_in_state_dict_if_present`` and their kind; ``mpitensor.nn`` re-exports every
layer.

Example:
    >>> from mpitensor.nn.modules.loss import _Loss
    >>> from mpitensor.nn.modules.batchnorm import _BatchNorm
    >>> import mpitensor.nn as nn
    >>> issubclass(nn.MSELoss, _Loss), issubclass(nn.BatchNorm2d, _BatchNorm)
    (True, True)
"""


from __future__ import annotations

import sys
import types
from typing import Dict, List

from . import (  # the module first: every family builds on it
    module,
    activation,
    adaptive,
    container,
    conv,
    distance,
    dropout,
    layers,
    lazy,
    linear,
    loss,
    normalization,
    padding,
    pooling,
    rms_norm,
    rnn,
    shape,
    sparse,
    transformer,
)

from . import utils

#: where mpitensor keeps its layers (the submodules of mpitensor.nn that define them)
_HOMES = (layers, activation, adaptive, container, conv, distance, dropout, lazy, linear, loss,
          module, normalization, padding, pooling, rms_norm, rnn, shape, sparse, transformer)

#: torch's submodule -> the names it holds there that mpitensor has
_PATHS: Dict[str, List[str]] = {
    "activation": ["Threshold", "ReLU", "RReLU", "Hardtanh", "ReLU6", "Sigmoid", "Hardsigmoid",
                   "Tanh", "SiLU", "Mish", "Hardswish", "ELU", "CELU", "SELU", "GLU", "GELU",
                   "Hardshrink", "LeakyReLU", "LogSigmoid", "Softplus", "Softshrink",
                   "MultiheadAttention", "PReLU", "Softsign", "Tanhshrink", "Softmin", "Softmax",
                   "Softmax2d", "LogSoftmax"],
    "adaptive": ["AdaptiveLogSoftmaxWithLoss"],
    "batchnorm": ["_NormBase", "_BatchNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
                  "SyncBatchNorm", "LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d"],
    "channelshuffle": ["ChannelShuffle"],
    "container": ["Container", "Sequential", "ModuleList", "ModuleDict", "ParameterList",
                  "ParameterDict"],
    "conv": ["_ConvNd", "_ConvTransposeNd", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d",
             "ConvTranspose2d", "ConvTranspose3d", "LazyConv1d", "LazyConv2d", "LazyConv3d",
             "LazyConvTranspose1d", "LazyConvTranspose2d", "LazyConvTranspose3d"],
    "distance": ["PairwiseDistance", "CosineSimilarity"],
    "dropout": ["_DropoutNd", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout",
                "FeatureAlphaDropout"],
    "flatten": ["Flatten", "Unflatten"],
    "fold": ["Fold", "Unfold"],
    "instancenorm": ["_InstanceNorm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d",
                     "LazyInstanceNorm1d", "LazyInstanceNorm2d", "LazyInstanceNorm3d"],
    "lazy": ["LazyModuleMixin"],
    "linear": ["Identity", "Linear", "Bilinear", "LazyLinear"],
    "loss": ["_Loss", "_WeightedLoss", "L1Loss", "NLLLoss", "NLLLoss2d", "PoissonNLLLoss",
             "GaussianNLLLoss", "KLDivLoss", "MSELoss", "BCELoss", "BCEWithLogitsLoss",
             "HingeEmbeddingLoss", "MultiLabelMarginLoss", "SmoothL1Loss", "HuberLoss",
             "SoftMarginLoss", "CrossEntropyLoss", "MultiLabelSoftMarginLoss",
             "CosineEmbeddingLoss", "MarginRankingLoss", "MultiMarginLoss", "TripletMarginLoss",
             "TripletMarginWithDistanceLoss", "CTCLoss", "LinearCrossEntropyLoss"],
    "linear_cross_entropy_options": ["LinearCrossEntropyOptions"],
    "module": ["Module"],
    "normalization": ["LocalResponseNorm", "CrossMapLRN2d", "LayerNorm", "GroupNorm",
                      "RMSNorm"],
    "padding": ["CircularPad1d", "CircularPad2d", "CircularPad3d", "ConstantPad1d",
                "ConstantPad2d", "ConstantPad3d", "ReflectionPad1d", "ReflectionPad2d",
                "ReflectionPad3d", "ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d",
                "ZeroPad1d", "ZeroPad2d", "ZeroPad3d"],
    "pixelshuffle": ["PixelShuffle", "PixelUnshuffle"],
    "pooling": ["MaxPool1d", "MaxPool2d", "MaxPool3d", "MaxUnpool1d", "MaxUnpool2d",
                "MaxUnpool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d", "FractionalMaxPool2d",
                "FractionalMaxPool3d", "LPPool1d", "LPPool2d", "LPPool3d", "AdaptiveMaxPool1d",
                "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "AdaptiveAvgPool1d",
                "AdaptiveAvgPool2d", "AdaptiveAvgPool3d"],
    "rnn": ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"],
    "sparse": ["Embedding", "EmbeddingBag"],
    "transformer": ["Transformer", "TransformerEncoder", "TransformerDecoder",
                    "TransformerEncoderLayer", "TransformerDecoderLayer"],
    "upsampling": ["Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d"],
}

#: the base classes torch keeps private that programs subclass
_PRIVATE = {"_Loss": loss._Loss, "_WeightedLoss": loss._WeightedLoss,
            "_BatchNorm": normalization._BatchNorm, "_DropoutNd": dropout._DropoutNd,
            "_NormBase": normalization._NormBase, "_InstanceNorm": normalization._InstanceNorm,
            "_ConvNd": conv._ConvNd, "_ConvTransposeNd": conv._ConvTransposeNd}


def _find(name: str) -> type:
    if name in _PRIVATE:
        return _PRIVATE[name]
    for home in _HOMES:
        if name in getattr(home, "__all__", ()) or (name == "Module" and home is module):
            return getattr(home, name)
    raise AssertionError(f"no mpitensor.nn submodule defines {name}")  # a wrong table above


def _submodule(name: str, names: List[str]) -> types.ModuleType:
    real = globals().get(name)
    if isinstance(real, types.ModuleType):  # a family file of its own
        for n in names:  # step 1 of the layout: a few classes still live in layers.py
            if not hasattr(real, n):
                setattr(real, n, _find(n))
        return real
    mod = types.ModuleType(f"{__name__}.{name}",
                           f"``torch.nn.modules.{name}``'s classes that mpitensor has.")
    for n in names:
        setattr(mod, n, _find(n))
    mod.__all__ = [n for n in names if not n.startswith("_")]
    sys.modules[mod.__name__] = mod
    return mod


for _name, _names in _PATHS.items():
    globals()[_name] = _submodule(_name, _names)
del _name, _names

# torch.nn.modules also holds every layer at its top level
__all__ = sorted({n for names in _PATHS.values() for n in names if not n.startswith("_")})
globals().update({n: _find(n) for n in __all__})
__all__ += ["utils", *_PATHS]
