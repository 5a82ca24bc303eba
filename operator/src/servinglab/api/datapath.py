"""The handler's data path as settings: how request bytes become a batch on the device, and how the
model runs it. Part of the server spec (`server.dataPath`); each knob is also an axis a sweep varies.

Realised by servinglab's handler (`handlers/servinglab_datapath.py`, server-neutral) inside whichever
server runs it; what really ran comes back in the results (`runtime.dataPath`). Knobs that need a GPU
(`decode: device`, `pinnedCopies`, `compile: reduce-overhead`) are refused with `gpus: 0` before any server
starts (:meth:`DataPath.gpu_only`), and combinations that mean nothing are refused here
(:meth:`DataPath.conflict`), so a sweep's grid can drop them.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, model_validator

from servinglab.api.meta import SpecModel


class Decode(StrEnum):
    """Where JPEG/PNG bodies become pixels: `cpu` (PIL on the worker, `decodeThreads` at a time) or
    `device` (torchvision's batched `decode_jpeg` on the GPU; PNG and .npy bodies stay on the CPU)."""

    CPU = "cpu"
    DEVICE = "device"


class Transfer(StrEnum):
    """What crosses to the device: `uint8` pixels, converted and normalised there as one batch (a
    quarter of fp32's bytes), or `float`: each image converted and normalised on the CPU first."""

    UINT8 = "uint8"
    FLOAT = "float"


class CompileMode(StrEnum):
    """`torch.compile` of the model (batches padded to the warmed-up sizes, so nothing recompiles while
    measured); `reduce-overhead` replays CUDA graphs and needs a GPU."""

    NONE = "none"
    DEFAULT = "default"
    REDUCE_OVERHEAD = "reduce-overhead"
    MAX_AUTOTUNE = "max-autotune"
    MAX_AUTOTUNE_NO_CUDAGRAPHS = "max-autotune-no-cudagraphs"


_COMPILE_LABELS = {
    CompileMode.DEFAULT: "cd", CompileMode.REDUCE_OVERHEAD: "cro", CompileMode.MAX_AUTOTUNE: "cma",
    CompileMode.MAX_AUTOTUNE_NO_CUDAGRAPHS: "cmn",
}  # fmt: skip


class DataPath(SpecModel):
    """`server.dataPath`: the defaults are the handler as it always ran (PIL on one thread per worker,
    uint8 transfer, pageable copies, eager PyTorch, channels-last on GPUs only)."""

    decode: Decode = Field(default=Decode.CPU, description="cpu: PIL on the worker; device: decode_jpeg on the GPU.")
    decode_threads: int = Field(
        default=1, ge=1, le=64, description="CPU decode: images decoded at once per worker (a thread pool)."
    )
    transfer: Transfer = Field(
        default=Transfer.UINT8, description="uint8: convert and normalise on the device; float: on the CPU."
    )
    pinned_copies: bool = Field(
        default=False,
        description="Pinned host memory and non-blocking copies on a side stream, chunk by chunk, overlapping "
        "the copies with decoding and with the device's conversion (GPU only).",
    )
    compile: CompileMode = Field(default=CompileMode.NONE, description="torch.compile mode (none: eager).")
    channels_last: bool | None = Field(
        default=None, description="Channels-last memory format for image models; unset: on with a GPU, off on CPU."
    )

    @model_validator(mode="after")
    def _meaningful(self) -> DataPath:
        if (problem := self.conflict()) is not None:
            raise ValueError(problem)
        return self

    def conflict(self) -> str | None:
        """Why this combination means nothing (device decode leaves nothing to decode, convert or copy on
        the host), or None."""
        if self.decode is Decode.DEVICE:
            if self.decode_threads > 1:
                return f"decodeThreads: {self.decode_threads} applies to decode: cpu (decode: device decodes the batch)"
            if self.transfer is Transfer.FLOAT:
                return "transfer: float converts on the CPU, but decode: device leaves the pixels on the device"
            if self.pinned_copies:
                return "pinnedCopies: decode: device copies the compressed bytes itself, not decoded pixels"
        return None

    def gpu_only(self) -> list[str]:
        """The settings here that need a GPU, each as 'field: value (why)'."""
        found = []
        if self.decode is Decode.DEVICE:
            found.append("decode: device (torchvision's decode_jpeg runs on CUDA)")
        if self.pinned_copies:
            found.append("pinnedCopies: true (pinned memory and side streams are CUDA's)")
        if self.compile is CompileMode.REDUCE_OVERHEAD:
            found.append("compile: reduce-overhead (CUDA graphs)")
        return found

    def label(self) -> str:
        """Short and DNS-safe, '' for the defaults: 't4-ft-cd' (4 decode threads, float transfer, compiled)."""
        parts = []
        if self.decode is Decode.DEVICE:
            parts.append("dev")
        if self.decode_threads > 1:
            parts.append(f"t{self.decode_threads}")
        if self.transfer is Transfer.FLOAT:
            parts.append("ft")
        if self.pinned_copies:
            parts.append("pin")
        if self.compile is not CompileMode.NONE:
            parts.append(_COMPILE_LABELS[self.compile])
        if self.channels_last is not None:
            parts.append("cl" if self.channels_last else "nocl")
        return "-".join(parts)

    def describe(self) -> str:
        """For people: 'decode cpu x4, transfer float, compile default' ('as always' for the defaults)."""
        parts = [f"decode {self.decode}" + (f" x{self.decode_threads}" if self.decode_threads > 1 else "")]
        if self.transfer is not Transfer.UINT8:
            parts.append(f"transfer {self.transfer}")
        if self.pinned_copies:
            parts.append("pinned copies")
        if self.compile is not CompileMode.NONE:
            parts.append(f"compile {self.compile}")
        if self.channels_last is not None:
            parts.append("channels-last" if self.channels_last else "contiguous")
        return ", ".join(parts)

    def model_options(self, batch_size: int) -> dict[str, object]:
        """The settings that change the model itself (compiled, channels-last), as the raw probe applies
        them; a compiled model also needs the largest batch, which sets the sizes batches are padded to."""
        options: dict[str, object] = {}
        if self.compile is not CompileMode.NONE:
            options.update(compile=str(self.compile), batchSize=batch_size)
        if self.channels_last is not None:
            options["channelsLast"] = self.channels_last
        return options

    def handler_settings(self) -> dict[str, object]:
        """What the handler reads (the `dataPath` of its settings), camelCase like the spec."""
        return self.model_dump(by_alias=True, mode="json", exclude_none=True)
