"""A model built on the meta device from its checkpoint's headers, then filled row by row: each
process reads only the rows of each tensor it holds.

    skeleton = Skeleton.from_checkpoint(model_dir, dtype)   # reads the config and the headers
    lm = apply_lora(skeleton.model, ...)                     # LoRA's factors are built for real
    skeleton.keep_initialized(policy)                        # ...so their values are kept
    shard(policy, mesh, ...)                                 # FSDP2 on meta: rows per rank
    skeleton.fill(policy, device)                            # to_empty, then read own rows only

torchtitan's order (meta init, parallelise, materialise, load each rank's slices), with
safetensors' `get_slice` as the reader instead of DCP: a rank reads the rows FSDP2 gave it
(dim 0 of every tensor, `torch.chunk`'s split) straight into its local shard, one tensor at a
time, so it never holds more than its shards plus one tensor's rows (for packed experts, one
projection of its own experts). The routed experts of an NVFP4 checkpoint are stored one
Linear per expert, so a rank's experts are whole on-disk tensors and the others are never
touched.

The packed layers (`NVFP4Linear`, `NF4Linear`, packed experts) are chosen as
`load_quantized_model` always chose them: a Linear whose on-disk name has `weight_packed`
(NF4: `weight.quant_state.bitsandbytes__nf4`), an experts module whose every projection has. Their
shapes come from the model's own modules and each header is checked against them; every other
tensor goes through transformers' conversion mapping (rlvr.models.hub_layout); each tensor's rows
are read by a source (rlvr.models.checkpoint_files for float tensors, rlvr.quant.row_sources for
packed ones). A tensor in the files that no module takes, or a parameter no file fills, is an
error naming it, before anything is read. `load_quantized_model` is this with one process
holding every row, so the trainer's sharded load and every whole load compute with the same values.

`Skeleton.from_config` builds the same packed tree with no checkpoint at all (every Linear but
the head and routers packed, as `quantize_checkpoint` writes one): the rehearsal measures a
model's shards at full size from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from accelerate import init_empty_weights
from torch import nn

from rlvr.models.checkpoint_files import CheckpointFiles, Source, check_shape, memory_source, rows_of
from rlvr.models.folder import ModelFolder, as_model_folder
from rlvr.models.hub_layout import ExpertPiece, disk_name, expert_pieces
from rlvr.models.moe import expert_projections, moe_layers
from rlvr.models.multimodal import text_model_config
from rlvr.models.transformers_classes import causal_lm_from_config
from rlvr.quant import nf4, nvfp4
from rlvr.quant.experts import NVFP4Experts, pack_experts, use_rlvr_experts
from rlvr.quant.formats import is_quantized_checkpoint, quantized_format
from rlvr.quant.linear import NF4Linear, NVFP4Linear, QuantizedLinear
from rlvr.quant.row_sources import bytes_of, expert_rows, expert_scales

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class Skeleton:
    """A model on the meta device and, for each of its tensors, where to read any of its rows."""

    def __init__(self, model: PreTrainedModel, base_format: str):
        self.model, self.base_format = model, base_format
        # (id(module), attribute) -> its source; modules keep their identity through peft's
        # wrapping and FSDP2's sharding, so the key still finds the tensor after both
        self._sources: dict[tuple[int, str], Source] = {}
        self._ties: dict[tuple[int, str], tuple[nn.Module, str]] = {}  # a second name of a filled parameter
        self._names = {id(m): name for name, m in model.named_modules()}

    # ------------------------------------------------------------------ building

    @classmethod
    def from_checkpoint(cls, model_dir: ModelFolder | str | Path, dtype: torch.dtype) -> Skeleton:
        folder = as_model_folder(model_dir)
        base_format = quantized_format(folder) if is_quantized_checkpoint(folder) else "hf"
        files = CheckpointFiles(folder)
        skeleton = cls._empty(folder.transformers_config(), dtype, base_format)
        skeleton._take_packed_linears(files, dtype)
        skeleton._take_packed_experts(files, dtype)
        skeleton._take_float_tensors(files, dtype)
        if files.unclaimed:
            key = sorted(files.unclaimed)[0]
            raise ValueError(f"{files.where(key)} belongs to no module of {type(skeleton.model).__name__}")
        skeleton.model.tie_weights()  # the config's tied names (tie_word_embeddings) share one parameter
        skeleton._find_ties(folder.path)
        return skeleton

    @classmethod
    def from_config(cls, config, dtype: torch.dtype, base_format: str) -> Skeleton:
        """The model as `quantize_checkpoint(format=base_format)` would write it, with nothing
        to read: for measuring shards, not for computing."""
        skeleton = cls._empty(config, dtype, base_format)
        if base_format == "hf":
            return skeleton
        head = skeleton.model.get_output_embeddings()
        routers = {id(layer.router) for layer in moe_layers(skeleton.model)}
        for name, module in list(skeleton.model.named_modules()):
            if isinstance(module, nn.Linear) and module is not head and id(module) not in routers:
                skeleton.model.set_submodule(name, _packed_linear(base_format, module, dtype, module.bias is not None))
        if base_format == "nvfp4":
            for layer in moe_layers(skeleton.model):
                # gate_up_proj is stored as two Linears per expert (gate, up), down_proj as one
                pack_experts(
                    layer.experts,
                    {
                        p: _packed_experts(layer.experts, p, parts=2 if p == "gate_up_proj" else 1)
                        for p in expert_projections(layer.experts)
                    },
                    dtype,
                )
            use_rlvr_experts(skeleton.model)
        return skeleton

    @classmethod
    def _empty(cls, config, dtype: torch.dtype, base_format: str) -> Skeleton:
        if getattr(config, "quantization_config", None) is not None:
            del config.quantization_config  # the model is built plain; the packed layers are put in
        with init_empty_weights(include_buffers=False):  # of a multimodal checkpoint, the language model alone
            model = causal_lm_from_config(text_model_config(config), dtype=dtype)
        return cls(model, base_format)

    def _take_packed_linears(self, files: CheckpointFiles, dtype: torch.dtype) -> None:
        model = self.model
        for name, module in list(model.named_modules()):
            if not isinstance(module, nn.Linear):
                continue
            disk = disk_name(model, f"{name}.weight", module.weight.shape).removesuffix(".weight")
            if self.base_format == "nf4" and f"{disk}.weight.{nf4.QUANT_STATE_KEY}" in files:
                layer = self._nf4_linear(files, disk, module, dtype)
            elif f"{disk}.weight_packed" in files:
                layer = self._nvfp4_linear(files, disk, module, dtype)
            else:
                continue  # a float Linear (ignored, or tied to the embedding)
            model.set_submodule(name, layer)
        self._names = {id(m): name for name, m in model.named_modules()}

    def _nvfp4_linear(self, files: CheckpointFiles, disk: str, module: nn.Linear, dtype: torch.dtype) -> NVFP4Linear:
        where = files.where(f"{disk}.weight_packed", disk)
        missing = [s for s in ("weight_scale", "weight_global_scale") if f"{disk}.{s}" not in files]
        if missing:
            raise ValueError(f"{where}: has weight_packed but no {' or '.join(missing)}")
        weight = nvfp4.NVFP4Weight(
            *(files.meta(f"{disk}.{s}") for s in ("weight_packed", "weight_scale", "weight_global_scale"))
        )
        nvfp4.check_shapes(weight, where)
        check_shape(where, weight.weight_packed, (module.out_features, module.in_features // 2))
        bias = files.meta(f"{disk}.bias") if f"{disk}.bias" in files else None
        input_scale = files.meta(f"{disk}.input_global_scale") if f"{disk}.input_global_scale" in files else None
        layer = NVFP4Linear(weight, bias, input_scale, compute_dtype=dtype)
        self._add(layer, "weight_packed", bytes_of(files, f"{disk}.weight_packed", module.in_features // 2))
        self._add(layer, "weight_scale", rows_of(files, f"{disk}.weight_scale"))
        self._add(layer, "weight_global_scale", rows_of(files, f"{disk}.weight_global_scale", torch.float32))
        if input_scale is not None:
            self._add(layer, "input_global_scale", rows_of(files, f"{disk}.input_global_scale"))
        if bias is not None:
            self._add(layer, "bias", rows_of(files, f"{disk}.bias", dtype))
        return layer

    def _nf4_linear(self, files: CheckpointFiles, disk: str, module: nn.Linear, dtype: torch.dtype) -> NF4Linear:
        where = files.where(f"{disk}.weight.{nf4.QUANT_STATE_KEY}", disk)
        small = ("weight.quant_map", f"weight.{nf4.QUANT_STATE_KEY}")  # read now: the codebook and the shape
        stored = {
            s: (files.read if s in small else files.meta)(f"{disk}.{s}")
            for s in nf4.CHECKPOINT_SUFFIXES
            if f"{disk}.{s}" in files
        }
        nested = [key for key in files.keys() if key.startswith(f"{disk}.weight.nested_")]
        stored.update({key.removeprefix(f"{disk}."): files.meta(key) for key in nested})
        weight = nf4.from_checkpoint(stored, where)
        check_shape(where, weight.weight_packed, (module.out_features, module.in_features // 2))
        bias = files.meta(f"{disk}.bias") if f"{disk}.bias" in files else None
        layer = NF4Linear(weight, bias, compute_dtype=dtype)
        self._add(layer, "weight_packed", bytes_of(files, f"{disk}.weight", module.in_features // 2))
        blocks = module.in_features // nf4.BLOCK_SIZE
        self._add(
            layer,
            "weight_absmax",
            lambda rows: rows_of(files, f"{disk}.weight.absmax", torch.float32)(
                None if rows is None else slice(rows.start * blocks, rows.stop * blocks)
            ).reshape(-1, blocks),
        )
        if bias is not None:
            self._add(layer, "bias", rows_of(files, f"{disk}.bias", dtype))
        return layer

    def _take_packed_experts(self, files: CheckpointFiles, dtype: torch.dtype) -> None:
        packed_any = False
        for layer in moe_layers(self.model):
            experts = layer.experts
            pieces = {
                p: expert_pieces(self.model, f"{layer.experts_name}.{p}", getattr(experts, p).shape)
                for p in expert_projections(experts)
            }
            stored = {p: [f"{piece.prefix}.weight_packed" in files for piece in ps] for p, ps in pieces.items()}
            for ps, flags in zip(pieces.values(), stored.values()):
                if any(flags) and not all(flags):
                    missing = ps[flags.index(False)].prefix
                    raise ValueError(
                        f"{files.where(ps[flags.index(True)].prefix + '.weight_packed')}: {missing} has no "
                        f"weight_packed while other experts of {layer.experts_name} do"
                    )
            packed = [p for p, flags in stored.items() if all(flags)]
            if packed and len(packed) < len(pieces):
                raise ValueError(
                    f"{files.where(pieces[packed[0]][0].prefix + '.weight_packed')}: {layer.experts_name} "
                    "has some projections packed and some in float"
                )
            if not packed:
                continue
            projections = {
                p: _packed_experts(experts, p, parts=max(piece.part for piece in pieces[p]) + 1) for p in packed
            }
            for p in packed:
                self._check_expert_headers(files, pieces[p], projections[p])
            pack_experts(experts, projections, dtype)
            for p in packed:
                for suffix in ("weight_packed", "weight_scale"):
                    self._add(experts, f"{p}_{suffix}", expert_rows(files, pieces[p], projections[p], suffix))
                for suffix in ("weight_global_scale", "input_global_scale"):
                    self._add(experts, f"{p}_{suffix}", expert_scales(files, pieces[p], projections[p], suffix))
            packed_any = True
        if packed_any:
            use_rlvr_experts(self.model)

    @staticmethod
    def _check_expert_headers(files: CheckpointFiles, pieces: list[ExpertPiece], like: NVFP4Experts) -> None:
        columns = like.weight_packed.shape[2]
        for p in pieces:
            where = files.where(f"{p.prefix}.weight_packed", p.prefix)
            missing = [s for s in ("weight_scale", "weight_global_scale") if f"{p.prefix}.{s}" not in files]
            if missing:
                raise ValueError(f"{where}: has weight_packed but no {' or '.join(missing)}")
            weight = nvfp4.NVFP4Weight(
                *(files.meta(f"{p.prefix}.{s}") for s in ("weight_packed", "weight_scale", "weight_global_scale"))
            )
            nvfp4.check_shapes(weight, where)
            check_shape(where, weight.weight_packed, (p.stop - p.start, columns))
            if f"{p.prefix}.input_global_scale" in files:
                files.meta(f"{p.prefix}.input_global_scale")

    def _take_float_tensors(self, files: CheckpointFiles, dtype: torch.dtype) -> None:
        """Every other parameter and persistent buffer, through transformers' conversion mapping."""
        model = self.model
        for module_name, module in list(model.named_modules()):
            if isinstance(module, QuantizedLinear):
                continue
            for attr, tensor in [*module._parameters.items(), *module._buffers.items()]:
                if tensor is None or (id(module), attr) in self._sources or attr in module._non_persistent_buffers_set:
                    continue
                key = f"{module_name}.{attr}" if module_name else attr
                want = (
                    (torch.float32 if keeps_float32(model, key) else dtype)
                    if tensor.is_floating_point()
                    else tensor.dtype
                )
                source = memory_source(model, files, key, tensor.shape, want)
                if source is None:
                    continue  # tied to another name, or a buffer built at init: checked in _find_ties
                if tensor.dtype != want:
                    _set_meta(module, attr, tensor, want)
                self._add(module, attr, source)

    def _find_ties(self, model_dir: Path) -> None:
        """Each parameter without a source of its own must be another name of one that has."""
        owners = {}
        for module in self.model.modules():
            for attr, tensor in module._parameters.items():
                if (id(module), attr) in self._sources:
                    owners.setdefault(id(tensor), (module, attr))
        missing = []
        for module in self.model.modules():
            for attr, tensor in module._parameters.items():
                if tensor is None or (id(module), attr) in self._sources:
                    continue
                if id(tensor) in owners:
                    self._ties[(id(module), attr)] = owners[id(tensor)]
                elif tensor.is_meta:
                    missing.append(f"{self._names[id(module)]}.{attr}".lstrip("."))
        if missing:
            raise ValueError(f"{model_dir}: no tensor for {missing[0]} ({len(missing)} missing)")

    def _add(self, module: nn.Module, attr: str, source: Source) -> None:
        self._sources[(id(module), attr)] = source

    # ------------------------------------------------------------------ filling

    def keep_initialized(self, root: nn.Module) -> None:
        """Keep the values of every tensor under `root` that was built for real, not read: LoRA's
        initial factors, buffers computed at init (rotary frequencies). `fill`'s `to_empty`
        replaces every tensor, so call this before sharding, on the module that will be filled."""
        for module in root.modules():
            for attr, tensor in [*module._parameters.items(), *module._buffers.items()]:
                key = (id(module), attr)
                if tensor is None or tensor.is_meta or key in self._sources or key in self._ties:
                    continue
                value = tensor.detach().clone()
                self._sources[key] = lambda rows, value=value: value if rows is None else value[rows]

    def fill(self, root: nn.Module, device: torch.device | str) -> None:
        """Allocate every tensor under `root` on `device` (under FSDP2: each rank's shards only)
        and read each one's rows from its source, one tensor at a time."""
        root.to_empty(device=device)
        with torch.no_grad():
            for module in root.modules():
                for attr in [*module._parameters, *module._buffers]:
                    tensor = getattr(module, attr)
                    key = (id(module), attr)
                    if tensor is None:
                        continue
                    if key in self._ties:  # to_empty gives each name its own tensor: tie them again
                        owner, owner_attr = self._ties[key]
                        module._parameters[attr] = owner._parameters[owner_attr]
                        continue
                    if key not in self._sources:
                        raise RuntimeError(
                            f"{type(module).__name__}.{attr}: built after the skeleton and not kept "
                            "(keep_initialized before sharding)"
                        )
                    _copy_rows(tensor, self._sources[key])


def keeps_float32(model: nn.Module, key: str) -> bool:
    """Whether transformers keeps `key` in float32 whatever the model dtype (`_keep_in_fp32_modules`)."""
    kept = set(getattr(model, "_keep_in_fp32_modules_strict", None) or []) | set(
        getattr(model, "_keep_in_fp32_modules", None) or []
    )
    return any(name in key.split(".") for name in kept)


def _copy_rows(tensor: torch.Tensor, source: Source) -> None:
    """Copy into `tensor` (this rank's shard of a DTensor, or a whole tensor) its rows from `source`."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    local, rows = tensor, None
    if isinstance(tensor, DTensor):
        local = tensor.to_local()
        _, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
        if tuple(local.shape[1:]) != tuple(tensor.shape[1:]) or any(offset[1:]):
            raise RuntimeError(
                f"a shard of {tuple(tensor.shape)} not along dim 0: {tuple(local.shape)} at {tuple(offset)}"
            )
        if not local.numel():
            return  # FSDP2 gave this rank none of its rows
        rows = slice(offset[0], offset[0] + local.shape[0])
    data = source(rows)
    if data.dtype != local.dtype or data.numel() != local.numel():
        raise RuntimeError(
            f"rows {rows} read as {data.dtype} {tuple(data.shape)} for a {local.dtype} {tuple(local.shape)} shard"
        )
    local.copy_(data.reshape(local.shape))


def _packed_linear(base_format: str, module: nn.Linear, dtype: torch.dtype, bias: bool) -> QuantizedLinear:
    """A packed Linear of `module`'s shape on the meta device."""
    out, inp = module.out_features, module.in_features
    meta = lambda *shape, dtype: torch.empty(shape, dtype=dtype, device="meta")  # noqa: E731
    bias_tensor = meta(out, dtype=dtype) if bias else None
    if base_format == "nf4":
        return NF4Linear(
            nf4.NF4Weight(
                meta(out, inp // 2, dtype=torch.uint8), meta(out, inp // nf4.BLOCK_SIZE, dtype=torch.float32)
            ),
            bias_tensor,
            compute_dtype=dtype,
        )
    weight = nvfp4.NVFP4Weight(
        meta(out, inp // 2, dtype=torch.uint8),
        meta(out, inp // nvfp4.GROUP_SIZE, dtype=torch.float8_e4m3fn),
        meta(1, dtype=torch.float32),
    )
    return NVFP4Linear(weight, bias_tensor, meta(1, dtype=torch.float32), compute_dtype=dtype)


def _packed_experts(experts: nn.Module, projection: str, parts: int) -> NVFP4Experts:
    """Packed meta tensors for one fused projection `[E, rows, in]` (rows always `[out, in]`)."""
    count, rows, columns = getattr(experts, projection).shape  # hub_layout refuses transposed experts
    meta = lambda *shape, dtype: torch.empty(shape, dtype=dtype, device="meta")  # noqa: E731
    return NVFP4Experts(
        meta(count, rows, columns // 2, dtype=torch.uint8),
        meta(count, rows, columns // nvfp4.GROUP_SIZE, dtype=torch.float8_e4m3fn),
        meta(count, parts, dtype=torch.float32),
        meta(count, parts, dtype=torch.float32),
    )


def _set_meta(module: nn.Module, attr: str, like: torch.Tensor, dtype: torch.dtype) -> None:
    empty = torch.empty(like.shape, dtype=dtype, device="meta")
    if attr in module._parameters:
        module._parameters[attr] = nn.Parameter(empty, requires_grad=like.requires_grad)
    else:
        module._buffers[attr] = empty
