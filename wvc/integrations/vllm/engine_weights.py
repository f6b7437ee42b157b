"""Writing checkpoint tensors into a running vLLM model, exactly, on either of its layouts.

A follower holds the version in checkpoint form (the names and shapes of the safetensors
files); vLLM holds it in its own: fused parameters (q, k and v in one ``qkv_proj``, gate and
up in one ``gate_up_proj``) and, on its CPU backend, every linear layer's weight copied into
a oneDNN-packed form with the parameter itself left empty. ``EngineWeights.apply`` takes
the names of the checkpoint tensors that changed and sends each the way its module needs
(docs/training.md, "Into a vLLM engine"):

- a module whose weight is packed away (an empty parameter beside a ``cpu_linear``): a
  layerwise reload of every checkpoint tensor of that module (vLLM rebuilds a module only
  once all of them have arrived; sending only the changed ones left every output NaN);
- any other module (every module on a GPU): vLLM's checkpoint patch loader, sparse (the
  flat indices of the changed elements and their values) or dense, whichever has cost less
  per element in this engine so far (on CPU the sparse loader was ~50x slower than dense);
- then every module that keeps a packed copy of a weight that changed (the LM head, tied to
  the embedding or not) is repacked: a reload does not refresh that copy, and outputs were
  silently off until it was. ``prepare`` builds those copies beforehand, from the new
  values in the follower's host copy (on a server, while the engine still serves): the
  write then only puts them in place (the LM head's packing was a third of a 494M apply).

Which checkpoint tensors make a module is derived from the model's own
``packed_modules_mapping`` and ``hf_to_vllm_mapper``, not from a table of names. vLLM is
imported inside the calls: this module is imported only in a vLLM worker.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

SPARSE_MAX_CHANGED = 0.1  # past this share of a tensor's elements, a patch is sent dense
# vLLM's sparse patch loader stages each patched tensor whole (checkpoint-shaped, NaN where
# unchanged, plus a NaN mask: ~1.5x its bytes) on the values' device, the host here, and its
# copy into a device parameter then moves all of it: a sparse patch saves no link bytes and
# costs that memory. A tensor larger than this goes dense (the host copy's own tensor, nothing
# staged), and one loader call stages at most this much: the first 494M update, sparse while
# the costs were unmeasured, staged the tied embedding (272 MB) and peaked the engine 390 MB
# over the steps after it (issue 65).
SPARSE_STAGING_BYTES = 64 << 20


@dataclass
class _Costs:
    """Seconds per element of tensor patched, measured in this engine for each kind of patch
    (a moving average): a sparse patch is chosen only where it has cost no more than dense.
    A tensor with few changed elements goes sparse until sparse is measured, then dense once
    (so both are: dense was never tried before, and on the CPU backend vLLM's sparse loader
    cost several times a dense write of the same tensors), then whichever cost less."""

    per_element: dict = field(default_factory=dict)  # "dense" / "sparse" -> seconds

    def choose(self, numel: int, changed: int | None) -> str:
        if changed is None or changed > SPARSE_MAX_CHANGED * numel:
            return "dense"
        dense, sparse = self.per_element.get("dense"), self.per_element.get("sparse")
        if sparse is None:
            return "sparse"
        if dense is None:
            return "dense"
        return "sparse" if sparse <= dense else "dense"

    def record(self, kind: str, seconds: float, elements: int) -> None:
        if elements <= 0:
            return
        rate = seconds / elements
        was = self.per_element.get(kind)
        self.per_element[kind] = rate if was is None else 0.5 * was + 0.5 * rate


@dataclass
class Applied:
    """What one apply sent into the engine (for reports and tests)."""

    reloaded: list = field(default_factory=list)  # checkpoint tensors sent by a layerwise reload
    dense: list = field(default_factory=list)  # checkpoint tensors sent as dense patches
    sparse: dict = field(default_factory=dict)  # checkpoint tensor -> changed elements sent
    repacked: list = field(default_factory=list)  # vLLM modules whose packed copy was rebuilt
    prepared: list = field(default_factory=list)  # those of them whose copy prepare() built
    seconds: float = 0.0

    def to_json(self) -> dict:
        return dict(self.__dict__)


class EngineWeights:
    """The weights of one vLLM model (one worker's), addressed by checkpoint names."""

    def __init__(self, model, vllm_config, checkpoint_names):
        self.model, self.vllm_config = model, vllm_config
        packed = getattr(model, "packed_modules_mapping", None) or {}
        self._fused = {part: whole for whole, parts in packed.items() for part in parts}
        self._mapper = getattr(model, "hf_to_vllm_mapper", None)
        self._modules = dict(model.named_modules())
        # checkpoint name -> the vLLM module it lands in; module -> all its checkpoint names
        self.module_of = {name: self._module_path(name) for name in checkpoint_names}
        self.members: dict[str, list[str]] = {}
        for name, path in self.module_of.items():
            if path is not None:
                self.members.setdefault(path, []).append(name)
        self.costs = _Costs()

    def _module_path(self, name: str) -> str | None:
        """The vLLM module a checkpoint tensor is loaded into, or None when the model has no
        such module (vLLM skips it: a tied ``lm_head.weight``, a rotary buffer)."""
        mapped = name
        if self._mapper is not None:
            mapped = self._mapper.map_name(name)
            if mapped is None:
                return None
        parts = mapped.split(".")[:-1]
        if parts and parts[-1] in self._fused:
            parts[-1] = self._fused[parts[-1]]
        path = ".".join(parts)
        return path if path in self._modules else None

    def _packed_away(self, path: str) -> bool:
        """Whether a module's weight lives only in a packed copy (the CPU backend's linear
        layers): the parameter is empty and no patch can reach it."""
        module = self._modules[path]
        weight = getattr(module, "weight", None)
        return hasattr(module, "cpu_linear") and weight is not None and weight.numel() == 0

    def reloaded_whole(self, name: str) -> bool:
        """Whether ``apply`` sends checkpoint tensor ``name`` by a reload of its whole module
        (its weight packed away), so that its changed elements' indices go unused."""
        path = self.module_of.get(name)
        return path is not None and self._packed_away(path)

    def prepare(self, host: dict, changed) -> dict:
        """The packed copies ``apply`` would rebuild after sending ``changed`` (the LM head's),
        built now from the new values in ``host`` on a module of their own: module path ->
        its new ``cpu_linear``, which ``apply`` puts in place of the old. Modules that share a
        weight share one packed copy (vLLM packs a tied embedding's weight twice, once for the
        LM head and once for the embedding module itself: 272 MB each at 494M). vLLM's CPU dispatch
        copies the weight into its packed form on every path but one (zentorch without
        prepacking keeps the tensor it is given, which the next fetch would overwrite): there,
        and for a weight that is not one checkpoint tensor of the module's own shape and dtype
        (fused, sharded, padded) or beside a bias (one path converts the bias in place), nothing
        is prepared and ``apply`` repacks as before."""
        import torch
        from vllm.platforms import current_platform

        zen = getattr(current_platform, "is_zen_cpu", None)
        if not current_platform.is_cpu() or zen is None or zen():
            return {}
        patched = {self.module_of.get(name) for name in changed} - {None}
        prepared, built = {}, {}
        for path, source in self._repack_targets(patched):
            module, names = self._modules[path], self.members.get(source, [])
            weight = module.weight
            if len(names) != 1 or getattr(module, "bias", None) is not None:
                continue
            new = host[names[0]]
            if tuple(new.shape) != tuple(weight.shape) or new.dtype != weight.dtype:
                continue
            if id(weight) not in built:  # a tied embedding and LM head: one packed copy for both
                shadow = torch.nn.Module()
                shadow.register_parameter("weight", torch.nn.Parameter(new, requires_grad=False))  # (no copy)
                module.quant_method.process_weights_after_loading(shadow)
                built[id(weight)] = shadow.cpu_linear
            prepared[path] = built[id(weight)]
        return prepared

    def apply(self, host: dict, changed, patches: dict | None = None, prepared: dict | None = None) -> Applied:
        """Send the checkpoint tensors named ``changed`` (their values in ``host``, the
        follower's copy, the new version whole) into the engine. ``patches``: each tensor's
        changed flat indices (None: all of it), where known; ``prepared``: what ``prepare``
        built from these same values."""
        import torch

        t0 = time.perf_counter()
        done = Applied()
        reload: set[str] = set()
        patched_modules: set[str] = set()
        dense, sparse = [], []
        for name in changed:
            path = self.module_of.get(name)
            if self.reloaded_whole(name):
                reload.update(self.members[path])
                continue
            if path is not None:
                patched_modules.add(path)
            tensor = host[name]
            idx = None if patches is None else patches.get(name)
            kind = self.costs.choose(tensor.numel(), None if idx is None else int(idx.numel()))
            if tensor.numel() * tensor.element_size() > SPARSE_STAGING_BYTES:
                kind = "dense"
            values = tensor.reshape(-1)
            if kind == "sparse":
                values = values[idx]
                if tensor.is_floating_point() and bool(torch.isnan(values).any()):
                    kind = "dense"  # vLLM's sparse loader marks untouched elements with NaN
            if kind == "sparse":
                sparse.append((name, tensor, values, idx))
            else:
                dense.append((name, tensor, tensor.reshape(-1), None))
        for kind, batch in (("dense", dense), ("sparse", sparse)):
            if batch:
                started = time.perf_counter()
                _load_patches(self.model, batch, SPARSE_STAGING_BYTES if kind == "sparse" else None)
                self.costs.record(kind, time.perf_counter() - started, sum(t.numel() for _, t, _, _ in batch))
        if reload:
            _reload(self.vllm_config, self.model, [(name, host[name]) for name in sorted(reload)])
        prepared = prepared or {}
        done.repacked = self._repack(patched_modules, prepared)
        done.prepared = [p for p in done.repacked if p in prepared]
        done.reloaded, done.dense = sorted(reload), sorted(n for n, *_ in dense)
        done.sparse = {n: int(i.numel()) for n, _, _, i in sparse}
        done.seconds = time.perf_counter() - t0
        return done

    def _repack_targets(self, patched_modules) -> list[tuple[str, str]]:
        """(module, the patched module whose weight it uses) for every module that keeps a
        packed copy beside a weight patched in place (the LM head: its own weight, or the
        embedding's it is tied to)."""
        owner = {id(getattr(self._modules[p], "weight", None)): p for p in patched_modules}
        owner.pop(id(None), None)
        return [(path, owner[id(module.weight)]) for path, module in self._modules.items()
                if hasattr(module, "cpu_linear") and getattr(module, "weight", None) is not None
                and module.weight.numel() and id(module.weight) in owner]

    def _repack(self, patched_modules: set[str], prepared: dict) -> list[str]:
        """Rebuild the packed copy of every module of ``_repack_targets``, or put in place the
        one ``prepare`` built from the same values."""
        repacked = []
        for path, _ in self._repack_targets(patched_modules):
            module = self._modules[path]
            if path in prepared:
                module.cpu_linear = prepared[path]
            else:
                module.quant_method.process_weights_after_loading(module)
            repacked.append(path)
        return repacked


def _load_patches(model, batch, max_chunk_bytes: int | None) -> None:
    """One call of vLLM's checkpoint patch loader (dense and sparse never mixed in one), which
    hands the model's loader at most ``max_chunk_bytes`` of checkpoint tensors at a time
    (None: vLLM's default)."""
    from vllm.model_executor.model_loader.checkpoint_weight_patch import (
        CheckpointWeightPatch, load_checkpoint_weight_patches)

    load_checkpoint_weight_patches(model, [CheckpointWeightPatch(name, tuple(t.shape), t.dtype, values, idx)
                                           for name, t, values, idx in batch],
                                   **({} if max_chunk_bytes is None else {"max_chunk_bytes": max_chunk_bytes}))


def _reload(vllm_config, model, weights) -> None:
    """A layerwise reload of whole modules' checkpoint tensors (a seam the tests break)."""
    from vllm.model_executor.model_loader.reload.inplace import reload_weights

    reload_weights(vllm_config, model, weights_iterator=iter(weights), weights_path=None, is_checkpoint_format=True)
