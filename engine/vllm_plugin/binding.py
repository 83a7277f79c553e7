"""The vLLM side: find the fused-MoE routers of a loaded model and hand them our callback.

vLLM 0.32's routers all derive from ``BaseRouter``, whose ``set_capture_fn``
takes a callback for the logical expert ids it selects (the seam vLLM's own
routed-experts capturer binds through).  vLLM offers no hook "after the model
is loaded" to a general plugin, so :func:`install_bind_hook` registers a
torch global forward pre-hook that fires on the first module call of the
process (the model runner calling the model), binds every router in that
module's tree, and removes itself: after that the forward path carries no
hook at all.

Everything here duck-types vLLM's objects (``module.router.set_capture_fn``,
``module.layer_id``, ``module.moe_config``) and imports vLLM lazily, so the
module loads, and its pure parts test, without vLLM installed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.hooks import RemovableHandle

from engine.stats import FloatArray
from engine.vllm_plugin.ranks import contiguous_rank_weights, eplb_rank_weights

logger = logging.getLogger("moeslo.vllm_plugin")


@dataclass(frozen=True, slots=True)
class MoeLayerView:
    """One fused-MoE layer as the plugin sees it."""

    layer_id: int
    router: Any
    """The layer's router (vLLM ``BaseRouter``): has ``set_capture_fn``."""
    num_experts: int
    """Logical experts (the ids the router emits before EPLB)."""
    num_physical: int
    ep_size: int
    use_ep: bool
    placement_strategy: str | None = None
    """The EP layout vLLM applied to this layer (its ``MoERunner.expert_placement_strategy``): vLLM falls back
    from a requested ``round_robin`` to ``linear`` for models without expert groups, with EPLB, or on
    all2all backends without round-robin tables.  None where the layer does not say (the config's is used)."""


class UnsupportedModelError(ValueError):
    """A MoE layer the plugin cannot read (the message names what it lacks)."""


def find_moe_layers(model: torch.nn.Module) -> list[MoeLayerView]:
    """Every distinct fused-MoE router in ``model``'s tree, by layer id (:class:`UnsupportedModelError`
    for a layer without a layer id or an expert count)."""
    views: dict[int, MoeLayerView] = {}
    seen: set[int] = set()
    for name, module in model.named_modules():
        router = getattr(module, "router", None)
        if router is None or not callable(getattr(router, "set_capture_fn", None)) or id(router) in seen:
            continue
        seen.add(id(router))
        if getattr(module, "is_monolithic", False):
            continue  # routes inside the kernel: the router seam never sees the ids (bind_model says so once)
        what = f"MoE layer {name or '<root>'} ({type(module).__name__})"
        try:
            layer_id = int(getattr(module, "layer_id"))  # noqa: B009 (a property on vLLM's runner)
        except (AttributeError, TypeError, ValueError) as exc:
            raise UnsupportedModelError(f"{what} has no layer id ({exc})") from exc
        config = getattr(module, "moe_config", None)
        parallel = getattr(config, "moe_parallel_config", None)
        num_experts = int(getattr(config, "num_logical_experts", 0) or getattr(router, "global_num_experts", 0))
        if num_experts < 1:
            raise UnsupportedModelError(f"{what} names no expert count (neither moe_config.num_logical_experts "
                                        "nor router.global_num_experts)")  # fmt: skip
        views[layer_id] = MoeLayerView(
            layer_id=layer_id,
            router=router,
            num_experts=num_experts,
            num_physical=int(getattr(config, "num_experts", num_experts) or num_experts),
            ep_size=int(getattr(parallel, "ep_size", 1) or 1),
            use_ep=bool(getattr(parallel, "use_ep", False)),
            placement_strategy=_applied_placement_strategy(module),
        )
    return [views[k] for k in sorted(views)]


def _applied_placement_strategy(module: torch.nn.Module) -> str | None:
    strategy = getattr(module, "expert_placement_strategy", None)  # vLLM's MoERunner: its expert map manager's
    return str(strategy) if strategy in ("linear", "round_robin") else None


def monolithic_moe_layers(model: torch.nn.Module) -> int:
    """Fused-MoE layers of ``model`` whose kernel routes inside itself (not countable here)."""
    return sum(1 for module in model.modules()
               if getattr(module, "is_monolithic", False)
               and callable(getattr(getattr(module, "router", None), "set_capture_fn", None)))  # fmt: skip


def install_bind_hook(bind: Callable[[torch.nn.Module], bool]) -> RemovableHandle:
    """Call ``bind(module)`` on module calls until it returns True, then unhook.

    A module ``bind`` refused is not offered again, nor is anything in its tree: a model with no
    MoE layer (a dense model) is scanned once, not on every call of every block forever.  A ``bind``
    that raises unhooks too, with one error line: the hook runs inside vLLM's first forward pass,
    which must go on (uninstrumented) rather than fail."""
    handle: RemovableHandle | None = None
    refused: set[int] = set()

    def hook(module: torch.nn.Module, args: Any) -> None:
        if handle is None or id(module) in refused or next(module.children(), None) is None:
            return  # leaf modules never hold a whole MoE model
        try:
            bound = bind(module)
        except Exception as exc:
            handle.remove()
            logger.error("moeslo: cannot count this model's MoE routing: %s; vLLM runs without the plugin's "
                         "counting", exc, exc_info=not isinstance(exc, UnsupportedModelError))  # fmt: skip
            return
        if bound:
            handle.remove()
        else:
            refused.update(id(m) for m in module.modules())

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    return handle


def vllm_row_filter(topk_ids: torch.Tensor, dp_rank: int = 0) -> tuple[int, int] | torch.Tensor | None:
    """Rows of ``topk_ids`` that are this rank's real tokens, from vLLM's forward context.

    Returns None (skip) outside a forward context and in profile or warm-up
    runs, which vLLM runs without attention metadata.  vLLM pads a batch at
    its end and marks the padding in ``is_padding``: on the CPU the real rows
    are counted as a span, on an accelerator as a mask (no host sync).  Under
    data parallelism only this DP rank's rows count when the router saw every
    rank's tokens (its padding left out too: ``is_padding`` covers this rank's
    rows): ``dp_rank`` is read once, while the model is built (vLLM's config is
    not "current" during its forward passes; read then, every rank took rank
    0's slot of ``num_tokens_across_dp``).

    Under a CUDA graph (vLLM's ``cudagraph_runtime_mode`` is not NONE) the call
    is a capture, whose kernels every replay runs and whose host decisions
    hold for good: the rows are a mask over vLLM's persistent ``is_padding``
    buffer, read on the device (the capture's dummy rows are all padding), or
    None where there is no such mask.  Piecewise captures come without
    attention metadata and are recorded too.
    """
    if not is_forward_context_available():
        return None
    ctx = get_forward_context()
    graph = getattr(getattr(ctx, "cudagraph_runtime_mode", None), "name", "NONE") != "NONE"
    if ctx.attn_metadata is None and not graph:
        return None
    n = int(topk_ids.shape[0])
    start, end = 0, n
    dp = ctx.dp_metadata
    if dp is not None:
        across = dp.num_tokens_across_dp_cpu
        local = int(across[dp_rank].item())
        if n == int(across.sum().item()) and n != local:
            end = int(across[: dp_rank + 1].sum().item())
            start = end - local
        elif n != local:
            return None  # a layout we cannot attribute to this rank: skip rather than miscount
    pad = ctx.is_padding
    if pad is None or int(pad.shape[0]) != end - start:
        # No mask, or a reshaped batch (sequence parallel) it does not line up with; a graph would replay
        # a span's rows, padding included, at every step.
        return None if graph else (start, end)
    if graph:
        return real_rows_mask(n, start, end, pad.to(dtype=torch.bool)) if pad.device == topk_ids.device else None
    if pad.device.type == "cpu":
        return (start, end - int(pad.numpy().sum()))  # padding is a suffix (vLLM's _prepare_padding_mask)
    return real_rows_mask(n, start, end, pad.to(device=topk_ids.device, dtype=torch.bool))


def real_rows_mask(num_rows: int, start: int, end: int, is_padding: torch.Tensor) -> torch.Tensor:
    """Over ``num_rows`` rows: this rank's rows ``start:end`` that ``is_padding`` (one entry per row of
    this rank) does not mark, built on the mask's device."""
    keep = ~is_padding
    if (start, end) == (0, num_rows):
        return keep
    mask = torch.zeros(num_rows, dtype=torch.bool, device=is_padding.device)
    mask[start:end] = keep
    return mask


def _vllm_forward_context() -> tuple[Callable[[], bool], Callable[[], Any]]:
    try:
        from vllm.forward_context import get_forward_context, is_forward_context_available
    except ImportError:
        return (lambda: False), (lambda: None)
    return is_forward_context_available, get_forward_context


is_forward_context_available, get_forward_context = _vllm_forward_context()


def is_first_tp_rank() -> bool:
    """Every TP rank routes the same tokens: only the first one counts."""
    try:
        from vllm.distributed.parallel_state import get_tp_group

        return bool(get_tp_group().rank_in_group == 0)
    except (ImportError, AssertionError, AttributeError):
        return True


def _pp_group() -> Any | None:
    try:
        from vllm.distributed.parallel_state import get_pp_group

        return get_pp_group()
    except (ImportError, AssertionError, AttributeError):
        return None


def pipeline_parallel_size() -> int:
    """vLLM's pipeline stages (1 outside vLLM)."""
    group = _pp_group()
    return 1 if group is None else int(group.world_size)


def pipeline_rank() -> int:
    """This worker's pipeline stage, 0 first (0 outside vLLM)."""
    group = _pp_group()
    return 0 if group is None else int(group.rank_in_group)


def moe_layer_labels(layer_ids: tuple[int, ...], *, pipeline_stages: int = 1) -> tuple[int, ...]:
    """The ``layer`` label of each MoE layer (model layer ids, ascending): its order among the model's MoE
    layers, 0 first, as our engine and vLLM's EPLB number them (DeepSeek-V3's first MoE layer, model layer
    3, is layer 0).  A pipeline stage holds some layers only and cannot tell how many MoE layers the stages
    before it hold: there the label stays the model's layer index, which no two stages share."""
    return tuple(range(len(layer_ids))) if pipeline_stages <= 1 else layer_ids


@dataclass(frozen=True, slots=True)
class VllmLabels:
    model_name: str
    engine: str
    placement_strategy: str = "linear"
    dp_rank: int = 0
    """vLLM's data-parallel rank (its slot in the forward context's ``num_tokens_across_dp``)."""
    model_layers: int | None = None
    """The model's decoder layers, all pipeline stages together (vLLM's ``get_total_num_hidden_layers``)."""


class LabelProbe:
    """Reads the labels from vLLM's config while the model is being built.

    vLLM's config is "current" only while the model is constructed, not
    during forward passes, so a torch global module-registration hook (it
    fires as the model's submodules are assigned) reads it once then unhooks.
    """

    def __init__(self) -> None:
        self.labels: VllmLabels | None = None
        self._handle: RemovableHandle | None = torch.nn.modules.module.register_module_module_registration_hook(
            self._on_register
        )

    def _on_register(self, module: torch.nn.Module, name: str, submodule: torch.nn.Module | None) -> None:
        labels = current_vllm_labels()
        if labels is not None and self._handle is not None:
            self.labels = labels
            self._handle.remove()
            self._handle = None

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def current_vllm_labels() -> VllmLabels | None:
    """Labels from vLLM's current config, None outside ``set_current_vllm_config``."""
    try:
        from vllm.config import get_current_vllm_config_or_none
    except ImportError:
        return None
    config = get_current_vllm_config_or_none()
    model_config = getattr(config, "model_config", None)
    if config is None or model_config is None:
        return None
    served = model_config.served_model_name
    name = served[0] if isinstance(served, list | tuple) else served
    parallel = config.parallel_config
    return VllmLabels(
        model_name=str(name or model_config.model),
        engine=str(parallel.data_parallel_rank),
        placement_strategy=str(getattr(parallel, "expert_placement_strategy", "linear") or "linear"),
        dp_rank=int(parallel.data_parallel_rank),
        model_layers=_total_layers(model_config),
    )


def _total_layers(model_config: Any) -> int | None:
    try:
        return int(model_config.get_total_num_hidden_layers())
    except (AttributeError, TypeError, ValueError):
        return None


def rank_weights_for(
    layers: list[MoeLayerView], virtual_ranks: int, strategy: str
) -> Callable[[], tuple[FloatArray, str]]:
    """The rank map of the imbalance gauges: EPLB's live map, vLLM's EP layout, or virtual EP.  ``strategy``
    is the one vLLM's config requested, used where the layer does not say which one vLLM applied."""
    first = layers[0]
    if first.use_ep and first.ep_size > 1:
        static = contiguous_rank_weights(first.num_experts, first.ep_size, first.placement_strategy or strategy)
    else:
        if virtual_ranks > first.num_experts:  # ranks without an expert would read as a large false imbalance
            logger.warning("moeslo: MOESLO_VLLM_EP_RANKS=%d is above the model's %d experts: %d virtual ranks",
                           virtual_ranks, first.num_experts, first.num_experts)  # fmt: skip
            virtual_ranks = first.num_experts
        static = contiguous_rank_weights(first.num_experts, virtual_ranks, "linear")
    static_source = "ep" if first.use_ep and first.ep_size > 1 else "virtual"

    def weights() -> tuple[FloatArray, str]:
        stacked = []
        for view in layers:
            l2p = _eplb_map(view)
            if l2p is None:
                return static, static_source
            stacked.append(eplb_rank_weights(l2p, view.num_physical, view.ep_size))
        return np.stack(stacked), "eplb"

    return weights


def _eplb_map(view: MoeLayerView) -> np.ndarray[Any, Any] | None:
    state = getattr(view.router, "eplb_state", None)
    l2p = getattr(state, "logical_to_physical_map", None)
    if l2p is None or not view.use_ep:
        return None
    return np.asarray(l2p.detach().cpu().numpy(), dtype=np.int64)
