from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Input(_message.Message):
    __slots__ = ("data", "features")
    DATA_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    features: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, data: _Optional[bytes] = ..., features: _Optional[_Iterable[float]] = ...) -> None: ...

class InferRequest(_message.Message):
    __slots__ = ("model", "inputs")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    model: str
    inputs: _containers.RepeatedCompositeFieldContainer[Input]
    def __init__(self, model: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[Input, _Mapping]]] = ...) -> None: ...

class Output(_message.Message):
    __slots__ = ("values", "label", "score")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    label: int
    score: float
    def __init__(self, values: _Optional[_Iterable[float]] = ..., label: _Optional[int] = ..., score: _Optional[float] = ...) -> None: ...

class InferResponse(_message.Message):
    __slots__ = ("model", "outputs", "batch_id", "batch_size")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    model: str
    outputs: _containers.RepeatedCompositeFieldContainer[Output]
    batch_id: int
    batch_size: int
    def __init__(self, model: _Optional[str] = ..., outputs: _Optional[_Iterable[_Union[Output, _Mapping]]] = ..., batch_id: _Optional[int] = ..., batch_size: _Optional[int] = ...) -> None: ...

class ServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ColdStartPhase(_message.Message):
    __slots__ = ("name", "at_s", "duration_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    AT_S_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    at_s: float
    duration_s: float
    def __init__(self, name: _Optional[str] = ..., at_s: _Optional[float] = ..., duration_s: _Optional[float] = ...) -> None: ...

class BatchingConfig(_message.Message):
    __slots__ = ("max_batch_size", "max_queue_delay_ms", "max_queue_size", "instances", "pre_threads", "workers", "slots_per_worker", "pre_processes")
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    PRE_THREADS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_PER_WORKER_FIELD_NUMBER: _ClassVar[int]
    PRE_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    max_batch_size: int
    max_queue_delay_ms: float
    max_queue_size: int
    instances: int
    pre_threads: int
    workers: int
    slots_per_worker: int
    pre_processes: int
    def __init__(self, max_batch_size: _Optional[int] = ..., max_queue_delay_ms: _Optional[float] = ..., max_queue_size: _Optional[int] = ..., instances: _Optional[int] = ..., pre_threads: _Optional[int] = ..., workers: _Optional[int] = ..., slots_per_worker: _Optional[int] = ..., pre_processes: _Optional[int] = ...) -> None: ...

class ServerInfoResponse(_message.Message):
    __slots__ = ("model", "device", "dtype", "versions", "batching", "cold_start", "pid", "start_unix_s", "ready", "intra_op_threads", "host", "handler_options", "metrics_port", "handler")
    class VersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class HandlerOptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    BATCHING_FIELD_NUMBER: _ClassVar[int]
    COLD_START_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    INTRA_OP_THREADS_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    HANDLER_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    METRICS_PORT_FIELD_NUMBER: _ClassVar[int]
    HANDLER_FIELD_NUMBER: _ClassVar[int]
    model: str
    device: str
    dtype: str
    versions: _containers.ScalarMap[str, str]
    batching: BatchingConfig
    cold_start: _containers.RepeatedCompositeFieldContainer[ColdStartPhase]
    pid: int
    start_unix_s: float
    ready: bool
    intra_op_threads: int
    host: str
    handler_options: _containers.ScalarMap[str, str]
    metrics_port: int
    handler: str
    def __init__(self, model: _Optional[str] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., versions: _Optional[_Mapping[str, str]] = ..., batching: _Optional[_Union[BatchingConfig, _Mapping]] = ..., cold_start: _Optional[_Iterable[_Union[ColdStartPhase, _Mapping]]] = ..., pid: _Optional[int] = ..., start_unix_s: _Optional[float] = ..., ready: bool = ..., intra_op_threads: _Optional[int] = ..., host: _Optional[str] = ..., handler_options: _Optional[_Mapping[str, str]] = ..., metrics_port: _Optional[int] = ..., handler: _Optional[str] = ...) -> None: ...

class ProfileRequest(_message.Message):
    __slots__ = ("batches", "ranges_only")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    RANGES_ONLY_FIELD_NUMBER: _ClassVar[int]
    batches: int
    ranges_only: bool
    def __init__(self, batches: _Optional[int] = ..., ranges_only: bool = ...) -> None: ...

class ProfileResponse(_message.Message):
    __slots__ = ("trace_path", "batches", "batch_ids")
    TRACE_PATH_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    BATCH_IDS_FIELD_NUMBER: _ClassVar[int]
    trace_path: str
    batches: int
    batch_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, trace_path: _Optional[str] = ..., batches: _Optional[int] = ..., batch_ids: _Optional[_Iterable[int]] = ...) -> None: ...
