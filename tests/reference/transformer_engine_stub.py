"""A test-only stand-in for Transformer Engine 1.13 (the release megatron-core 0.10.0 pairs with),
enough for megatron-core's own Transformer Engine layer spec to build a GPTModel on the CPU and
save and load its state dict. Transformer Engine itself is NOT run here: its PyTorch extension
is built from source against CUDA, and its modules refuse to be built without a GPU
(transformer_engine/pytorch/module/base.py asserts torch.cuda.is_available()).

Only what a checkpoint sees is modelled, as TE 1.13's sources define it (the transformer-engine
1.13.0 wheel's transformer_engine/pytorch/), and nothing computes a forward:
  - module/linear.py Linear and module/layernorm_linear.py LayerNormLinear: the parameters in
    their registration order and shapes (LayerNormLinear: layer_norm_weight, layer_norm_bias
    unless RMSNorm, weight, bias; the TP split of parallel_mode 'column' / 'row'); no bias
    parameter without bias;
  - attention.py DotProductAttention: no parameters;
  - these three derive from TransformerEngineBaseModule (module/base.py), whose extra state
    without fp8 is an io.BytesIO holding torch.save(None); set_extra_state takes None, a uint8
    tensor (pickled state) or such a BytesIO, and refuses anything else;
  - LayerNorm / RMSNorm (ops/basic/layer_norm.py, rmsnorm.py over ops/op.py BasicOperation):
    weight (and LayerNorm's bias), extra state an empty tensor (torch.Tensor()) without fp8.
GroupedLinear exists for megatron-core's class definitions only. install() puts the modules in
sys.modules; it must run before megatron.core is imported.
"""
import io
import pickle
import sys
import types

import torch

VERSION = "1.13.0"


def _te_base_extra_state():
    """TransformerEngineBaseModule.get_extra_state without fp8: torch.save(None) in a BytesIO."""
    buffer = io.BytesIO()
    torch.save(None, buffer)
    return buffer


def _te_base_set_extra_state(state):
    """TransformerEngineBaseModule.set_extra_state's accepted forms; the state must be None or a
    dict of fp8 metadata (no fp8 module here takes one)."""
    if state is None:
        return
    if isinstance(state, torch.Tensor):
        state = pickle.loads(state.detach().cpu().numpy().tobytes())
    elif isinstance(state, io.BytesIO):
        state.seek(0)
        state = torch.load(state, map_location="cpu", weights_only=False)
    else:
        raise RuntimeError("Unsupported checkpoint format.")
    if state is not None and not isinstance(state, dict):
        raise RuntimeError("Transformer Engine extra state holds %r" % type(state))


class _BaseModule(torch.nn.Module):
    def get_extra_state(self):
        return _te_base_extra_state()

    def set_extra_state(self, state):
        _te_base_set_extra_state(state)

    def forward(self, *args, **kwargs):
        raise NotImplementedError("the Transformer Engine stand-in computes nothing")


def _parameter(*shape, dtype=None, device=None):
    return torch.nn.Parameter(torch.zeros(*shape, dtype=dtype or torch.float32, device=device))


def _split(in_features, out_features, parallel_mode, tp_size):
    if parallel_mode == "column":
        assert out_features % tp_size == 0
        out_features //= tp_size
    elif parallel_mode == "row":
        assert in_features % tp_size == 0
        in_features //= tp_size
    return in_features, out_features


class Linear(_BaseModule):
    def __init__(self, in_features, out_features, *, tp_size=1, bias=True, parallel_mode=None, params_dtype=None,
                 device="cuda", **_):
        super().__init__()
        self.in_features, self.out_features = _split(in_features, out_features, parallel_mode, tp_size)
        self.weight = _parameter(self.out_features, self.in_features, dtype=params_dtype, device=device)
        if bias:
            self.bias = _parameter(self.out_features, dtype=params_dtype, device=device)


class LayerNormLinear(_BaseModule):
    def __init__(self, in_features, out_features, *, tp_size=1, bias=True, normalization="LayerNorm",
                 parallel_mode=None, params_dtype=None, device="cuda", **_):
        super().__init__()
        self.layer_norm_weight = _parameter(in_features, dtype=params_dtype, device=device)
        if normalization != "RMSNorm":
            self.layer_norm_bias = _parameter(in_features, dtype=params_dtype, device=device)
        self.in_features, self.out_features = _split(in_features, out_features, parallel_mode, tp_size)
        self.weight = _parameter(self.out_features, self.in_features, dtype=params_dtype, device=device)
        if bias:
            self.bias = _parameter(self.out_features, dtype=params_dtype, device=device)


class DotProductAttention(_BaseModule):
    def __init__(self, *args, **kwargs):
        super().__init__()


class GroupedLinear(_BaseModule):
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("the Transformer Engine stand-in has no GroupedLinear")


class _Norm(torch.nn.Module):
    """ops' BasicOperation norms: extra state an empty tensor without fp8."""

    def __init__(self, hidden_size, *, with_bias, params_dtype=None, device="cuda", **_):
        super().__init__()
        self.weight = _parameter(hidden_size, dtype=params_dtype, device=device)
        if with_bias:
            self.bias = _parameter(hidden_size, dtype=params_dtype, device=device)

    def get_extra_state(self):
        return torch.Tensor()

    def set_extra_state(self, state):
        if state is None or state.numel() == 0:
            return
        if pickle.loads(state.detach().numpy().tobytes()) is not None:
            raise RuntimeError("the Transformer Engine stand-in keeps no fp8 state")

    def forward(self, *args, **kwargs):
        raise NotImplementedError("the Transformer Engine stand-in computes nothing")


class LayerNorm(_Norm):
    def __init__(self, hidden_size, **kwargs):
        super().__init__(hidden_size, with_bias=True, **kwargs)


class RMSNorm(_Norm):
    def __init__(self, hidden_size, **kwargs):
        super().__init__(hidden_size, with_bias=False, **kwargs)


class DelayedScaling:
    def __init__(self, *args, **kwargs):
        pass


class CudaRNGStatesTracker:
    def __init__(self):
        self.states_ = {}

    def is_initialized(self):
        return False


def install():
    """Registers transformer_engine, .pytorch, .pytorch.distributed, .common and .common.recipe."""
    if "transformer_engine" in sys.modules:
        assert getattr(sys.modules["transformer_engine"], "STUB", False), "a real Transformer Engine is installed"
        return
    te = types.ModuleType("transformer_engine")
    te.__version__ = VERSION
    te.STUB = True
    pt = types.ModuleType("transformer_engine.pytorch")
    for cls in (Linear, LayerNormLinear, DotProductAttention, GroupedLinear, LayerNorm, RMSNorm):
        setattr(pt, cls.__name__, cls)
    distributed = types.ModuleType("transformer_engine.pytorch.distributed")
    distributed.CudaRNGStatesTracker = CudaRNGStatesTracker
    pt.distributed = distributed
    common = types.ModuleType("transformer_engine.common")
    recipe = types.ModuleType("transformer_engine.common.recipe")
    recipe.DelayedScaling = DelayedScaling
    common.recipe = recipe
    te.pytorch, te.common = pt, common
    for m in (te, pt, distributed, common, recipe):
        sys.modules[m.__name__] = m
