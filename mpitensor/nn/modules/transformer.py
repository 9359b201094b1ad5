"""Attention and transformer modules with ``torch.nn``'s names, parameters and state-dict keys:
:class:`MultiheadAttention`, :class:`TransformerEncoderLayer`, :class:`TransformerEncoder`,
:class:`TransformerDecoderLayer`, :class:`TransformerDecoder`, :class:`Transformer`.

A state dict saved from torch loads into these modules (and back): the names and shapes of the
parameters are torch's, so weights can be copied across to compare the two libraries.

Example:
    >>> import mpitensor as mt
    >>> mha = MultiheadAttention(8, 2, batch_first=True)
    >>> out, weights = mha(mt.ones(3, 5, 8), mt.ones(3, 5, 8), mt.ones(3, 5, 8))
    >>> tuple(out.shape), tuple(weights.shape)
    ((3, 5, 8), (3, 5, 5))
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Optional, Union

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor.tensor import Tensor, _new

from .. import functional as F  # noqa: N812 - torch's spelling
from .. import init
from .._functional.checks import is_int
from .activation import MultiheadAttention
from .container import ModuleList
from .dropout import Dropout
from .linear import Linear
from .module import Module
from .normalization import LayerNorm

__all__ = ["MultiheadAttention", "TransformerEncoderLayer", "TransformerEncoder",
           "TransformerDecoderLayer", "TransformerDecoder", "Transformer"]


def _activation(activation: Union[str, Callable]) -> Callable:
    if activation == "relu":
        return F.relu
    if activation == "gelu":
        return F.gelu
    if isinstance(activation, str):
        raise RuntimeError(f"activation should be relu/gelu, not {activation}")
    return activation


class _TransformerLayer(Module):
    """The constructor shared by the encoder and decoder layers (torch's signature): it
    registers the children in torch's order, so state-dict keys match: the layer's
    ``_parts - 1`` attentions (self, then cross), the feed-forward block, ``norm_first``, then
    one layer norm and one dropout per part (attention(s) and feed-forward)."""

    _parts: int

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation: Union[str, Callable] = F.relu,
                 layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        parts = self._parts
        for name in ("self_attn", "multihead_attn")[:parts - 1]:
            setattr(self, name, MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                                   batch_first=batch_first, **kw))
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **kw)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **kw)
        self.norm_first = norm_first
        for i in range(1, parts + 1):
            setattr(self, f"norm{i}", LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw))
        for i in range(1, parts + 1):
            setattr(self, f"dropout{i}", Dropout(dropout))
        self.activation = _activation(activation)

    def _ff_block(self, x: Tensor) -> Tensor:
        last = getattr(self, f"dropout{self._parts}")  # the feed-forward block's dropout
        return last(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerEncoderLayer(_TransformerLayer):
    """Self-attention and a feed-forward block, each with a residual connection and a layer
    norm (after each, or before with ``norm_first=True``).

    Args:
        d_model, nhead: model size and heads of the self-attention.
        dim_feedforward: the hidden size of the feed-forward block.
        dropout: dropout after attention, inside and after the feed-forward block.
        activation: ``'relu'``, ``'gelu'`` or a callable (a module is registered as a child).
        layer_norm_eps: the layer norms' eps.
        batch_first: (N, S, E) inputs instead of (S, N, E).
        norm_first: pre-norm instead of post-norm.
        bias: biases in the linear layers and layer norms.

    Example:
        >>> import mpitensor as mt
        >>> TransformerEncoderLayer(8, 2, 16)(mt.ones(5, 3, 8)).shape
        mpitensor.Size([5, 3, 8])
    """

    _parts = 2

    def _sa_block(self, x: Tensor, attn_mask: Optional[Tensor],
                  key_padding_mask: Optional[Tensor], is_causal: bool) -> Tensor:
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(x)

    def forward(self, src: Tensor, src_mask: Optional[Tensor] = None,
                src_key_padding_mask: Optional[Tensor] = None,
                is_causal: bool = False) -> Tensor:
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))


def _stack(owner: Module, layer: Module, num_layers: int, norm: Optional[Module]) -> None:
    """Give an encoder or decoder ``num_layers`` copies of ``layer`` (each with its own
    parameters) as ``layers``, and its final ``norm``."""
    if not is_int(num_layers) or num_layers < 0:
        raise ValueError(f"{type(owner).__name__}: num_layers must be a non-negative integer, "
                         f"got {num_layers!r}")
    owner.layers = ModuleList([copy.deepcopy(layer) for _ in range(num_layers)])
    owner.num_layers = num_layers
    owner.norm = norm


class TransformerEncoder(Module):
    """A stack of ``num_layers`` copies of ``encoder_layer`` (each with its own parameters),
    then an optional ``norm``.

    Example:
        >>> import mpitensor as mt
        >>> enc = TransformerEncoder(TransformerEncoderLayer(8, 2, 16), num_layers=2)
        >>> enc(mt.ones(5, 3, 8)).shape
        mpitensor.Size([5, 3, 8])
    """

    def __init__(self, encoder_layer: Module, num_layers: int, norm: Optional[Module] = None,
                 enable_nested_tensor: bool = True, mask_check: bool = True) -> None:
        super().__init__()
        _stack(self, encoder_layer, num_layers, norm)
        self.enable_nested_tensor = enable_nested_tensor
        self.mask_check = mask_check

    def forward(self, src: Tensor, mask: Optional[Tensor] = None,
                src_key_padding_mask: Optional[Tensor] = None,
                is_causal: Optional[bool] = None) -> Tensor:
        out = src
        for layer in self.layers:
            out = layer(out, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                        is_causal=bool(is_causal))
        return self.norm(out) if self.norm is not None else out


class TransformerDecoderLayer(_TransformerLayer):
    """Self-attention, cross-attention over the encoder's output ``memory`` and a
    feed-forward block, each with a residual connection and a layer norm.

    Example:
        >>> import mpitensor as mt
        >>> TransformerDecoderLayer(8, 2, 16)(mt.ones(4, 3, 8), mt.ones(5, 3, 8)).shape
        mpitensor.Size([4, 3, 8])
    """

    _parts = 3

    def _sa_block(self, x: Tensor, mask: Optional[Tensor], kpm: Optional[Tensor],
                  is_causal: bool) -> Tensor:
        x = self.self_attn(x, x, x, attn_mask=mask, key_padding_mask=kpm, need_weights=False,
                           is_causal=is_causal)[0]
        return self.dropout1(x)

    def _mha_block(self, x: Tensor, mem: Tensor, mask: Optional[Tensor],
                   kpm: Optional[Tensor], is_causal: bool) -> Tensor:
        x = self.multihead_attn(x, mem, mem, attn_mask=mask, key_padding_mask=kpm,
                                need_weights=False, is_causal=is_causal)[0]
        return self.dropout2(x)

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Optional[Tensor] = None,
                memory_mask: Optional[Tensor] = None,
                tgt_key_padding_mask: Optional[Tensor] = None,
                memory_key_padding_mask: Optional[Tensor] = None, tgt_is_causal: bool = False,
                memory_is_causal: bool = False) -> Tensor:
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask,
                                    memory_is_causal)
            return x + self._ff_block(self.norm3(x))
        x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask,
                                           memory_is_causal))
        return self.norm3(x + self._ff_block(x))


class TransformerDecoder(Module):
    """A stack of ``num_layers`` copies of ``decoder_layer``, then an optional ``norm``.

    Example:
        >>> import mpitensor as mt
        >>> dec = TransformerDecoder(TransformerDecoderLayer(8, 2, 16), num_layers=2)
        >>> dec(mt.ones(4, 3, 8), mt.ones(5, 3, 8)).shape
        mpitensor.Size([4, 3, 8])
    """

    def __init__(self, decoder_layer: Module, num_layers: int,
                 norm: Optional[Module] = None) -> None:
        super().__init__()
        _stack(self, decoder_layer, num_layers, norm)

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Optional[Tensor] = None,
                memory_mask: Optional[Tensor] = None,
                tgt_key_padding_mask: Optional[Tensor] = None,
                memory_key_padding_mask: Optional[Tensor] = None,
                tgt_is_causal: Optional[bool] = None, memory_is_causal: bool = False) -> Tensor:
        out = tgt
        for layer in self.layers:
            out = layer(out, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                        tgt_key_padding_mask=tgt_key_padding_mask,
                        memory_key_padding_mask=memory_key_padding_mask,
                        tgt_is_causal=bool(tgt_is_causal), memory_is_causal=memory_is_causal)
        return self.norm(out) if self.norm is not None else out


class Transformer(Module):
    """An encoder-decoder transformer (stacks of :class:`TransformerEncoderLayer` and
    :class:`TransformerDecoderLayer`, each followed by a layer norm).

    Example:
        >>> import mpitensor as mt
        >>> t = Transformer(8, 2, 1, 1, 16)
        >>> t(mt.ones(5, 3, 8), mt.ones(4, 3, 8)).shape
        mpitensor.Size([4, 3, 8])
    """

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation: Union[str, Callable] = F.relu,
                 custom_encoder: Optional[Module] = None, custom_decoder: Optional[Module] = None,
                 layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        for name, custom, kind, stack, n in (
                ("encoder", custom_encoder, TransformerEncoderLayer, TransformerEncoder,
                 num_encoder_layers),
                ("decoder", custom_decoder, TransformerDecoderLayer, TransformerDecoder,
                 num_decoder_layers)):
            if custom is None:
                layer = kind(d_model, nhead, dim_feedforward, dropout, activation,
                             layer_norm_eps, batch_first, norm_first, bias, **kw)
                custom = stack(layer, n, LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw))
            setattr(self, name, custom)
        self._init_weights()
        self.d_model = d_model
        self.nhead = nhead
        self.batch_first = batch_first

    def _init_weights(self) -> None:
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Optional[Tensor] = None,
                tgt_mask: Optional[Tensor] = None, memory_mask: Optional[Tensor] = None,
                src_key_padding_mask: Optional[Tensor] = None,
                tgt_key_padding_mask: Optional[Tensor] = None,
                memory_key_padding_mask: Optional[Tensor] = None,
                src_is_causal: Optional[bool] = None, tgt_is_causal: Optional[bool] = None,
                memory_is_causal: bool = False) -> Tensor:
        bdim = 0 if self.batch_first else 1
        if src.ndim == 3 and tgt.ndim == 3 and src.shape[bdim] != tgt.shape[bdim]:
            raise RuntimeError("Transformer: the batch sizes of src and tgt must be equal")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise RuntimeError(f"Transformer: the feature size of src and tgt must be d_model "
                               f"({self.d_model})")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask,
                            tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device: Any = None,
                                        dtype: Any = None) -> Tensor:
        """A (sz, sz) float mask: 0 on and below the diagonal, -inf above (causal)."""
        dt = _dt.get_default_dtype() if dtype is None else _dt.to_dtype(dtype)
        m = np.triu(np.full((sz, sz), -np.inf, dtype=dt), 1)
        t = _new(m)
        return t.to(device) if device is not None else t
