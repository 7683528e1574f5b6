from helios.contract import serving_pb2 as _serving_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Dtype(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[Dtype]
    DTYPE_FLOAT32: _ClassVar[Dtype]
    DTYPE_FLOAT16: _ClassVar[Dtype]
    DTYPE_BFLOAT16: _ClassVar[Dtype]
    DTYPE_FLOAT8_E4M3: _ClassVar[Dtype]
    DTYPE_FLOAT8_E5M2: _ClassVar[Dtype]
    DTYPE_INT64: _ClassVar[Dtype]
    DTYPE_INT32: _ClassVar[Dtype]
    DTYPE_INT16: _ClassVar[Dtype]
    DTYPE_INT8: _ClassVar[Dtype]
    DTYPE_UINT8: _ClassVar[Dtype]
    DTYPE_UINT16: _ClassVar[Dtype]
    DTYPE_UINT32: _ClassVar[Dtype]
    DTYPE_BOOL: _ClassVar[Dtype]

class Placement(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLACEMENT_UNSPECIFIED: _ClassVar[Placement]
    PLACEMENT_DEVICE: _ClassVar[Placement]
    PLACEMENT_MAPPED_HOST: _ClassVar[Placement]
    PLACEMENT_HOST: _ClassVar[Placement]

class BufferRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BUFFER_ROLE_UNSPECIFIED: _ClassVar[BufferRole]
    BUFFER_ROLE_INPUT: _ClassVar[BufferRole]
    BUFFER_ROLE_PERSISTENT_STATE: _ClassVar[BufferRole]
    BUFFER_ROLE_CACHE_STORAGE: _ClassVar[BufferRole]
    BUFFER_ROLE_SCRATCH: _ClassVar[BufferRole]
    BUFFER_ROLE_WEIGHT: _ClassVar[BufferRole]
    BUFFER_ROLE_OUTPUT: _ClassVar[BufferRole]

class LoadExtent(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOAD_EXTENT_UNSPECIFIED: _ClassVar[LoadExtent]
    LOAD_EXTENT_PHYSICAL_PAGES: _ClassVar[LoadExtent]
    LOAD_EXTENT_STATE_ROWS: _ClassVar[LoadExtent]
    LOAD_EXTENT_WINDOW_PAGES: _ClassVar[LoadExtent]

class CompletionFieldKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPLETION_FIELD_KIND_UNSPECIFIED: _ClassVar[CompletionFieldKind]
    COMPLETION_FIELD_KIND_SLOT: _ClassVar[CompletionFieldKind]
    COMPLETION_FIELD_KIND_GENERATION: _ClassVar[CompletionFieldKind]
    COMPLETION_FIELD_KIND_OFFERED_TOKENS: _ClassVar[CompletionFieldKind]
    COMPLETION_FIELD_KIND_ACCEPTED_DRAFTS: _ClassVar[CompletionFieldKind]
    COMPLETION_FIELD_KIND_EMITTED_TOKENS: _ClassVar[CompletionFieldKind]
    COMPLETION_FIELD_KIND_SAMPLED_TOKENS: _ClassVar[CompletionFieldKind]
    COMPLETION_FIELD_KIND_DRAFT_CURSOR: _ClassVar[CompletionFieldKind]
    COMPLETION_FIELD_KIND_RESERVED_MODEL: _ClassVar[CompletionFieldKind]
DTYPE_UNSPECIFIED: Dtype
DTYPE_FLOAT32: Dtype
DTYPE_FLOAT16: Dtype
DTYPE_BFLOAT16: Dtype
DTYPE_FLOAT8_E4M3: Dtype
DTYPE_FLOAT8_E5M2: Dtype
DTYPE_INT64: Dtype
DTYPE_INT32: Dtype
DTYPE_INT16: Dtype
DTYPE_INT8: Dtype
DTYPE_UINT8: Dtype
DTYPE_UINT16: Dtype
DTYPE_UINT32: Dtype
DTYPE_BOOL: Dtype
PLACEMENT_UNSPECIFIED: Placement
PLACEMENT_DEVICE: Placement
PLACEMENT_MAPPED_HOST: Placement
PLACEMENT_HOST: Placement
BUFFER_ROLE_UNSPECIFIED: BufferRole
BUFFER_ROLE_INPUT: BufferRole
BUFFER_ROLE_PERSISTENT_STATE: BufferRole
BUFFER_ROLE_CACHE_STORAGE: BufferRole
BUFFER_ROLE_SCRATCH: BufferRole
BUFFER_ROLE_WEIGHT: BufferRole
BUFFER_ROLE_OUTPUT: BufferRole
LOAD_EXTENT_UNSPECIFIED: LoadExtent
LOAD_EXTENT_PHYSICAL_PAGES: LoadExtent
LOAD_EXTENT_STATE_ROWS: LoadExtent
LOAD_EXTENT_WINDOW_PAGES: LoadExtent
COMPLETION_FIELD_KIND_UNSPECIFIED: CompletionFieldKind
COMPLETION_FIELD_KIND_SLOT: CompletionFieldKind
COMPLETION_FIELD_KIND_GENERATION: CompletionFieldKind
COMPLETION_FIELD_KIND_OFFERED_TOKENS: CompletionFieldKind
COMPLETION_FIELD_KIND_ACCEPTED_DRAFTS: CompletionFieldKind
COMPLETION_FIELD_KIND_EMITTED_TOKENS: CompletionFieldKind
COMPLETION_FIELD_KIND_SAMPLED_TOKENS: CompletionFieldKind
COMPLETION_FIELD_KIND_DRAFT_CURSOR: CompletionFieldKind
COMPLETION_FIELD_KIND_RESERVED_MODEL: CompletionFieldKind

class Dim(_message.Message):
    __slots__ = ("size", "load_extent")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    LOAD_EXTENT_FIELD_NUMBER: _ClassVar[int]
    size: int
    load_extent: LoadExtent
    def __init__(self, size: _Optional[int] = ..., load_extent: _Optional[_Union[LoadExtent, str]] = ...) -> None: ...

class Buffer(_message.Message):
    __slots__ = ("name", "dtype", "shape", "placement", "role", "resource_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: Dtype
    shape: _containers.RepeatedCompositeFieldContainer[Dim]
    placement: Placement
    role: BufferRole
    resource_id: str
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[Dtype, str]] = ..., shape: _Optional[_Iterable[_Union[Dim, _Mapping]]] = ..., placement: _Optional[_Union[Placement, str]] = ..., role: _Optional[_Union[BufferRole, str]] = ..., resource_id: _Optional[str] = ...) -> None: ...

class GraphHandle(_message.Message):
    __slots__ = ("graph", "capacity", "resource_id", "rank", "abi_operations", "program_inputs", "program_outputs")
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ABI_OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_INPUTS_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    graph: str
    capacity: _serving_pb2.GraphCapacity
    resource_id: str
    rank: int
    abi_operations: _containers.RepeatedScalarFieldContainer[str]
    program_inputs: _containers.RepeatedScalarFieldContainer[str]
    program_outputs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, graph: _Optional[str] = ..., capacity: _Optional[_Union[_serving_pb2.GraphCapacity, _Mapping]] = ..., resource_id: _Optional[str] = ..., rank: _Optional[int] = ..., abi_operations: _Optional[_Iterable[str]] = ..., program_inputs: _Optional[_Iterable[str]] = ..., program_outputs: _Optional[_Iterable[str]] = ...) -> None: ...

class AbiOperation(_message.Message):
    __slots__ = ("name", "schema")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    name: str
    schema: str
    def __init__(self, name: _Optional[str] = ..., schema: _Optional[str] = ...) -> None: ...

class TransportDestination(_message.Message):
    __slots__ = ("name", "buffer")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    name: str
    buffer: str
    def __init__(self, name: _Optional[str] = ..., buffer: _Optional[str] = ...) -> None: ...

class CatalogEntry(_message.Message):
    __slots__ = ("graph", "operation")
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    graph: str
    operation: _serving_pb2.GraphOperation
    def __init__(self, graph: _Optional[str] = ..., operation: _Optional[_Union[_serving_pb2.GraphOperation, str]] = ...) -> None: ...

class TuningProducer(_message.Message):
    __slots__ = ("graph", "outputs")
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    graph: str
    outputs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, graph: _Optional[str] = ..., outputs: _Optional[_Iterable[str]] = ...) -> None: ...

class CompletionField(_message.Message):
    __slots__ = ("kind", "byte_offset", "dtype", "count")
    KIND_FIELD_NUMBER: _ClassVar[int]
    BYTE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    kind: CompletionFieldKind
    byte_offset: int
    dtype: Dtype
    count: int
    def __init__(self, kind: _Optional[_Union[CompletionFieldKind, str]] = ..., byte_offset: _Optional[int] = ..., dtype: _Optional[_Union[Dtype, str]] = ..., count: _Optional[int] = ...) -> None: ...

class CompletionLayout(_message.Message):
    __slots__ = ("buffer", "frames", "record_bytes", "fields", "confidence_buffer", "submission_input")
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    RECORD_BYTES_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_BUFFER_FIELD_NUMBER: _ClassVar[int]
    SUBMISSION_INPUT_FIELD_NUMBER: _ClassVar[int]
    buffer: str
    frames: int
    record_bytes: int
    fields: _containers.RepeatedCompositeFieldContainer[CompletionField]
    confidence_buffer: str
    submission_input: str
    def __init__(self, buffer: _Optional[str] = ..., frames: _Optional[int] = ..., record_bytes: _Optional[int] = ..., fields: _Optional[_Iterable[_Union[CompletionField, _Mapping]]] = ..., confidence_buffer: _Optional[str] = ..., submission_input: _Optional[str] = ...) -> None: ...

class ExecutionManifest(_message.Message):
    __slots__ = ("version", "ranks", "buffers", "graph_handles", "destinations", "completion", "execution_catalog", "tuning_catalog", "abi_operations")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    GRAPH_HANDLES_FIELD_NUMBER: _ClassVar[int]
    DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_CATALOG_FIELD_NUMBER: _ClassVar[int]
    TUNING_CATALOG_FIELD_NUMBER: _ClassVar[int]
    ABI_OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    version: int
    ranks: int
    buffers: _containers.RepeatedCompositeFieldContainer[Buffer]
    graph_handles: _containers.RepeatedCompositeFieldContainer[GraphHandle]
    destinations: _containers.RepeatedCompositeFieldContainer[TransportDestination]
    completion: CompletionLayout
    execution_catalog: _containers.RepeatedCompositeFieldContainer[CatalogEntry]
    tuning_catalog: _containers.RepeatedCompositeFieldContainer[TuningProducer]
    abi_operations: _containers.RepeatedCompositeFieldContainer[AbiOperation]
    def __init__(self, version: _Optional[int] = ..., ranks: _Optional[int] = ..., buffers: _Optional[_Iterable[_Union[Buffer, _Mapping]]] = ..., graph_handles: _Optional[_Iterable[_Union[GraphHandle, _Mapping]]] = ..., destinations: _Optional[_Iterable[_Union[TransportDestination, _Mapping]]] = ..., completion: _Optional[_Union[CompletionLayout, _Mapping]] = ..., execution_catalog: _Optional[_Iterable[_Union[CatalogEntry, _Mapping]]] = ..., tuning_catalog: _Optional[_Iterable[_Union[TuningProducer, _Mapping]]] = ..., abi_operations: _Optional[_Iterable[_Union[AbiOperation, _Mapping]]] = ...) -> None: ...

class PreparedContractBundle(_message.Message):
    __slots__ = ("contract", "manifest")
    CONTRACT_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    contract: bytes
    manifest: bytes
    def __init__(self, contract: _Optional[bytes] = ..., manifest: _Optional[bytes] = ...) -> None: ...
