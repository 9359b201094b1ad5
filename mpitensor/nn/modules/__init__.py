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

from typing import Dict, List

from . import (  # noqa: F401 - the families, each torch's nn.modules.<family>
    activation,
    adaptive,
    batchnorm,
    channelshuffle,
    container,
    conv,
    distance,
    dropout,
    flatten,
    fold,
    instancenorm,
    lazy,
    linear,
    linear_cross_entropy_options,
    loss,
    module,
    normalization,
    padding,
    pixelshuffle,
    pooling,
    rnn,
    sparse,
    transformer,
    upsampling,
    utils,
)

#: torch's submodule -> the names it holds there that mpitensor has (each file here holds them)
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
_PRIVATE = {n: getattr(globals()[sub], n) for sub, names in _PATHS.items() for n in names
            if n.startswith("_")}

# torch.nn.modules also holds every layer at its top level
__all__ = sorted({n for names in _PATHS.values() for n in names if not n.startswith("_")})
globals().update({n: getattr(globals()[sub], n) for sub, names in _PATHS.items() for n in names})
__all__ += ["utils", *_PATHS]
