"""The Tinker API's protobuf bodies, read and written with the SDK's own messages (tinker.proto).

    batch = read_forward_backward(body)            # the /forward_backward request
    bytes = forward_backward_output(logprobs, metrics)
    bytes = sample_response(rollouts)

Since SDK 0.25 these three are protobuf, everything else JSON. Tokens travel as int32 bytes,
per-token tensors as dense float32 / int64 bytes; a sparse or non-text input is refused here,
before any model sees it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

from rlvr.records import Rollout
from rlvr.serve.refusals import BadRequest


@dataclass
class ForwardBackwardBatch:
    model_id: str
    seq_id: int
    loss: str
    config: dict[str, float]
    forward_only: bool
    inputs: list[list[int]]  # datum i's model_input tokens
    loss_inputs: list[dict[str, np.ndarray]]  # datum i's loss_fn_inputs (target_tokens among them), flat


_NUMPY = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


def read_forward_backward(body: bytes) -> ForwardBackwardBatch:
    message = pb.ForwardBackwardRequest()
    try:
        message.ParseFromString(body)
    except Exception as error:  # protobuf's DecodeError
        raise BadRequest(f"forward_backward: not a ForwardBackwardRequest protobuf body ({error})") from None
    config = {key: value.number for key, value in message.loss_fn_config_v2.items() if value.HasField("number")}
    config = config or dict(message.loss_fn_config)
    inputs, loss_inputs = [], []
    for index, datum in enumerate(message.data):
        tokens: list[int] = []
        for chunk in datum.model_input:
            if chunk.WhichOneof("chunk") != "encoded_text":
                raise BadRequest(f"datum {index}: only text inputs are supported, not {chunk.WhichOneof('chunk')}")
            tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
        inputs.append(tokens)
        loss_inputs.append(
            {
                name: _dense(tensor, f"datum {index}: loss_fn_inputs[{name!r}]")
                for name, tensor in datum.loss_fn_inputs.items()
            }
        )
    return ForwardBackwardBatch(
        message.model_id, message.seq_id, message.loss_fn, config, message.forward_only, inputs, loss_inputs
    )


def _dense(tensor, where: str) -> np.ndarray:
    if tensor.WhichOneof("encoding") != "dense":
        raise BadRequest(f"{where}: only dense tensors are supported")
    if tensor.dtype not in _NUMPY:
        raise BadRequest(f"{where}: unsupported dtype {pb.DType.Name(tensor.dtype)}")
    return np.frombuffer(tensor.dense, dtype=_NUMPY[tensor.dtype])


def forward_backward_output(logprobs: list[np.ndarray], metrics: dict[str, float]) -> bytes:
    """Per-datum `logprobs` (one per target token) and the call's metrics, keyed `name:reduction`."""
    message = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics=metrics)
    record = message.loss_fn_outputs.add(num_datums=len(logprobs))
    field = record.fields["logprobs"]
    field.dtype = pb.DTYPE_FLOAT32
    rows = [np.asarray(row, dtype=np.float32) for row in logprobs]
    field.data = b"".join(row.tobytes() for row in rows)
    field.offsets = np.cumsum([0] + [row.nbytes for row in rows], dtype=np.int64).tobytes()
    return message.SerializeToString()


def sample_response(rollouts: list[Rollout], prompt_logprobs: np.ndarray | None = None) -> bytes:
    """The sampled sequences with their logprobs (and the prompt's, NaN where unscored); the
    sequences' ids go with the request's future, not here."""
    message = pb.SampleResponse()
    if prompt_logprobs is not None:
        message.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    for rollout in rollouts:
        message.sequences.add(
            stop_reason=pb.STOP_REASON_LENGTH if rollout.finish_reason == "length" else pb.STOP_REASON_STOP,
            tokens=np.asarray(rollout.completion_ids, dtype=np.int32).tobytes(),
            logprobs=np.asarray(rollout.logprobs, dtype=np.float32).tobytes(),
        )
    return message.SerializeToString()
